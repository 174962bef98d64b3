"""The C example (``examples/llama_cpp/av_spec.c``): av_core's loop inside llama.cpp, from C.

Builds it with ``examples/llama_cpp/build.sh`` against the installed llama-cpp-python and
av_core's static C library, writes tiny llama-architecture GGUFs from seeded random weights
(``av_core.llama_cpp.tiny``), and runs it:

* every policy exits 0 with output that parses, and its counts add up: emitted = accepted +
  one per verify, R x new tokens in all;
* llama.cpp's policy (greedy drafts, p_min, n_min) makes the Python loop's decisions step for
  step on the same prompt (greedy sampling);
* greedy decoding emits the same tokens under every policy as without speculation, and they are
  the argmax of llama-cpp-python's own evaluation of the target (a cache rollback that kept a
  rejected draft, or dropped an accepted one, changes what follows);
* at temperature 1.5 the first two emitted tokens follow the same law with speculation (fixed K
  and llama.cpp's greedy drafts) as without (chi-square, two samples), which a residual drawn
  from p instead of max(0, p - q) fails at p < 1e-8;
* bad input (missing, non-GGUF or truncated model, mismatched vocabularies, a context too
  small, bad cost tables, bad options) gives one line on stderr naming the file or setting,
  exit 2, nothing on stdout;
* one run under AddressSanitizer and UndefinedBehaviorSanitizer (valgrind cannot run a
  llama.cpp built for AVX-512).

Skips only when there is no C compiler.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llama_cpp"
POLICIES = ("avd", "av", "vllm", "llama", "fixed", "none")
# The drafters' weight noise: close enough that most drafts pass, far enough that some fail.
CLOSE_NOISE, FAR_NOISE = 0.05, 0.3
# Cheap drafting, so that AV+D and AV draft and verify on the tiny pair (with the built-in
# tables of the real pair, drafting costs about as much as verifying and AV+D rarely drafts).
CHEAP_TABLES = {
    "draft_ms": [0.0, 0.4, 0.5, 0.6, 0.7],
    "verify_ms": [1.0] + [2.0 + 0.05 * t for t in range(20)],
}

pytestmark = pytest.mark.skipif(
    shutil.which(os.environ.get("CC", "cc")) is None, reason="no C compiler"
)


def build(*args: str) -> Path:
    result = subprocess.run(
        [str(EXAMPLE / "build.sh"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": sys.executable},
    )
    assert result.returncode == 0, result.stderr
    return Path(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def av_spec() -> Path:
    return build()


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A target and two drafters of its weights plus seeded noise: a close one (acceptance
    about 0.8 at temperature 1) and a farther one (more rejections, so the law test exercises
    the residual); a model with one more token; and the cheap cost tables."""
    from av_core.llama_cpp.tiny import write_tiny_model

    out = tmp_path_factory.mktemp("tiny_models")
    paths = {
        "target": write_tiny_model(out / "target.gguf", seed=0),
        "drafter": write_tiny_model(out / "drafter.gguf", seed=0, noise=CLOSE_NOISE),
        "far_drafter": write_tiny_model(out / "far_drafter.gguf", seed=0, noise=FAR_NOISE),
        "other_vocab": write_tiny_model(out / "other_vocab.gguf", vocab_size=385, seed=0),
        "tables": out / "cheap.json",
    }
    paths["tables"].write_text(json.dumps(CHEAP_TABLES))
    return paths


def flags(**options: object) -> list[str]:
    """``--name value`` for each keyword (underscores become dashes)."""
    return [
        item
        for name, value in options.items()
        for item in (f"--{name.replace('_', '-')}", str(value))
    ]


def run(
    binary: Path, models: dict[str, Path], *args: str, check: bool = True, **options: object
) -> subprocess.CompletedProcess[str]:
    """The program on the pair models["target"], models["drafter"] with one thread."""
    argv = [*flags(target=models["target"], drafter=models["drafter"], threads=1), *args]
    result = subprocess.run(
        [str(binary), *argv, *flags(**options)], capture_output=True, text=True, timeout=300
    )
    if check:
        assert result.returncode == 0, result.stderr
    return result


