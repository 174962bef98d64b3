"""av_core's SGLang policy inside SGLang main's adaptive controller.

Each test runs on our reproduction of SGLang main's protocol (:mod:`sglang_main_reproduction`,
which documents the revision) and, when ``AV_CORE_SGLANG_MAIN_SRC`` names an SGLang checkout, on
that checkout's own ``adaptive_runtime_state.py``, ``adaptive_spec_params.py``,
``adaptive_step_router.py``, ``throughput_aware_controller.py`` and ``EAGLEWorkerV2`` hooks
(stand-ins for the rest, as the 0.5.23 contract test does with the released wheel):

- ``install`` accepts main's additive changes (``on_state_activated``, ``num_steps``, the
  optional profiling protocol, a newer version) and builds av_core's policy for both strategies;
- the controller drives it through 400 verify rounds: every step against the brute-force
  choice with hysteresis and probes, the verdicts learnt with the steps that ran (``num_steps``
  given or not);
- under DP attention (sgl-project/sglang#35898's rule: every rank votes, the batch runs the
  minimum) each rank learns from what ran, never from its own vote, and probes still run;
- ``run_profiling`` with :class:`ProfilingCostAwarePolicy`: every point SGLang times is recorded
  and the choices are the brute-force ones priced with those measurements;
- modified sources: additive changes are accepted, changed ones refused by name, nothing
  patched.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import sglang_main_reproduction as main
from test_sglang import geometric_counts, reference_choice
from test_sglang_contract import (
    CONFIG,
    GRAPH_BS,
    TIERS,
    drive_rounds,
    gpu_like_tables,
    padded,
    rounds_script,
    tier_of,
)

from av_core import AcceptanceEstimator, CostTables
from av_core import sglang as av_sglang
from av_core._engine_interface import engine_version
from av_core.sglang import (
    CostAwarePolicy,
    ProfilingCostAwarePolicy,
    SglangCompatibilityError,
)

SOURCES = ["reproduction", "checkout"]


@pytest.fixture(params=SOURCES)
def files(request: pytest.FixtureRequest) -> dict[str, str]:
    """The reproduction's files, or a real checkout's (``AV_CORE_SGLANG_MAIN_SRC``)."""
    if request.param == "reproduction":
        return dict(main.FILES)
    checkout = os.environ.get(main.ENV_MAIN_SRC, "").strip() or None
    if checkout is None:
        pytest.skip(f"{main.ENV_MAIN_SRC} names no SGLang checkout")
    return main.checkout_files(checkout)


@pytest.fixture
def sglang(
    files: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, ModuleType]]:
    monkeypatch.delenv(av_sglang.ENV_ANY_VERSION, raising=False)
    monkeypatch.delenv(av_sglang.ENV_COSTS, raising=False)
    monkeypatch.delenv(av_sglang.ENV_PROFILE, raising=False)
    with main.importable(files, tmp_path / "tree") as modules:
        yield modules


def configure(config: dict[str, Any] | None, tmp_path: Path, initial: int = 2) -> None:
    """What ``get_spec()`` tells the worker: the adaptive config file and the initial step."""
    spec = main.standin_spec()
    if config is not None:
        path = tmp_path / "adaptive.json"
        path.write_text(json.dumps(config))
        spec.speculative_adaptive_config = str(path)
    spec.speculative_num_steps = initial
    spec.speculative_num_draft_tokens = initial + 1


def new_worker(modules: dict[str, ModuleType]) -> Any:
    return modules[main.WORKER].EAGLEWorkerV2(None, 0, None, 0, None)


def start(worker: Any, modules: dict[str, ModuleType]) -> Any:
    """What ``EAGLEWorkerV2.init_cuda_graphs`` does: register the running state, build the
    others."""
    runtime = modules[main.RUNTIME]
    controller = worker.adaptive_controller
    steps = worker.speculative_num_steps
    controller.register(runtime.SpecRuntimeState(steps, steps + 1, *[None] * 6))
    controller.init_states(cuda_graph_bs=GRAPH_BS)
    return controller


# --- install ----------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["ema", "throughput_aware"])
def test_install_accepts_mains_additive_changes_and_builds_the_policy(
    sglang: dict[str, ModuleType],
    tmp_path: Path,
    strategy: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before, the new protocol members and the newer version were refused."""
    report = av_sglang.interface_report(sglang, engine_version("sglang"))
    assert report.problems == []
    accepted = "\n".join(report.accepted)
    assert "on_state_activated" in accepted and "num_steps=None" in accepted
    config = {"strategy": strategy, **CONFIG}
    if strategy == "throughput_aware":  # its candidate steps are >= 1
        config["8"] = {"candidate_steps": [1, 2, 3]}
        config["64"] = {"candidate_steps": [1, 2]}
    configure(config, tmp_path)
    with caplog.at_level(logging.INFO, logger="sglang.av_core"):
        replaced = av_sglang.install(cost_tables=gpu_like_tables(5))
    assert f"{main.WORKER}.AdaptiveSpeculativeParams" in replaced
    assert any("accepted an additive change" in r.getMessage() for r in caplog.records)
    if main.THROUGHPUT in sglang:
        assert f"{main.THROUGHPUT}.ThroughputAwarePolicy" in replaced
    elif strategy == "throughput_aware":
        pytest.skip("this checkout's throughput-aware policy cannot be imported here")
    worker = new_worker(sglang)
    policy = worker.adaptive_controller.params
    assert isinstance(policy, CostAwarePolicy)
    assert policy.candidate_steps == sorted(
        {s for e in config.values() if isinstance(e, dict) for s in e["candidate_steps"]}
    )
    start(worker, sglang)
    assert worker.speculative_num_steps == 2
    av_sglang.uninstall()
    assert av_sglang.installed() == []
    assert not isinstance(new_worker(sglang).adaptive_controller.params, CostAwarePolicy)


