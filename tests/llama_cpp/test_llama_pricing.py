"""The price of a step's micro-batches (``EngineCosts.price``) where profiled points are few,
uneven or noisy, and the re-pricing of a saved benchmark folder (``reprice``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from llama_fakes import FakeRuntime
from sklearn.isotonic import IsotonicRegression

from av_core.llama_cpp.bench import run_record, run_trace
from av_core.llama_cpp.engine import SpeculativeEngine
from av_core.llama_cpp.policies import PolicySpec
from av_core.llama_cpp.profile import EngineCosts, monotone_fit, write_engine_costs
from av_core.llama_cpp.reprice import reprice
from av_core.llama_cpp.sampling import SamplingParams
from av_core.tools.simulate.run import StepShape
from av_core.tools.trace import write_trace


def _line(tokens: list[int]) -> list[tuple[int, float]]:
    """Target points on one line of tokens: 10 ms plus 3 ms per token."""
    return [(t, 10.0 + 3.0 * t) for t in tokens]


def _entry(verify: list[tuple[int, float]], requests: int) -> dict[str, list[tuple[int, float]]]:
    return {
        "verify": verify,
        "draft": [(n, 5.0 * n) for n in range(1, requests + 1)],
        "catchup": [(1, 5.0), (9, 9.0), (33, 21.0)],
        "draft_depth": [(0, 0.0), (1, 5.0 * requests)],
    }


@pytest.mark.parametrize("seed", range(40))
def test_monotone_fit_is_isotonic_regression(seed: int) -> None:
    """Against scikit-learn's isotonic regression, with repeated x and violations."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 14))
    x = rng.integers(0, 9, size=n).astype(float)
    y = 4.0 * x + rng.normal(0.0, 6.0, size=n)
    xs, fitted = monotone_fit(list(zip(x.tolist(), y.tolist(), strict=True)))
    assert xs.tolist() == sorted(set(x.tolist()))
    reference = IsotonicRegression().fit(x, y).predict(xs)
    np.testing.assert_allclose(fitted, reference, rtol=1e-9, atol=1e-9)


def test_a_micro_batch_costs_its_tokens_whatever_its_sequences() -> None:
    """Slot 3 has left: slots 0-2 and 4-7 run as micro-batches of 3 and 4 tokens, priced on the
    tokens curve that pools R = 1's points (1-3 tokens) with R = 8's (8, 16, 24): 3 tokens at
    R = 1's point, 4 between R = 1's 3 and R = 8's 8 (R = 8's points alone, held flat or
    extended, price neither)."""
    r8 = [(8, 40.0), (16, 60.0), (24, 80.0)]
    costs = EngineCosts({1: _entry(_line([1, 2, 3]), 1), 8: _entry(r8, 8)}, 2, {})
    verify = tuple((s, 1) for s in (0, 1, 2, 4, 5, 6, 7))
    at3 = 10.0 + 3.0 * 3
    at4 = at3 + (40.0 - at3) * (4 - 3) / (8 - 3)
    assert costs.price(StepShape((), verify)) == pytest.approx(at3 + at4)


def test_below_the_smallest_profiled_tokens_the_first_segment_extends() -> None:
    """Only R = 16 profiled: one sequence verifying 2 tokens costs the line at 2 tokens, not the
    16 tokens of the first point; a segment steep enough to cross 0 gives 0 ms, never less."""
    costs = EngineCosts({16: _entry(_line([16, 32, 48]), 16)}, 2, {})
    assert costs.price(StepShape((), ((5, 2),))) == pytest.approx(10.0 + 3.0 * 2)
    steep = EngineCosts({16: _entry([(16, 20.0), (32, 100.0)], 16)}, 2, {})
    assert steep.price(StepShape((), ((5, 1),))) == 0.0
    assert steep.price(StepShape((), ((5, 20),))) == pytest.approx(20.0 + 5.0 * 4)


def test_a_noisy_point_is_averaged_not_carried_forward() -> None:
    """A drafter pass over 2 requests measured at 30 ms, over 3 at 20: the fit prices both at
    their mean, 25 (a running maximum would price 3 requests at 30); the target likewise."""
    entry = _entry([(4, 40.0), (8, 90.0), (12, 70.0), (16, 120.0)], 4)
    entry["draft"] = [(1, 10.0), (2, 30.0), (3, 20.0), (4, 40.0)]
    costs = EngineCosts({4: entry}, 2, {})
    assert costs.price(StepShape((((0, 1), (1, 1), (2, 1)),), ())) == pytest.approx(25.0)
    assert costs.price(StepShape((), tuple((s, 3) for s in range(4)))) == pytest.approx(80.0)


PROMPTS = [[0, 1], [2], [3, 4, 0], [1]]