def run_json(binary: Path, models: dict[str, Path], **options: object) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(run(binary, models, "--json", **options).stdout)
    return data


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_runs_and_its_counts_add_up(
    av_spec: Path, models: dict[str, Path], policy: str
) -> None:
    requests, new_tokens, k = 3, 24, 4
    d = run_json(
        av_spec,
        models,
        policy=policy,
        requests=requests,
        new_tokens=new_tokens,
        k=k,
        cost_tables=models["tables"],
    )
    print(
        f"{policy}: emitted {d['emitted']} = accepted {d['accepted']} + verifies "
        f"{d['verifies']}; drafted {d['drafted']}, admitted {d['admitted']}, "
        f"{d['target_calls']} target calls, acceptance {d['acceptance']:.3f}"
    )
    assert d["emitted"] == d["accepted"] + d["verifies"] == requests * new_tokens
    assert [len(tokens) for tokens in d["generated"]] == [new_tokens] * requests
    assert d["target_calls"] == d["steps"]
    assert 0 <= d["accepted"] <= d["admitted"] <= d["drafted"] <= d["verifies"] * k
    if d["admitted"]:
        assert d["acceptance"] == pytest.approx(d["accepted"] / d["admitted"], abs=1e-6)
    assert d["tokens_per_target_call"] == pytest.approx(d["emitted"] / d["target_calls"], abs=1e-5)
    assert d["tokens_per_s"] > 0 and d["tokens_per_s_cpu"] > 0
    if policy == "none":
        assert d["drafted"] == d["drafter_calls"] == 0
        assert d["verifies"] == requests * new_tokens
    else:
        # With cheap drafting every speculating policy drafts, and the pair agrees often.
        assert d["drafted"] > 0 and d["accepted"] > 0
    if policy in ("fixed", "llama"):
        assert d["admitted"] == d["drafted"]
    if policy in ("avd", "av", "vllm"):
        assert d["av_core_ms_per_step"] > 0


def test_the_text_report_states_the_accounting(av_spec: Path, models: dict[str, Path]) -> None:
    result = run(av_spec, models, policy="fixed", requests=2, new_tokens=10)
    lines = result.stdout.splitlines()
    assert lines[0].startswith("policy fixed, R = 2, 10 new tokens each")
    accounting = [line for line in lines if line.startswith("emitted = accepted + verifies:")]
    assert len(accounting) == 1
    emitted, rest = accounting[0].split(": ")[1].split(" = ")
    accepted, verifies = rest.split(" + ")
    assert int(emitted) == int(accepted) + int(verifies) == 20
    assert any(line.startswith("tokens/s ") and "wall" in line and "CPU" in line for line in lines)


def test_greedy_tokens_do_not_depend_on_the_policy(av_spec: Path, models: dict[str, Path]) -> None:
    generated = {}
    for policy in POLICIES:
        d = run_json(
            av_spec,
            models,
            policy=policy,
            temperature=0,
            requests=4,
            new_tokens=48,
            cost_tables=models["tables"],
        )
        generated[policy] = d["generated"]
        if policy != "none":
            assert 0 < d["accepted"] < d["admitted"], "needs both accepted and rejected drafts"
    for policy in POLICIES:
        assert generated[policy] == generated["none"], policy


def test_greedy_speculation_follows_the_targets_argmax(
    av_spec: Path, models: dict[str, Path]
) -> None:
    """An independent reference: llama-cpp-python evaluates the target on the prompt and the
    tokens the C program emitted (fixed K, rejections included) and each emitted token is the
    argmax of its row. Logits differ between batch shapes by about 3e-5 on this model, so the
    check also requires every row's top-two gap to be far above that."""
    from llama_cpp import Llama

    prompt = "def add(a, b):\n    return"
    d = run_json(
        av_spec, models, policy="fixed", temperature=0, requests=2, new_tokens=48, prompt=prompt
    )
    assert 0 < d["accepted"] < d["admitted"]
    target = Llama(model_path=str(models["target"]), n_ctx=256, logits_all=True, verbose=False)
    prompt_tokens = target.tokenize(prompt.encode(), add_bos=True)
    for generated in d["generated"]:
        target.reset()
        target.eval(prompt_tokens + generated[:-1])
        rows = np.asarray(target.scores[len(prompt_tokens) - 1 : target.n_tokens])
        assert list(rows.argmax(axis=1)) == generated
        top_two = np.sort(rows, axis=1)[:, -2:]
        assert (top_two[:, 1] - top_two[:, 0]).min() > 1e-3