def test_no_cost_tables_means_sglangs_own_profiling(
    sglang: dict[str, ModuleType], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    configure(CONFIG, tmp_path)
    monkeypatch.setenv(av_sglang.ENV_ENABLE, "1")
    av_sglang.register()  # no AV_CORE_SGLANG_COSTS: profiles instead
    policy = new_worker(sglang).adaptive_controller.params
    assert isinstance(policy, ProfilingCostAwarePolicy) and policy.cost_tables is None
    assert isinstance(policy, sglang[main.RUNTIME].AdaptiveProfilingPolicy)


# --- the controller drives the policy ---------------------------------------------------------


@pytest.mark.parametrize("pass_steps", [False, True])
def test_mains_controller_drives_the_policy_through_verify_rounds(
    sglang: dict[str, ModuleType], tmp_path: Path, pass_steps: bool
) -> None:
    """Before, the first state switch raised (no ``on_state_activated``)."""
    k, interval, margin = 5, 25, 0.02
    tables = gpu_like_tables(k)
    depth = tables.draft_depth_ms
    assert depth is not None
    configure(CONFIG, tmp_path)
    av_sglang.install(cost_tables=tables, hysteresis=margin, probe_interval=interval)
    worker = new_worker(sglang)
    start(worker, sglang)
    policy = worker.adaptive_controller.params
    assert sorted(worker.built) == [0, 1, 3, 5]  # 2 was registered first
    for steps, graph_bs in worker.built.items():
        assert graph_bs == [b for b in GRAPH_BS if steps in TIERS[tier_of(b)]], steps

    history = drive_rounds(worker, policy, tables, margin, interval, num_steps=pass_steps)
    assert policy.counters.observed == sum(1 for s in history if s > 0)
    assert policy.counters.unmatched == policy.counters.inconsistent == 0
    assert policy.counters.overridden == 0
    assert 0 in history[200:300] and min(history[320:]) >= 1
    assert policy.counters.probes > 0


# --- DP attention: the batch runs the minimum over ranks ---------------------------------------


class Recorder:
    """Stands between a policy and its estimator: what each verdict was learnt as."""

    def __init__(self, estimator: AcceptanceEstimator) -> None:
        self.inner = estimator
        self.observed: list[tuple[int, list[int], list[int]]] = []

    def observe(self, features: Any, admitted: Any, accepted: Any, *args: Any) -> Any:
        self.observed.append((len(admitted), list(admitted), list(accepted)))
        return self.inner.observe(features, admitted, accepted, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.mark.parametrize("pass_steps", [False, True])
def test_under_dp_attention_each_rank_learns_what_ran_and_probes_still_run(
    sglang: dict[str, ModuleType], pass_steps: bool
) -> None:
    """sgl-project/sglang#35898's rule, reproduced: each rank's policy votes for its batch,
    every rank activates the minimum, and the verify reports (or not) the steps that ran. Before,
    a rank whose vote was overridden labelled the positions it never drafted as rejected, and a
    probe that the minimum cancelled was lost, so ranks that all chose 0 never drafted again."""
    runtime = sglang[main.RUNTIME]
    k = 5  # compute-bound verification: speculation pays only where drafts are good
    tables = CostTables(
        np.full(513, 0.5 * k), 2.0 + 0.1 * np.arange(512 * (k + 1) + 1)
    ).with_draft_depth("autoregressive", max_depth=k)
    ranks = []
    for _ in range(3):
        policy = CostAwarePolicy(tables, TIERS, initial_steps=2, probe_interval=20)
        recorder = Recorder(policy.estimator)
        policy._estimator = recorder  # type: ignore[assignment]
        worker = main.standin_worker(runtime)
        controller = runtime.AdaptiveController(worker, policy)
        controller.register(runtime.SpecRuntimeState(2, 3, *[None] * 6))
        controller.init_states(cuda_graph_bs=GRAPH_BS)
        ranks.append((worker, controller, policy, recorder))
    rng = np.random.default_rng(5)
    ran_history = []
    expected: list[list[tuple[int, list[int], list[int]]]] = [[], [], []]
    for t in range(700):
        good = t >= 300  # drafts never accepted, then good drafts; medium batches throughout
        p = [0.0] * 5 if not good else [0.95, 0.9, 0.9, 0.85, 0.8]
        # An idle rank (no requests) sends no vote and verifies nothing (#35898's sentinel).
        busy = [r == 0 or t % (4 + r) != 0 for r in range(len(ranks))]
        batches = [int(rng.integers(8, 32)) for _ in ranks]
        votes = [
            controller.params.get_steps_for_batch(b)
            for (_, controller, _, _), b, on in zip(ranks, batches, busy, strict=True)
            if on
        ]
        ran = min(votes)  # the DP-attention consensus
        ran_history.append(ran)
        for (worker, controller, _, _), b, on, log in zip(
            ranks, batches, busy, expected, strict=True
        ):
            if not on:
                continue
            if worker.speculative_num_steps != ran:
                controller._activate(ran)
            counts = geometric_counts(rng, p, ran, b)
            controller.on_verify_complete(counts, b, ran if pass_steps else None)
            if ran > 0:
                log.append((b, [ran] * b, counts))
    for (_, _, policy, recorder), log in zip(ranks, expected, strict=True):
        assert recorder.observed == log
        assert policy.counters.inconsistent == 0 and policy.counters.unmatched == 0
    assert ran_history[100:300].count(0) > 180  # drafts never accepted: no speculation
    late = np.asarray(ran_history[330:])
    # A probe runs only when every busy rank probes at once; one retried until it runs does
    # (without the retry these ranks stayed at 0: 0.3% of the late batches speculated).
    assert np.mean(late >= 1) > 0.4, "the ranks stayed at 0: probes never ran"


# --- start-up profiling -----------------------------------------------------------------------


def decode_ms(batch: int, steps: int) -> float:
    """What SGLang's profiling session measures here: a whole decode step's time."""
    extend = 0.6 if steps == 0 else 0.0
    return 4.0 + 0.6 * steps + extend + 0.02 * batch * (steps + 1)


def test_run_profiling_prices_steps_from_sglangs_measurements(
    sglang: dict[str, ModuleType], tmp_path: Path
) -> None:
    sys_session = __import__(main.SESSION, fromlist=["COST"])
    sys_session.COST = decode_ms
    configure(CONFIG, tmp_path)
    av_sglang.install(profile=True, hysteresis=0.0, probe_interval=None)
    worker = new_worker(sglang)
    controller = start(worker, sglang)
    policy = controller.params
    assert isinstance(policy, ProfilingCostAwarePolicy)
    worker.run_startup_spec_profiling(None, max_running_requests=256)
    assert worker.speculative_num_steps == 2  # the controller re-activates the running step
    expected = {(s, b): decode_ms(b, s) for b in GRAPH_BS if b <= 256 for s in TIERS[tier_of(b)]}
    recorded = {(s, b): ms for s, points in policy.profile.items() for b, ms in points.items()}
    assert recorded == expected
    rng = np.random.default_rng(2)
    for batch, p in rounds_script(3, n=300):
        batch = min(batch, 256)
        allowed = TIERS[tier_of(padded(batch))]
        survival = np.cumprod(1.0 / (1.0 + np.exp(-policy.estimator.intercepts)))
        rates = {
            s: batch * (1.0 + survival[:s].sum()) / decode_ms(padded(batch), s) for s in allowed
        }
        worker.activate_step_by_batch(batch)
        assert worker.speculative_num_steps == reference_choice(rates)
        steps = worker.speculative_num_steps
        worker.on_verify_complete_cpu(geometric_counts(rng, p, steps, batch), batch_size=batch)


# --- modified sources -------------------------------------------------------------------------

ADDITIVE = [
    (
        main.RUNTIME,
        "def on_verify_complete(self, num_correct_drafts_per_req, batch_size, "
        "num_steps=None):\n        switch",
        "def on_verify_complete(self, num_correct_drafts_per_req, "
        "batch_size, num_steps=None, source=None):\n        switch",
    ),
    (main.WORKER, "batch_size=0, num_steps=None):", "batch_size=0, num_steps=None, route=None):"),
    (main.RUNTIME, "    n_measure: int\n", "    n_measure: int\n    n_repeat: int = 1\n"),
]


@pytest.mark.parametrize(("module", "old", "new"), ADDITIVE)
def test_an_additive_change_is_accepted(module: str, old: str, new: str, tmp_path: Path) -> None:
    path = {main.RUNTIME: "adaptive_runtime_state.py", main.WORKER: "eagle_worker_v2.py"}[module]
    files = dict(main.FILES)
    key = f"sglang/srt/speculative/{path}"
    assert files[key].count(old) == 1
    files[key] = files[key].replace(old, new)
    with main.importable(files, tmp_path) as modules:
        report = av_sglang.interface_report(modules, None, profile=True)
        assert report.problems == []
        assert any(word in "\n".join(report.accepted) for word in ("source", "route")) or (
            "n_repeat" in new
        )


CHANGED = [
    (
        main.RUNTIME,
        "    def on_state_activated(self, steps): ...",
        "    def on_state_activated(self, steps, reason): ...",
        "new required parameter reason",
    ),
    (
        main.RUNTIME,
        "    def get_steps_for_batch(self, batch_size): ...",
        "    def get_steps_for_batch(self, batch_size, num_tokens): ...",
        "AdaptiveSpecPolicy.get_steps_for_batch.*new required parameter num_tokens",
    ),
    (
        main.RUNTIME,
        "    def on_state_activated(self, steps): ...\n",
        "    def on_state_activated(self, steps): ...\n\n    def reset(self): ...\n",
        "AdaptiveSpecPolicy.reset.*does not implement it",
    ),
    (
        main.RUNTIME,
        "    def on_verify_complete(self, num_correct_drafts_per_req, batch_size, "
        "num_steps=None): ...",
        "    def on_verify_complete(self, num_correct_drafts_per_req, "
        "batch_size, num_steps=None, weights=None): ...",
        "on_verify_complete.*does not take",
    ),
    (
        main.RUNTIME,
        "def on_verify_complete(self, num_correct_drafts_per_req, batch_size, "
        "num_steps=None):\n        switch",
        "def on_verify_complete(self, num_correct_drafts_per_req, "
        "batch_size, num_steps=0):\n        switch",
        "default None is now 0",
    ),
    (
        main.RUNTIME,
        "def run_profiling(self, tree_cache, *, max_running_requests):",
        "def run_profiling(self, tree_cache, *, max_requests):",
        "run_profiling.*max_running_requests removed",
    ),
    (
        main.RUNTIME,
        "    n_measure: int\n",
        "    n_measure: int\n    n_repeat: int\n",
        "SpecProfilePlan has fields",
    ),
    (
        main.PARAMS,
        "def __init__(self, initial_steps, cfg_path=None):",
        "def __init__(self, initial_steps, cfg_path=None, tier=None):",
        "AdaptiveSpeculativeParams.__init__.*which av_core's replacement",
    ),
    (
        main.WORKER,
        "ThroughputAwarePolicy(\n                        initial_steps",
        "ThroughputAwareStrategy(\n                        initial_steps",
        "ThroughputAwareStrategy\\(.*a policy av_core does not replace",
    ),
]


@pytest.mark.parametrize(("module", "old", "new", "message"), CHANGED)
def test_a_changed_source_is_refused_by_name_and_nothing_patched(
    module: str, old: str, new: str, message: str, tmp_path: Path
) -> None:
    path = {
        main.RUNTIME: "adaptive_runtime_state.py",
        main.WORKER: "eagle_worker_v2.py",
        main.PARAMS: "adaptive_spec_params.py",
    }[module]
    files = dict(main.FILES)
    key = f"sglang/srt/speculative/{path}"
    assert files[key].count(old) == 1, old
    files[key] = files[key].replace(old, new)
    with main.importable(files, tmp_path) as modules:
        original = modules[main.WORKER].AdaptiveSpeculativeParams
        with pytest.raises(SglangCompatibilityError, match=message):
            av_sglang.install(cost_tables=gpu_like_tables(7), profile=True)
        assert modules[main.WORKER].AdaptiveSpeculativeParams is original
        assert av_sglang.installed() == []


def test_profiling_needs_sglangs_profiling_protocol(tmp_path: Path) -> None:
    files = dict(main.FILES)
    key = "sglang/srt/speculative/adaptive_runtime_state.py"
    text = files[key]
    # SGLang without start-up profiling (0.5.23): no profiling protocol, no run_profiling.
    text = text[: text.index("@runtime_checkable")] + text[text.index("def _broadcast") :]
    text = text[: text.index("    def run_profiling")] + text[text.index("    def _activate") :]
    files[key] = text
    with main.importable(files, tmp_path) as modules:
        with pytest.raises(SglangCompatibilityError, match="AdaptiveProfilingPolicy: not found"):
            av_sglang.install(cost_tables=gpu_like_tables(7), profile=True)
        assert av_sglang.installed() == []
        assert av_sglang.install(cost_tables=gpu_like_tables(7))  # tables alone still work
        del modules


def test_install_refuses_a_bad_profile_argument_and_profile_options_without_profiling(
    sglang: dict[str, ModuleType],
) -> None:
    with pytest.raises(TypeError, match="profile must be a bool"):
        av_sglang.install(profile="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not CostAwarePolicy options"):
        av_sglang.install(cost_tables=gpu_like_tables(5), profile=False, profile_seq_len=64)
    assert av_sglang.installed() == []


# --- the policy's own bookkeeping of main's two new inputs -------------------------------------


def test_num_steps_is_what_the_verdicts_are_learnt_with() -> None:
    """``num_steps`` (main's on_verify_complete) overrides both the choice and the activated
    state; before, the counts were read against the choice."""
    policy = CostAwarePolicy(gpu_like_tables(5), [1, 3, 5], initial_steps=3)
    recorder = Recorder(policy.estimator)
    policy._estimator = recorder  # type: ignore[assignment]
    chosen = policy.get_steps_for_batch(4)
    policy.on_state_activated(chosen)
    policy.on_verify_complete([1, 0, 1, 1], 4, num_steps=1)
    assert recorder.observed == [(4, [1, 1, 1, 1], [1, 0, 1, 1])]
    assert policy.counters.observed == 1


def test_on_state_activated_and_num_steps_refuse_bad_values_without_a_state_change() -> None:
    policy = CostAwarePolicy(gpu_like_tables(5), [1, 3, 5], initial_steps=3)
    policy.get_steps_for_batch(4)
    state = policy.estimator.to_bytes()
    for bad in (-1, 2.5, True, None):
        with pytest.raises((TypeError, ValueError), match="steps"):
            policy.on_state_activated(bad)  # type: ignore[arg-type]
    for bad in (-2, 1.0, "1"):
        with pytest.raises((TypeError, ValueError), match="num_steps"):
            policy.on_verify_complete([1, 1, 1, 1], 4, num_steps=bad)  # type: ignore[arg-type]
    assert policy.estimator.to_bytes() == state
    assert policy.counters.observed == policy.counters.unmatched == 0
    policy.on_verify_complete([1, 1, 1, 1], 4)  # the launch was not consumed by the refusals
    assert policy.counters.observed == 1


def test_record_profile_refuses_bad_measurements_by_name() -> None:
    policy = ProfilingCostAwarePolicy(None, [1, 3])
    for args, message in (
        ((0, 1, 2.0), "batch_size"),
        ((4, 2, 2.0), "steps"),
        ((4, 1, float("nan")), "avg_ms"),
        ((4, 1, -1.0), "avg_ms"),
        ((4, 1, "3"), "avg_ms"),
    ):
        with pytest.raises((TypeError, ValueError), match=message):
            policy.record_profile(*args)  # type: ignore[arg-type]
    assert policy.profile == {}
    with pytest.raises(TypeError, match="cost_tables"):
        CostAwarePolicy(None, [1, 3])  # type: ignore[arg-type]


def test_a_source_tree_without_a_version_installs_on_matching_interfaces(tmp_path: Path) -> None:
    """A checkout that does not say its version (no ``__version__``, no ``sglang.version``) is
    judged by its interfaces (before, reading its version raised)."""
    files = {**main.FILES, "sglang/__init__.py": ""}
    with main.importable(files, tmp_path):
        assert engine_version("sglang") == "unknown"
        report = av_sglang.interface_report(main_modules(), engine_version("sglang"))
        assert report.problems == []
        assert any("SGLang unknown is not one of the releases" in a for a in report.accepted)
        assert av_sglang.install(cost_tables=gpu_like_tables(5))


def main_modules() -> dict[str, ModuleType]:
    import sys

    return {name: sys.modules[name] for name in (main.RUNTIME, main.PARAMS, main.WORKER)}
