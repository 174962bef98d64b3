"""One error root: ``av_core.Error`` above every exception class av_core defines, each still the
builtin it was (docs/settings.md, "Errors").

- Every exception class found in every importable av_core module is classified in
  :data:`EXPECTED` (a new class must be added there, with its builtin) and derives from
  ``av_core.Error`` and that builtin.
- Representative bad calls across the API (the native estimator, planner and cost tables, saved
  state, features, the torch planner, pooled statistics, the lossless harness, the tools, the
  settings, the SGLang, llama.cpp and vLLM integrations) raise something that is both an
  ``av_core.Error`` and a ``ValueError`` or ``TypeError``, of the class named.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import av_core

#: Every exception class av_core defines, by name, with the builtin it is besides av_core.Error.
EXPECTED: dict[str, type[BaseException] | None] = {
    "Error": None,
    "InvalidValueError": ValueError,
    "InvalidTypeError": TypeError,
    "StateError": ValueError,
    "DepthTableError": ValueError,
    "BufferChangedError": ValueError,
    "OutOfMemoryError": ValueError,
    "SettingError": ValueError,
    "VllmCompatibilityError": RuntimeError,
    "SglangCompatibilityError": RuntimeError,
    "CommandError": None,
    "RunFailed": None,
}


def _modules() -> list[Any]:
    """Every av_core module that imports here (the engine modules whose engine is missing
    are skipped; their classes are imported below without the engine)."""
    found = [av_core]
    for info in pkgutil.walk_packages(av_core.__path__, "av_core."):
        try:
            found.append(importlib.import_module(info.name))
        except ImportError:
            continue
    return found


def _exception_classes() -> dict[str, type[BaseException]]:
    classes: dict[str, type[BaseException]] = {}
    for module in _modules():
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, BaseException)
                and value.__module__.startswith("av_core")
            ):
                classes[value.__name__] = value
    return classes


def test_the_root_is_exported_with_the_argument_errors() -> None:
    for name in ("Error", "InvalidValueError", "InvalidTypeError", "SettingError"):
        assert name in av_core.__all__ and getattr(av_core, name).__name__ == name
    assert av_core.Error.__bases__ == (Exception,)


def test_every_exception_class_derives_from_the_root_and_its_builtin() -> None:
    classes = _exception_classes()
    assert set(classes) == set(EXPECTED), set(classes) ^ set(EXPECTED)
    for name, cls in classes.items():
        assert issubclass(cls, av_core.Error), name
        builtin = EXPECTED[name]
        if builtin is not None:
            assert issubclass(cls, builtin), name
        for other in (ValueError, TypeError, RuntimeError):
            if other is not builtin:
                assert not issubclass(cls, other), (name, other)


def test_the_specific_value_errors_are_invalid_value_errors() -> None:
    for cls in (
        av_core.StateError,
        av_core.DepthTableError,
        av_core.BufferChangedError,
        av_core.OutOfMemoryError,
        av_core.SettingError,
    ):
        assert issubclass(cls, av_core.InvalidValueError), cls


def test_the_errors_pickle_as_themselves() -> None:
    import pickle

    for cls in (av_core.InvalidValueError, av_core.InvalidTypeError, av_core.StateError):
        error = pickle.loads(pickle.dumps(cls("argument: message")))
        assert type(error) is cls and str(error) == "argument: message"


def _tables() -> av_core.CostTables:
    return av_core.CostTables.from_curves(
        [(1, 0.6), (256, 0.6)], [(1, 6.0), (256, 6.0)], max_num_reqs=8, max_batch_tokens=64
    )


def _budget(
    confidences: Any = None, function: Callable[..., Any] | None = None, **options: Any
) -> Any:
    """``choose_draft_budget`` (or ``function``) on two requests of four drafts, with
    ``options`` replacing the keywords."""
    keywords = {"num_non_draft_tokens": 2, "num_sampling_requests": 2, "cost_tables": _tables()}
    call = function or av_core.choose_draft_budget
    p = np.full((2, 4), 0.5, np.float32) if confidences is None else confidences
    return call(p, np.array([4, 4]), **(keywords | options))


def _bad_calls(tmp_path: Path) -> list[tuple[str, Callable[[], Any], str]]:
    """(what, a bad call, the class it raises)."""
    est = av_core.AcceptanceEstimator(4)
    planner = av_core.VerificationPlanner(_tables(), 4)
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 not a parquet file")
    calls: list[tuple[str, Callable[[], Any], str]] = [
        ("estimator K as text", lambda: av_core.AcceptanceEstimator("four"), "InvalidTypeError"),
        ("estimator K negative", lambda: av_core.AcceptanceEstimator(-1), "InvalidValueError"),
        (
            "estimator memory 2",
            lambda: av_core.AcceptanceEstimator(4, memory=2.0),
            "InvalidValueError",
        ),
        (
            "predict wrong shape",
            lambda: est.predict(np.zeros((2, 3), np.float32)),
            "InvalidValueError",
        ),
        ("predict int dtype", lambda: est.predict(np.zeros((2, 4), np.int64)), "InvalidTypeError"),
        (
            "observe wrong rows",
            lambda: est.observe(np.zeros((2, 4), np.float32), [1], [0]),
            "InvalidValueError",
        ),
        (
            "state bytes garbage",
            lambda: av_core.AcceptanceEstimator.from_bytes(b"xx"),
            "StateError",
        ),
        (
            "state dict unknown key",
            lambda: av_core.AcceptanceEstimator.from_state_dict({"nope": 1}),
            "InvalidValueError",
        ),
        (
            "config unknown key",
            lambda: av_core.EstimatorConfig.from_dict({"nope": 1}),
            "InvalidValueError",
        ),
        (
            "cost curve shape",
            lambda: av_core.CostTables.from_curves(
                [(1, 2)], "a", max_num_reqs=3, max_batch_tokens=4
            ),
            "InvalidValueError",
        ),
        ("cost tables text", lambda: av_core.CostTables.from_json("{"), "StateError"),
        ("planner K zero", lambda: av_core.VerificationPlanner(_tables(), 0), "InvalidValueError"),
        (
            "planner tables type",
            lambda: av_core.VerificationPlanner("tables", 4),
            "InvalidTypeError",
        ),
        (
            "depth without table",
            lambda: planner.choose_draft_depth(
                np.arange(2), np.array([4, 4]), num_non_draft_tokens=2, num_sampling_requests=2
            ),
            "DepthTableError",
        ),
        (
            "budget bad probability",
            lambda: _budget(np.full((2, 4), 2.0, np.float32)),
            "InvalidValueError",
        ),
        ("budget tables type", lambda: _budget(cost_tables="tables"), "InvalidTypeError"),
        (
            "depth mode type",
            lambda: _budget(function=av_core.choose_draft_depth, mode=3),
            "InvalidTypeError",
        ),
        (
            "budget source type",
            lambda: av_core.VerificationPlanner(_tables(), 4, budget_source=1),
            "InvalidTypeError",
        ),
        ("tables json type", lambda: av_core.CostTables.from_json(5), "InvalidTypeError"),
        (
            "distributed ragged round",
            lambda: __import__("av_core.distributed", fromlist=["x"]).round_limbs(
                {"a": [0], "b": [0, 1], "c": [0], "g0": [0], "g1": [0], "n": [0]}
            ),
            "InvalidValueError",
        ),
        (
            "metrics bad labels",
            lambda: __import__("av_core.tools.metrics", fromlist=["x"]).expected_calibration_error(
                [2], [0.5]
            ),
            "InvalidValueError",
        ),
        (
            "trace bad file",
            lambda: __import__("av_core.tools.trace", fromlist=["x"]).read_trace(
                tmp_path / "bad.csv"
            ),
            "InvalidValueError",
        ),
        (
            "trace negative request",
            lambda: __import__("av_core.tools.trace", fromlist=["x"]).DraftTrace(
                request_id=[-1],
                step=[0],
                position=[0],
                workload=["w"],
                logit_q_max=[0.5],
                admitted=[True],
                label=[1],
            ),
            "InvalidValueError",
        ),
        (
            "int list grammar",
            lambda: __import__("av_core.tools.argtypes", fromlist=["x"]).parse_int_list("8-2"),
            "InvalidValueError",
        ),
    ]
    if importlib.util.find_spec("pyarrow") is not None:
        calls.append(
            (
                "trace damaged parquet",
                lambda: __import__("av_core.tools.trace", fromlist=["x"]).read_trace(
                    tmp_path / "bad.parquet"
                ),
                "InvalidValueError",
            )
        )
    torch = pytest.importorskip("torch")
    from av_core import features, planner_torch

    calls += [
        (
            "features dtype",
            lambda: features.draft_log_odds(torch.zeros(2, 3, dtype=torch.int32)),
            "InvalidTypeError",
        ),
        ("features shape", lambda: features.draft_log_odds(torch.zeros(3)), "InvalidValueError"),
        (
            "torch survivals type",
            lambda: planner_torch.survivals_torch("x"),  # type: ignore[arg-type]
            "InvalidTypeError",
        ),
    ]
    return calls


def _engine_bad_calls(tmp_path: Path) -> list[tuple[str, Callable[[], Any], str]]:
    """(what, a bad call, the class it raises) for the engine integrations (SGLang, llama.cpp,
    vLLM), the engine-interface reader and the run simulator."""
    from av_core._engine_interface import parse_signature
    from av_core.llama_cpp.policies import LlamaCppPolicy
    from av_core.llama_cpp.sampling import SamplingParams
    from av_core.llama_cpp.tiny import tiny_vocabulary
    from av_core.sglang.policy import CostAwarePolicy, load_cost_tables
    from av_core.sglang.profiling import ProfilingCostAwarePolicy
    from av_core.tools.simulate.run import simulate_run

    (tmp_path / "list.json").write_text("[]")
    return [
        ("signature text", lambda: parse_signature("(a,"), "InvalidValueError"),
        (
            "simulated run rounds",
            lambda: simulate_run("rounds", None, None, 4, features=np.zeros((1, 4))),  # type: ignore[arg-type]
            "InvalidTypeError",
        ),
        ("sglang tables missing", lambda: CostAwarePolicy(None, [1, 2]), "InvalidTypeError"),
        ("sglang steps negative", lambda: CostAwarePolicy(_tables(), [-1]), "InvalidValueError"),
        (
            "sglang drafter name",
            lambda: CostAwarePolicy(_tables(), [1, 2], drafter="tree"),  # type: ignore[arg-type]
            "InvalidValueError",
        ),
        (
            "sglang profile warmup",
            lambda: ProfilingCostAwarePolicy(None, [1, 2], profile_warmup=-1),
            "InvalidValueError",
        ),
        (
            "sglang tables file",
            lambda: load_cost_tables(tmp_path / "list.json", 4),
            "InvalidValueError",
        ),
        (
            "llama.cpp temperature text",
            lambda: SamplingParams(temperature="hot"),  # type: ignore[arg-type]
            "InvalidTypeError",
        ),
        ("llama.cpp top_p", lambda: SamplingParams(top_p=2.0), "InvalidValueError"),
        ("llama.cpp n_max", lambda: LlamaCppPolicy(n_max=0), "InvalidValueError"),
        ("llama.cpp vocabulary", lambda: tiny_vocabulary(1), "InvalidValueError"),
    ]


def _vllm_bad_calls(tmp_path: Path) -> list[tuple[str, Callable[[], Any], str]]:
    """(what, a bad call, the class it raises) for av_core.vllm (needs torch, not vLLM)."""
    torch = pytest.importorskip("torch")
    from av_core.vllm.budget import build_cost_tables_from_curves
    from av_core.vllm.depth import DraftDepthHook
    from av_core.vllm.estimator import OnlineAcceptanceEstimator
    from av_core.vllm.state import WarmStart
    from av_core.vllm.update import choose_update

    cpu = torch.device("cpu")
    return [
        (
            "vllm curve type",
            lambda: build_cost_tables_from_curves("curve", [(1, 1.0)], 4, 8),  # type: ignore[arg-type]
            "InvalidTypeError",
        ),
        ("vllm depth table", lambda: DraftDepthHook(_tables(), 4, 4), "InvalidValueError"),
        (
            "vllm staged type",
            lambda: OnlineAcceptanceEstimator(4, 4, cpu, staged=1),  # type: ignore[arg-type]
            "InvalidTypeError",
        ),
        (
            "vllm state key",
            lambda: WarmStart(tmp_path, "key"),  # type: ignore[arg-type]
            "InvalidTypeError",
        ),
        ("vllm update name", lambda: choose_update("newton", False), "InvalidValueError"),
    ]


@pytest.mark.parametrize("calls", [_bad_calls, _engine_bad_calls, _vllm_bad_calls])
def test_representative_bad_calls_raise_the_root_and_the_builtin(
    tmp_path: Path, calls: Callable[[Path], list[tuple[str, Callable[[], Any], str]]]
) -> None:
    for what, call, expected in calls(tmp_path):
        with pytest.raises(av_core.Error) as caught:
            call()
        error = caught.value
        assert isinstance(error, ValueError | TypeError), (what, type(error))
        assert type(error).__name__ == expected, (what, type(error).__name__, str(error))
        assert str(error), what


def test_a_bad_environment_value_is_an_error_of_the_root(monkeypatch: pytest.MonkeyPatch) -> None:
    from av_core import _settings

    monkeypatch.setenv("AV_CORE_SGLANG_MAX_BATCH", "none")
    with pytest.raises(av_core.Error) as caught:
        _settings.check(_settings.SGLANG_SETTINGS)
    assert isinstance(caught.value, av_core.SettingError) and isinstance(caught.value, ValueError)