@pytest.mark.parametrize("temperature", ["0", "1"])
def test_a_drafter_equal_to_the_target_is_always_accepted(
    av_spec: Path, models: dict[str, Path], temperature: str
) -> None:
    """With the target as its own drafter, q equals p whenever the drafter's cache holds the
    same tokens as the target's, so every draft passes: a drafter cache that lost or kept a
    wrong token after a rollback would show up as rejections."""
    same = {"target": models["target"], "drafter": models["target"]}
    d = run_json(av_spec, same, policy="fixed", requests=3, new_tokens=40, temperature=temperature)
    assert d["admitted"] > 60
    assert d["accepted"] == d["admitted"]


def emitted_counts(
    av_spec: Path, models: dict[str, Path], policy: str, seeds: range
) -> list[Counter[int]]:
    """Counts of the first and second emitted token over 256 requests per seed."""
    counts: list[Counter[int]] = [Counter(), Counter()]
    for seed in seeds:
        d = run_json(
            av_spec,
            {"target": models["target"], "drafter": models["far_drafter"]},
            policy=policy,
            k=2,
            requests=256,
            new_tokens=3,
            temperature=1.5,
            prompt="def f(x):",
            seed=seed,
        )
        for position in (0, 1):
            counts[position].update(tokens[position] for tokens in d["generated"])
    return counts


@pytest.mark.parametrize("policy", ["fixed", "llama"])
def test_speculation_emits_the_targets_law(
    av_spec: Path, models: dict[str, Path], policy: str
) -> None:
    """Two-sample chi-square per emitted position: speculative (K = 2: fixed K, or llama.cpp's
    greedy drafts; both positions come from acceptance, residual or bonus) against plain
    sampling, 2048 draws each, tokens seen fewer than 10 times pooled."""
    from scipy.stats import chi2_contingency

    plain = emitted_counts(av_spec, models, "none", range(8))
    speculative = emitted_counts(av_spec, models, policy, range(1000, 1008))
    for position in (0, 1):
        tokens = sorted(set(plain[position]) | set(speculative[position]))
        table = np.array([[c[position][t] for t in tokens] for c in (plain, speculative)])
        common = table.sum(axis=0) >= 10
        pooled = np.column_stack([table[:, common], table[:, ~common].sum(axis=1)])
        p_value = chi2_contingency(pooled)[1]
        print(f"position {position}: {pooled.shape[1]} categories, p = {p_value:.3g}")
        assert p_value > 1e-3, (position, pooled)


@pytest.mark.parametrize("p_min", [0.3, 0.6])
def test_llama_cpps_policy_makes_the_python_loops_decisions(
    av_spec: Path, models: dict[str, Path], p_min: float
) -> None:
    """Greedy sampling and llama.cpp's policy (greedy drafts, stops below p_min): the C
    program and the Python loop (av_core.llama_cpp) on the same prompt tokens make the same
    steps: as many drafter passes, drafts, verified and accepted drafts, and the same tokens."""
    from av_core.llama_cpp import open_engine
    from av_core.llama_cpp.policies import LlamaCppPolicy
    from av_core.llama_cpp.sampling import SamplingParams

    prompt, requests, new_tokens = "def add(a, b):\n    return", 2, 40
    d = run_json(
        av_spec,
        models,
        policy="llama",
        p_min=p_min,
        k=3,
        temperature=0,
        requests=requests,
        new_tokens=new_tokens,
        prompt=prompt,
    )
    engine = open_engine(
        models["target"],
        models["drafter"],
        requests=requests,
        tokens_per_request=64,
        params=SamplingParams(0.0),
        max_positions=3,
    )
    tokens = engine.target.model.tokenize(prompt)  # type: ignore[attr-defined]
    result = engine.generate([tokens] * requests, new_tokens, LlamaCppPolicy(3, p_min=p_min))
    passes = sum(len(step.shape.draft_passes) for step in result.steps)
    drafted = sum(int(step.drafted.sum()) for step in result.steps)
    assert (d["steps"], d["drafter_calls"], d["drafted"]) == (len(result.steps), passes, drafted)
    assert (d["admitted"], d["accepted"]) == (result.admitted, result.accepted)
    assert d["generated"] == result.tokens
    assert 0 < d["drafted"] < d["steps"] * requests * 3  # p_min stopped some drafts


