"""Bad input to the llama.cpp integration: one ValueError (or TypeError) naming the file or the
setting, and nothing changed."""

from __future__ import annotations

import types

import numpy as np
import pytest
from llama_fakes import FakeRuntime, tiny_models

from av_core.llama_cpp import open_engine
from av_core.llama_cpp.engine import SpeculativeEngine
from av_core.llama_cpp.policies import FixedK, LlamaCppPolicy, PolicySpec
from av_core.llama_cpp.runtime import REQUIRED_API, Model, llama_api
from av_core.llama_cpp.sampling import SamplingParams
from av_core.llama_cpp.tiny import tiny_vocabulary, write_tiny_model


@pytest.fixture(scope="module")
def tiny_pair() -> tuple[str, str]:
    return tiny_models()


def test_a_missing_gguf_is_named(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "absent.gguf"
    with pytest.raises(ValueError, match=f"{path}: no such GGUF file"):
        Model(path)


def test_a_file_that_is_not_gguf_is_named(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "model.gguf"
    path.write_text("not a model")
    with pytest.raises(ValueError, match=f"{path}: not a GGUF file"):
        Model(path)
    with pytest.raises(ValueError, match="not a regular file"):
        Model(tmp_path)


def test_a_truncated_gguf_is_named(tmp_path, tiny_pair) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "cut.gguf"
    with open(tiny_pair[0], "rb") as handle:
        path.write_bytes(handle.read(3000))
    with pytest.raises(ValueError, match=f"{path}: llama.cpp could not load this GGUF"):
        Model(path)


def test_vocabularies_of_other_sizes_are_refused(tmp_path, tiny_pair) -> None:  # type: ignore[no-untyped-def]
    other = write_tiny_model(tmp_path / "small.gguf", vocab_size=360)
    with pytest.raises(
        ValueError, match=r"vocabularies differ \(384 against 360 tokens\)"
    ) as error:
        open_engine(tiny_pair[0], other, requests=1, tokens_per_request=16)
    assert str(other) in str(error.value) and tiny_pair[0] in str(error.value)


def test_vocabularies_with_another_token_are_refused(tmp_path, tiny_pair) -> None:  # type: ignore[no-untyped-def]
    tokens = tiny_vocabulary()
    tokens[370] = "\u2581other"
    other = write_tiny_model(tmp_path / "renamed.gguf", tokens=tokens)
    with pytest.raises(ValueError, match="token 370 is"):
        open_engine(tiny_pair[0], other, requests=1, tokens_per_request=16)


def test_a_context_too_small_names_n_ctx(tiny_pair) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=r"n_ctx = 100 is too small for 2 requests"):
        open_engine(*tiny_pair, requests=2, tokens_per_request=64, n_ctx=100)
    engine = open_engine(*tiny_pair, requests=2, tokens_per_request=32, max_positions=4)
    with pytest.raises(ValueError, match="^n_ctx: the target context gives each"):
        engine.generate([[1] * 300, [2]], 64, FixedK(2))
    with pytest.raises(ValueError, match="^n_seq_max: the target context holds 2 sequences"):
        engine.generate([[1], [2], [3]], 4, FixedK(2))
    # Nothing was changed: the engine still runs.
    assert len(engine.generate([[1], [2]], 4, FixedK(2)).tokens[1]) == 4


def test_a_llama_cpp_without_an_api_we_call_is_named() -> None:
    import llama_cpp

    for missing in ("llama_memory_seq_rm", "llama_get_logits"):
        module = types.SimpleNamespace(
            **{name: getattr(llama_cpp, name) for name in REQUIRED_API if name != missing},
            __version__="0.0.1",
            llama_context_params=llama_cpp.llama_context_params,
        )
        with pytest.raises(ValueError, match=f"llama-cpp-python 0.0.1 has no {missing}"):
            llama_api(module)  # type: ignore[arg-type]


def test_a_context_without_kv_unified_is_named() -> None:
    import ctypes

    import llama_cpp

    class OldParams(ctypes.Structure):
        _fields_ = [("n_ctx", ctypes.c_uint32), ("n_batch", ctypes.c_uint32)]

    module = types.SimpleNamespace(
        **{name: getattr(llama_cpp, name) for name in REQUIRED_API},
        __version__="0.2.0",
        llama_context_params=OldParams,
    )
    with pytest.raises(ValueError, match="llama_context_params has no field 'n_ubatch'"):
        llama_api(module)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"temperature": float("nan")}, ValueError, "temperature must be finite, got nan"),
        ({"temperature": "1"}, TypeError, "temperature must be a number, got '1'"),
        ({"top_p": 0.0}, ValueError, r"top_p must lie in \(0, 1\], got 0.0"),
        ({"top_p": 1.5}, ValueError, r"top_p must lie in \(0, 1\], got 1.5"),
        ({"top_k": 2.5}, TypeError, "top_k must be an int, got 2.5"),
        ({"top_k": True}, TypeError, "top_k must be an int, got True"),
    ],
)
def test_sampling_params_are_checked(kwargs, error, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error, match=message):
        SamplingParams(**kwargs)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("K=x", "policy: cannot read 'K=x'"),
        ("K=-1", "policy: 'K=-1' is out of range"),
        ("llama.cpp-p2", "p_min in \\[0, 1\\], got n_max=3, n_min=0, p_min=2.0"),
        ("fast", "policy: unknown policy 'fast'"),
        ("AV+D", "policy 'AV\\+D' needs cost tables"),
    ],
)
def test_policy_names_are_checked(name: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PolicySpec(name).build(None, 4, 1)


def test_generate_checks_its_arguments_before_touching_the_caches() -> None:
    target, drafter = FakeRuntime(5, 1), FakeRuntime(5, 2)
    engine = SpeculativeEngine(target, drafter, max_positions=2)
    target.kv[0] = [1, 2]
    with pytest.raises(ValueError, match="prompts: every request needs at least one prompt token"):
        engine.generate([[]], 3, FixedK(1))
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1, got 0"):
        engine.generate([[1]], 0, FixedK(1))
    with pytest.raises(TypeError, match="max_new_tokens must be an int, got 2.0"):
        engine.generate([[1]], 2.0, FixedK(1))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"prompts\[1\]\[1\] = 5 is not a token id of the 5-token"):
        engine.generate([[1], [0, 5]], 3, FixedK(1))
    with pytest.raises(TypeError, match=r"prompts\[0\]\[0\] must be a token id \(int\), got 1.5"):
        engine.generate([[1.5]], 3, FixedK(1))  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"stop_tokens\[1\] = 9 is not a token id of the 5-token"):
        engine.generate([[1]], 3, FixedK(1), stop_tokens=[2, 9])
    with pytest.raises(TypeError, match=r"stop_tokens\[0\] must be a token id \(int\), got 'x'"):
        engine.generate([[1]], 3, FixedK(1), stop_tokens=["x"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="drafts up to 3 positions, more than max_positions = 2"):
        engine.generate([[1]], 3, LlamaCppPolicy(n_max=3))
    assert target.kv[0] == [1, 2]
    with pytest.raises(ValueError, match=r"vocabularies differ \(5 against 6 tokens\)"):
        SpeculativeEngine(FakeRuntime(5, 1), FakeRuntime(6, 1))


@pytest.mark.parametrize(
    ("keyword", "value", "error", "message"),
    [
        ("requests", 2.5, TypeError, "requests must be an int, got float"),
        ("requests", "2", TypeError, "requests must be an int, got str"),
        ("requests", 0, ValueError, "requests must be >= 1, got 0"),
        ("tokens_per_request", -5, ValueError, "tokens_per_request must be >= 1, got -5"),
        ("max_positions", -1, ValueError, "max_positions must be >= 0, got -1"),
        ("max_positions", True, TypeError, "max_positions must be an int, got bool"),
        ("threads", 0, ValueError, "threads must be >= 1, got 0"),
        ("n_ctx", 512.0, TypeError, "n_ctx must be an int, got float"),
    ],
)
def test_open_engine_checks_its_numbers_by_name_before_loading(
    keyword: str, value: object, error: type[Exception], message: str, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    """Each number open_engine takes is refused by name, as it is given, before any file is
    read: the model paths here do not exist, so a check that came after loading would name
    the file instead."""
    arguments: dict[str, object] = {"requests": 1, "tokens_per_request": 16, keyword: value}
    missing = tmp_path / "absent.gguf"
    with pytest.raises(error, match=f"^{message}$"):
        open_engine(missing, missing, **arguments)  # type: ignore[arg-type]
    # numpy integers are ints.
    with pytest.raises(ValueError, match="no such GGUF file"):
        open_engine(missing, missing, requests=np.int64(2), tokens_per_request=np.int32(8))


def test_generate_takes_numpy_prompts_and_counts() -> None:
    """A 2-D array of token ids is R prompts of equal length and a numpy integer is a count: the
    same run as the lists (before, a 2-D array failed with numpy's 'truth value of an array is
    ambiguous' and a numpy count was refused)."""
    engine = SpeculativeEngine(FakeRuntime(5, 1), FakeRuntime(5, 2), max_positions=2)
    lists = engine.generate([[1, 2], [3, 4]], 4, FixedK(2), seed=3).tokens
    arrays = engine.generate(np.array([[1, 2], [3, 4]]), np.int64(4), FixedK(2), seed=3).tokens
    assert arrays == lists and [len(t) for t in lists] == [4, 4]
    with pytest.raises(ValueError, match="prompts: every request needs at least one prompt token"):
        engine.generate(np.zeros((0, 3), dtype=np.int64), 4, FixedK(2))