def _folder(tmp_path: Path, costs: EngineCosts) -> Path:
    """A benchmark folder of one repeat at R = 4, 1 thread: the trace run K=2, no-spec and K=1,
    run on the fake pair, recorded as ``run_bench`` records them."""
    params = SamplingParams(1.0)
    settings = {
        "target": "t.gguf",
        "drafter": "d.gguf",
        "num_positions": 2,
        "max_new_tokens": 12,
        "max_prompt_tokens": 8,
        "temperature": 1.0,
        "seed": 0,
        "clock": "wall",
    }
    (tmp_path / "traces").mkdir()
    (tmp_path / "settings.json").write_text(json.dumps(settings), encoding="utf-8")
    write_engine_costs(tmp_path / "costs_t1.json", costs)
    lines = []
    for name in ("K=2", "no-spec", "K=1"):
        engine = SpeculativeEngine(
            FakeRuntime(6, 3, capacity=96), FakeRuntime(6, 53, scale=1.0, capacity=96), params
        )
        policy = PolicySpec(name).build(costs.tables(4), 2, 4)
        result = engine.generate(PROMPTS, 12, policy, seed=0)
        record = run_record(result, name, 4, 1, 0, costs)
        record["simulated_tokens_per_s"] = -1.0
        if name == "K=2":
            trace = run_trace(result, ["w"] * 4, params)
            assert trace is not None
            write_trace(trace, tmp_path / "traces" / "t1_R4_r0_K=2.csv.gz")
        lines.append(json.dumps(record))
    (tmp_path / "runs.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return tmp_path


def test_reprice_recovers_each_known_runs_price_from_its_trace(tmp_path: Path) -> None:
    """With the cost file the runs were priced by, re-pricing gives back the priced figures
    their own step records gave (the trace run's shapes replayed from its trace, no-spec's
    from its count of steps); with every cost doubled, half the tokens per second."""
    entry = _entry(_line([4, 8, 12]), 4)
    entry["draft"] = [(1, 4.0), (2, 9.0), (3, 11.0), (4, 15.0)]
    costs = EngineCosts({4: entry}, 2, {"threads": 1, "context": 8, "clock": "wall"})
    folder = _folder(tmp_path, costs)
    recorded = {
        r["policy"]: r
        for r in map(json.loads, (folder / "runs.jsonl").read_text(encoding="utf-8").splitlines())
    }
    records, rows = reprice(folder)
    by_policy = {r["policy"]: r for r in records}
    for name in ("K=2", "no-spec"):
        for key in ("priced_draft_ms", "priced_verify_ms", "priced_tokens_per_s"):
            assert by_policy[name][key] == pytest.approx(recorded[name][key]), (name, key)
            assert key in by_policy[name]["repriced"]
        assert by_policy[name]["simulated_tokens_per_s"] > 0
    assert by_policy["K=2"]["simulated_tokens_per_s"] == pytest.approx(
        by_policy["K=2"]["priced_tokens_per_s"]
    )
    # K=1's own steps are not in the folder: its priced figures stay the recorded ones.
    assert by_policy["K=1"]["repriced"] == ["simulated_tokens_per_s"]
    assert by_policy["K=1"]["priced_verify_ms"] == recorded["K=1"]["priced_verify_ms"]
    assert {row["policy"] for row in rows} == {"K=2", "no-spec", "K=1"}

    doubled = EngineCosts(
        {4: {k: [(x, 2.0 * ms) for x, ms in v] for k, v in entry.items()}}, 2, costs.metadata
    )
    write_engine_costs(folder / "costs_t1.json", doubled)
    again = {r["policy"]: r for r in reprice(folder)[0]}
    for name in ("K=2", "no-spec", "K=1"):
        assert again[name]["simulated_tokens_per_s"] == pytest.approx(
            by_policy[name]["simulated_tokens_per_s"] / 2
        )
    for name in ("K=2", "no-spec"):
        for key in ("priced_draft_ms", "priced_verify_ms"):
            assert again[name][key] == pytest.approx(2 * recorded[name][key]), (name, key)


def test_reprice_refuses_extra_costs_of_other_settings(tmp_path: Path) -> None:
    costs = EngineCosts({4: _entry(_line([4, 8, 12]), 4)}, 2, {"threads": 1, "context": 8})
    folder = _folder(tmp_path, costs)
    other = EngineCosts({1: _entry(_line([1, 2, 3]), 1)}, 2, {"threads": 2, "context": 8})
    write_engine_costs(tmp_path / "other.json", other)
    with pytest.raises(ValueError, match=r"extra_costs: .*other.json has threads 2"):
        reprice(folder, extra_costs=tmp_path / "other.json")


def test_reprice_refuses_a_folder_without_a_benchmark(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"folder: .* holds no bench-engine settings.json"):
        reprice(tmp_path)