def test_llama_cpps_n_min_drops_short_drafts(av_spec: Path, models: dict[str, Path]) -> None:
    """n_min above n_max: every draft is dropped, nothing is verified, the drafter still ran."""
    d = run_json(av_spec, models, policy="llama", k=2, n_min=3, requests=2, new_tokens=12)
    assert d["drafter_calls"] > 0 and d["drafted"] == d["admitted"] == d["accepted"] == 0
    assert d["emitted"] == d["verifies"] == 24


def profile_file(path: Path, tables_by_r: dict[int, dict[str, Any]]) -> Path:
    """A cost file shaped as `av-core profile --engine llama.cpp` writes it: per concurrency,
    measured points and the planner's tables (plus strings and nesting the reader must skip)."""
    data = {
        "format": "av_core.llama_cpp.costs/1",
        "engine": "llama.cpp",
        "note": 'braces, quotes and escapes in a string: "}{[ \\\\" \\',
        "num_positions": 4,
        "concurrency": {
            str(r): {
                "verify": [[r, 2.0], [2 * r, 3.5]],
                "draft": [[1, 0.1]],
                "nested": [1, {"a": [True, None, -1e-3]}, []],
                "cost_tables": tables,
            }
            for r, tables in tables_by_r.items()
        },
    }
    path.write_text(json.dumps(data, indent=1))
    return path


def test_a_profile_file_gives_the_tables_of_its_concurrency(
    av_spec: Path, models: dict[str, Path], tmp_path: Path
) -> None:
    dear = {**CHEAP_TABLES, "draft_ms": [0.0, 400.0, 500.0, 600.0, 700.0]}
    drafted = {}
    for name, tables_by_r in {
        "cheap at 4": {2: dear, 4: CHEAP_TABLES},
        "dear at 4": {2: CHEAP_TABLES, 4: dear},
    }.items():
        path = profile_file(tmp_path / "profile.json", tables_by_r)
        d = run_json(av_spec, models, requests=4, new_tokens=20, cost_tables=path)
        drafted[name] = d["drafted"]
    assert drafted["cheap at 4"] > 40 and drafted["dear at 4"] == 0, drafted
    result = run(av_spec, models, requests=3, cost_tables=path, check=False)
    assert result.returncode == 2
    assert result.stderr == (
        f"av_spec: error: --cost-tables {path}: has no profile at R = 3 (profile that "
        "concurrency)\n"
    )


@pytest.mark.parametrize("depth_table", [[0.0, 0.25, 0.5, 0.75, 1.0], [0.0, 1.0, 1.0, 1.0, 1.0]])
def test_cost_tables_with_a_depth_table_of_k_are_used(
    av_spec: Path, models: dict[str, Path], tmp_path: Path, depth_table: list[float]
) -> None:
    path = tmp_path / "tables.json"
    path.write_text(json.dumps({**CHEAP_TABLES, "draft_depth_ms": depth_table}))
    d = run_json(av_spec, models, requests=4, new_tokens=20, cost_tables=path)
    assert d["drafted"] > 0 and d["emitted"] == 80
    result = run(av_spec, models, requests=4, k=3, cost_tables=path, check=False)
    assert result.returncode == 2
    assert result.stderr == (
        f"av_spec: error: --cost-tables {path}: its draft_depth_ms covers depth 4, but --k is 3\n"
    )


BAD_INPUT = [
    (["--target", "{dir}/missing.gguf"], "--target {dir}/missing.gguf: cannot open"),
    (["--target", "{dir}/garbage.gguf"], "--target {dir}/garbage.gguf: not a GGUF file"),
    (["--target", "{dir}/truncated.gguf"], "--target {dir}/truncated.gguf: llama.cpp cannot load"),
    (["--drafter", "{other_vocab}"], "--drafter {other_vocab}: vocabulary of 385 tokens"),
    (["--n-ctx", "64"], "--n-ctx: 64 is too small for R x (prompt + new tokens + K + 1)"),
    (["--cost-tables", "{dir}/missing.json"], "--cost-tables {dir}/missing.json: cannot open"),
    (
        ["--cost-tables", "{dir}/bad.json"],
        "--cost-tables {dir}/bad.json: avc_cost_tables_from_json",
    ),
    (["--cost-tables", "{tables}", "--requests", "8"], "--cost-tables {tables}: covers 4 requests"),
    (["--requests", "0"], "--requests: expected an integer in [1, 256], got '0'"),
    (
        ["--policy", "greedy"],
        "--policy: expected avd, av, vllm, llama, fixed or none, got 'greedy'",
    ),
    (["--p-min", "1.5"], "--p-min: expected a number in [0, 1], got '1.5'"),
    (["--n-min", "-1"], "--n-min: expected an integer in [0, 64], got '-1'"),
    (["--top-p", "1.5"], "--top-p: expected a number in (0, 1], got '1.5'"),
    (["--frobnicate"], "unknown or incomplete option '--frobnicate'"),
]


@pytest.mark.parametrize(("args", "message"), BAD_INPUT)
def test_bad_input_is_one_line_naming_the_file_or_setting(
    av_spec: Path,
    models: dict[str, Path],
    tmp_path: Path,
    args: list[str],
    message: str,
) -> None:
    (tmp_path / "garbage.gguf").write_bytes(bytes(range(256)) * 8)
    (tmp_path / "truncated.gguf").write_bytes(models["target"].read_bytes()[:50_000])
    (tmp_path / "bad.json").write_text('{"draft_ms": [0.5]}')
    names = {"dir": tmp_path, "other_vocab": models["other_vocab"], "tables": models["tables"]}
    # The pair comes first; a --target or --drafter in args replaces it (the last one counts).
    result = run(av_spec, models, *[a.format(**names) for a in args], check=False)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"av_spec: error: {message.format(**names)}"), lines[0]


@pytest.fixture(scope="module")
def av_spec_asan() -> Path:
    probe = subprocess.run(
        [
            os.environ.get("CC", "cc"),
            "-fsanitize=address,undefined",
            "-x",
            "c",
            "-",
            "-o",
            os.devnull,
        ],
        input="int main(void) { return 0; }",
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        pytest.skip("the C compiler has no AddressSanitizer")
    return build("--sanitize")


def test_every_truncated_cost_file_is_one_line_under_sanitizers(
    av_spec_asan: Path, models: dict[str, Path], tmp_path: Path
) -> None:
    """The cost-file reader never reads past the text, whatever prefix of a file it gets (the
    tables are read before the models, so each run is quick)."""
    text = profile_file(tmp_path / "whole.json", {4: CHEAP_TABLES}).read_bytes()
    path = tmp_path / "cut.json"
    for cut in range(0, len(text), 7):
        path.write_bytes(text[:cut])
        result = run(av_spec_asan, models, cost_tables=path, check=False)
        assert result.returncode == 2, (cut, result.stderr)
        assert len(result.stderr.splitlines()) == 1, (cut, result.stderr)
        assert result.stderr.startswith(f"av_spec: error: --cost-tables {path}: "), result.stderr


def test_a_run_under_address_and_undefined_behaviour_sanitizers(
    av_spec_asan: Path, models: dict[str, Path]
) -> None:
    for policy in ("avd", "fixed"):
        d = run_json(
            av_spec_asan,
            models,
            policy=policy,
            requests=3,
            new_tokens=16,
            top_k=40,
            top_p=0.9,
            cost_tables=models["tables"],
        )
        assert d["emitted"] == d["accepted"] + d["verifies"] == 48
