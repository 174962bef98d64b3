"""Speed of the verification planner against numpy implementations of the same host math.

``plan_verification`` (budget from the previous step's confidences, assignment from the current
ones: what a scheduler calls every decode step) against numpy doing what vLLM 0.33.0 does in
Python for the budget (float64 cumprod, mask, full sort, cumsum, argmax) plus the assignment
(stable depth-major argsort, top ``budget``, counts per request), at R in {8, 64, 256, 1024} and
K in {4, 8, 16}; the same with the budget from the current confidences; and the growth of the
call with R at K = 8 (fitted exponent against N = R·K; a sort-based plan would be ``N log N``).
Every av_core time is paired with the numpy reference timed interleaved in the same run. The
calls spell their keyword arguments out, as a scheduler would; merging a ``**kwargs`` dict into
each call, as these benchmarks once did, adds about 0.3 µs that is the benchmark's, not the
call's.

The stateful ``VerificationPlanner.plan`` (the call the README shows: gather each slot's
remembered confidences for the budget, plan, store this step's confidences for the next step,
and the exploration floor's draws) is timed against numpy doing the same gather, host math and
store.

Drafting depth (``choose_draft_depth``, batch and per-request modes) is timed against numpy
doing the same decision (for each depth, the budget search above over the slots at shallower
positions), and the whole per-step planning (depth, then budget and assignment) against the sum
of the two numpy references.

The whole decode step a serving engine runs on its critical path, through the public API:
``VerificationPlanner.choose_draft_depth`` (batch mode), ``AcceptanceEstimator.predict``,
``VerificationPlanner.plan`` (budget from the previous step) and ``AcceptanceEstimator.observe``
(the default update, refits included as its schedule runs them), at R in {64, 256, 1024} and K
in {4, 8, 16}, against numpy doing the same math (the depth search above on the remembered
confidences, the sigmoid, vLLM's host budget and the assignment, the remembered confidences
stored, the map update's binning), and against one ``predict`` timed in the same run: the
``whole step`` rows give the speedup over numpy, the ``whole step / predict`` rows the step's
cost in units of one ``predict``.

Targets: plan at R = 256, K = 8 (stateless and stateful) >= 10x faster than numpy and <= 5 us;
the issue on drafting depth holds depth + budget + assignment to the same latency target. The
whole step at R = 256, K = 8: >= 30x numpy and <= 3 times one ``predict``.

    python benches/bench_planner.py [--quick] [--json PATH] [--only GLOB ...]

``run(quick, only)`` and ``scaling(quick, only)`` return the rows for ``benches/run.py``;
``only(name)`` says whether a row is wanted (a group of rows is timed only if one of its rows
is).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
from collections.abc import Callable
from typing import Any

import numpy as np
from bench_estimator import numpy_observe_map, numpy_predict
from timing import summary, timed

from av_core import (
    AcceptanceEstimator,
    CostTables,
    VerificationPlanner,
    choose_draft_depth,
    plan_verification,
)

TARGET_US = 5.0
TARGET_SPEEDUP = 10.0
#: The whole step at R = 256, K = 8: at least this many times faster than numpy ...
STEP_TARGET_SPEEDUP = 30.0
#: ... and at most this many times one ``predict``.
STEP_TARGET_PREDICTS = 3.0
MAX_REQS = 4096
MAX_TOKENS = MAX_REQS * 17


def profiled_tables() -> CostTables:
    """A typical profile: cudagraphs captured up to 512 tokens (a step function there), eager
    and piecewise above it, draft cost growing with the batch."""
    capture = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    verify = [(n, 6.0 + 0.004 * n) for n in capture]
    verify += [(n, 7.0 + 0.012 * n) for n in (768, 1024, 2048, 4096, 8192, 16384, 32768)]
    draft = [(n, 1.0 + 0.002 * n) for n in (1, 8, 64, 256, 1024, 4096)]
    return CostTables.from_curves(
        draft, verify, max_num_reqs=MAX_REQS, max_batch_tokens=MAX_TOKENS, cudagraph_limit=512
    )


def workload(rows: int, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Float32 acceptance probabilities as an estimator predicts them (mostly 0.5-0.95), this
    step's and the previous step's, and every request scheduling all K drafts."""
    rng = np.random.default_rng(seed)
    current = rng.beta(5.0, 1.5, size=(rows, k)).astype(np.float32)
    previous = rng.beta(5.0, 1.5, size=(rows, k)).astype(np.float32)
    return current, previous, np.full(rows, k, np.int64)


def numpy_plan(
    confidences: np.ndarray,
    budget_confidences: np.ndarray,
    scheduled: np.ndarray,
    t: int,
    s: int,
    draft_ms: np.ndarray,
    verify_ms: np.ndarray,
    draft_cost: float | None = None,
) -> tuple[int, np.ndarray]:
    """vLLM's host budget math, then the assignment, in numpy. The step's drafting costs
    ``draft_ms[R]`` (vLLM's constant) unless ``draft_cost`` says otherwise (the cost of the
    depths drafted, with a draft-depth table)."""
    rows, k = confidences.shape
    valid = np.arange(k)[None, :] < scheduled[:, None]
    scores = np.sort(np.cumprod(budget_confidences.astype(np.float64), axis=1)[valid])[::-1]
    max_budget = int(scheduled.sum())
    expected = np.concatenate(([s], s + np.cumsum(scores)))
    drafting = draft_ms[rows] if draft_cost is None else draft_cost
    costs = drafting + verify_ms[t : t + max_budget + 1]
    budget = int(np.argmax(expected / costs))
    survival = np.where(valid, np.cumprod(confidences.astype(np.float64), axis=1), -np.inf)
    order = np.argsort(-survival.T.ravel(), kind="stable")[:budget]
    admitted = np.bincount(order % rows, minlength=rows).astype(np.int32)
    return budget, admitted


def row(
    name: str, samples: dict[str, list[float]], targeted: bool, group: str = "planner"
) -> dict[str, Any]:
    median, q1, q3 = summary(samples["av_core"])
    reference, _, _ = summary(samples["numpy"])
    speedup = reference / median
    return {
        "group": group,
        "name": name,
        "median_us": median,
        "q1_us": q1,
        "q3_us": q3,
        "reference": "numpy, vLLM's host math + assignment",
        "reference_median_us": reference,
        "speedup": speedup,
        "target": f">= {TARGET_SPEEDUP:g}x and <= {TARGET_US:g} us" if targeted else None,
        "pass": (speedup >= TARGET_SPEEDUP and median <= TARGET_US) if targeted else None,
    }


def plan_rows(r: int, k: int, tables: CostTables, repeats: int, inner: int) -> list[dict[str, Any]]:
    current, previous, scheduled = workload(r, k)
    draft_ms, verify_ms = tables.draft_ms, tables.verify_ms
    kwargs = {"num_non_draft_tokens": r, "num_sampling_requests": r, "cost_tables": tables}
    ours = plan_verification(current, scheduled, budget_confidences=previous, **kwargs)
    budget, admitted = numpy_plan(current, previous, scheduled, r, r, draft_ms, verify_ms)
    if ours.budget != budget or not np.array_equal(ours.admitted, admitted):
        raise AssertionError(f"R={r} K={k}: av_core and numpy disagree")
    previous_samples = timed(
        {
            "av_core": lambda: plan_verification(
                current,
                scheduled,
                num_non_draft_tokens=r,
                num_sampling_requests=r,
                cost_tables=tables,
                budget_confidences=previous,
            ),
            "numpy": lambda: numpy_plan(current, previous, scheduled, r, r, draft_ms, verify_ms),
        },
        repeats,
        inner,
    )
    current_samples = timed(
        {
            "av_core": lambda: plan_verification(
                current,
                scheduled,
                num_non_draft_tokens=r,
                num_sampling_requests=r,
                cost_tables=tables,
            ),
            "numpy": lambda: numpy_plan(current, current, scheduled, r, r, draft_ms, verify_ms),
        },
        repeats,
        inner,
    )
    return [
        row(f"plan R={r} K={k}", previous_samples, (r, k) == (256, 8)),
        row(f"plan (budget from current) R={r} K={k}", current_samples, False),
    ]


class NumpyStatefulPlanner:
    """The stateful planner in numpy: remembered confidences per slot (1.0 for a new request),
    the budget from them, the assignment from the current ones, then this step's stored."""

    def __init__(self, slots: int, k: int, tables: CostTables) -> None:
        self.previous = np.ones((slots, k))
        self.draft_ms, self.verify_ms = tables.draft_ms, tables.verify_ms

    def plan(
        self, slots: np.ndarray, confidences: np.ndarray, scheduled: np.ndarray
    ) -> tuple[int, np.ndarray]:
        r = len(slots)
        budget, admitted = numpy_plan(
            confidences, self.previous[slots], scheduled, r, r, self.draft_ms, self.verify_ms
        )
        drafted = np.arange(confidences.shape[1])[None, :] < scheduled[:, None]
        self.previous[slots] = np.where(drafted, confidences, self.previous[slots])
        return budget, admitted


def stateful_rows(
    r: int, k: int, tables: CostTables, repeats: int, inner: int
) -> list[dict[str, Any]]:
    """``VerificationPlanner.plan`` as the README calls it, alternating two steps' confidences
    (so every budget reads the other step's), against :class:`NumpyStatefulPlanner`."""
    current, previous, scheduled = workload(r, k)
    slots = np.arange(r, dtype=np.int64)
    check = VerificationPlanner(tables, k, num_slots=r, exploration=0.0)
    reference = NumpyStatefulPlanner(r, k, tables)
    for confidences in (previous, current, previous):
        ours = check.plan(
            slots, confidences, scheduled, num_non_draft_tokens=r, num_sampling_requests=r
        )
        budget, admitted = reference.plan(slots, confidences, scheduled)
        if ours.budget != budget or not np.array_equal(ours.admitted, admitted):
            raise AssertionError(f"R={r} K={k}: stateful av_core and numpy disagree")
    planner = VerificationPlanner(tables, k, num_slots=r)  # default exploration, as in README
    steps = [current, previous]
    state = {"i": 0}

    def ours_step() -> None:
        state["i"] ^= 1
        planner.plan(
            slots, steps[state["i"]], scheduled, num_non_draft_tokens=r, num_sampling_requests=r
        )

    def numpy_step() -> None:
        state["i"] ^= 1
        reference.plan(slots, steps[state["i"]], scheduled)

    samples = timed({"av_core": ours_step, "numpy": numpy_step}, repeats, inner)
    result = row(f"VerificationPlanner.plan R={r} K={k}", samples, (r, k) == (256, 8))
    result["reference"] = "numpy, remembered confidences + vLLM's host math + assignment"
    return [result]


def numpy_depth_cost(depths: np.ndarray, tables: CostTables) -> float:
    """The drafting cost of requests drafting ``depths[r]`` positions: pass ``j`` runs over the
    ``R_j`` requests drafting at least ``j`` and costs ``draft_ms[R_j]`` times its share of the
    depth table."""
    shape = tables.draft_depth_ms
    assert shape is not None
    k = len(shape) - 1
    fractions = np.asarray(shape) / shape[-1]
    at_least = np.cumsum(np.bincount(depths, minlength=k + 1)[::-1])[::-1][1:]
    shares = np.diff(fractions)
    cost = 0.0
    for rows, share in zip(at_least, shares, strict=True):
        if rows > 0:
            cost += tables.draft_ms[rows] * share
    return cost


def numpy_depth(previous: np.ndarray, caps: np.ndarray, t: int, s: int, tables: CostTables) -> int:
    """Batch-mode depth in numpy: for every depth, vLLM's budget search over the shallower
    slots with the depth-priced drafting cost (requests capped below the depth drafting only
    their cap); the first best depth."""
    rows, k = previous.shape
    survival = np.cumprod(previous.astype(np.float64), axis=1)
    verify = tables.verify_ms
    best_depth, best = 0, s / verify[t]
    for d in range(1, k + 1):
        depths = np.minimum(caps, d)
        valid = np.arange(k)[None, :] < depths[:, None]
        scores = np.sort(survival[valid])[::-1]
        expected = np.concatenate(([s], s + np.cumsum(scores)))
        draft = numpy_depth_cost(depths, tables)
        ratio = expected / (draft + verify[t : t + scores.size + 1])
        if ratio.max() > best:
            best_depth, best = d, float(ratio.max())
    return best_depth


def depth_rows(
    r: int, k: int, tables: CostTables, repeats: int, inner: int
) -> list[dict[str, Any]]:
    current, previous, scheduled = workload(r, k)
    tables = tables.with_draft_depth("autoregressive", max_depth=k)
    draft_ms, verify_ms = tables.draft_ms, tables.verify_ms
    kwargs = {"num_non_draft_tokens": r, "num_sampling_requests": r, "cost_tables": tables}
    ours = choose_draft_depth(previous, scheduled, **kwargs)
    if ours.max_depth != numpy_depth(previous, scheduled, r, r, tables):
        raise AssertionError(f"R={r} K={k}: depth decisions disagree")
    depth_samples = timed(
        {
            "av_core": lambda: choose_draft_depth(
                previous,
                scheduled,
                num_non_draft_tokens=r,
                num_sampling_requests=r,
                cost_tables=tables,
            ),
            "numpy": lambda: numpy_depth(previous, scheduled, r, r, tables),
        },
        repeats,
        inner,
    )
    per_request = timed(
        {
            "av_core": lambda: choose_draft_depth(
                previous,
                scheduled,
                num_non_draft_tokens=r,
                num_sampling_requests=r,
                cost_tables=tables,
                mode="per_request",
            ),
            "numpy": lambda: numpy_depth(previous, scheduled, r, r, tables),
        },
        repeats,
        inner,
    )

    def ours_step() -> None:
        depth = choose_draft_depth(
            previous,
            scheduled,
            num_non_draft_tokens=r,
            num_sampling_requests=r,
            cost_tables=tables,
        )
        plan_verification(
            current,
            depth.depths,
            num_non_draft_tokens=r,
            num_sampling_requests=r,
            cost_tables=tables,
            budget_confidences=previous,
        )

    def numpy_step() -> None:
        d = numpy_depth(previous, scheduled, r, r, tables)
        numpy_plan(current, previous, np.minimum(scheduled, d), r, r, draft_ms, verify_ms)

    step_samples = timed({"av_core": ours_step, "numpy": numpy_step}, repeats, inner)
    targeted = (r, k) == (256, 8)
    depth_row = row(f"depth R={r} K={k}", depth_samples, False, group="depth")
    per_request_row = row(f"depth (per request) R={r} K={k}", per_request, False, group="depth")
    step_row = row(f"depth + plan R={r} K={k}", step_samples, targeted, group="depth")
    for entry in (depth_row, per_request_row, step_row):
        entry["reference"] = "numpy, the same depth search (+ vLLM's host plan)"
    per_request_row["reference"] = "numpy batch-mode depth search (no per-request numpy version)"
    return [depth_row, per_request_row, step_row]


class NumpyStep:
    """One decode step in numpy, as a serving engine runs it: the batch depth from the remembered
    confidences, the sigmoid of the features, vLLM's host budget from the remembered
    confidences and the assignment from the current ones, this step's confidences remembered,
    and the map update's binning of the verdicts."""

    def __init__(self, slots: int, k: int, tables: CostTables, estimator: AcceptanceEstimator):
        self.previous = np.ones((slots, k))
        self.tables, self.k = tables, k
        self.draft_ms, self.verify_ms = tables.draft_ms, tables.verify_ms
        self.slope, self.intercepts = estimator.slope, np.asarray(estimator.intercepts)

    def step(
        self,
        slots: np.ndarray,
        caps: np.ndarray,
        x: np.ndarray,
        accepted: np.ndarray,
        p: np.ndarray | None = None,
    ) -> tuple[np.ndarray, int, np.ndarray]:
        """One step: the depths, the budget and the admitted counts (``p``, when given, stands
        for the sigmoid's predictions)."""
        r = len(slots)
        remembered = self.previous[slots]
        depth = numpy_depth(remembered, caps, r, r, self.tables)
        depths = np.minimum(caps, depth)
        if p is None:
            p = numpy_predict(x, self.slope, self.intercepts)
        budget, admitted = numpy_plan(
            p,
            remembered,
            depths,
            r,
            r,
            self.draft_ms,
            self.verify_ms,
            draft_cost=numpy_depth_cost(depths, self.tables),
        )
        drafted = np.arange(self.k)[None, :] < depths[:, None]
        self.previous[slots] = np.where(drafted, p, remembered)
        numpy_observe_map(x, admitted, np.minimum(accepted, admitted), self.k)
        return depths, budget, admitted


class StepWorkload:
    """The whole-step workload: R requests of K positions in slots ``0..R``, features
    alternating between two draws (mean 1.5, sd 2), fixed accepted counts, the default
    estimator and a planner with the default exploration (as in the README)."""

    def __init__(self, r: int, k: int, tables: CostTables) -> None:
        self.r, self.k = r, k
        self.tables = tables.with_draft_depth("autoregressive", max_depth=k)
        rng = np.random.default_rng(1)
        self.features = [rng.normal(1.5, 2.0, size=(r, k)).astype(np.float32) for _ in range(2)]
        self.accepted = rng.integers(0, k + 1, size=r).astype(np.int64)
        self.slots = np.arange(r, dtype=np.int64)
        self.caps = np.full(r, k, np.int64)
        self.estimator = AcceptanceEstimator(k)
        self.planner = VerificationPlanner(self.tables, k, num_slots=r)
        self.i = 0

    def step(self) -> None:
        """The four public calls of one decode step, on the next of the two feature draws."""
        self.i ^= 1
        x, r = self.features[self.i], self.r
        depth = self.planner.choose_draft_depth(
            self.slots, self.caps, num_non_draft_tokens=r, num_sampling_requests=r
        )
        p = self.estimator.predict(x)
        plan = self.planner.plan(
            self.slots, p, depth.depths, num_non_draft_tokens=r, num_sampling_requests=r
        )
        admitted = plan.admitted
        self.estimator.observe(x, admitted, np.minimum(self.accepted, admitted), p)


def step_rows(r: int, k: int, tables: CostTables, repeats: int, inner: int) -> list[dict[str, Any]]:
    """The four public calls of one decode step in sequence against :class:`NumpyStep`, and
    one ``predict`` timed in the same run."""
    work = StepWorkload(r, k, tables)
    features, accepted, slots, caps = work.features, work.accepted, work.slots, work.caps
    estimator = work.estimator
    reference = NumpyStep(r, k, work.tables, estimator)
    state = {"i": 0}

    def ours_step() -> None:
        work.step()
        state["i"] = work.i

    def numpy_step() -> None:
        reference.step(slots, caps, features[state["i"]], accepted)

    samples = timed(
        {
            "av_core": ours_step,
            "numpy": numpy_step,
            "predict": lambda: estimator.predict(features[0]),
        },
        repeats,
        inner,
    )
    step_us, q1, q3 = summary(samples["av_core"])
    predict_us, _, _ = summary(samples["predict"])
    targeted = (r, k) == (256, 8)
    step = row(f"whole step R={r} K={k}", samples, False, group="step")
    step["reference"] = "numpy, the same math (depth, sigmoid, vLLM's plan, binning)"
    step["target"] = f">= {STEP_TARGET_SPEEDUP:g}x" if targeted else None
    step["pass"] = step["speedup"] >= STEP_TARGET_SPEEDUP if targeted else None
    step["predict_us"] = predict_us
    ratio = step_us / predict_us
    per_predict = {
        "group": "step",
        "name": f"whole step / predict R={r} K={k}",
        "median_us": step_us,
        "q1_us": q1,
        "q3_us": q3,
        "reference": "one predict, the same run",
        "reference_median_us": predict_us,
        "ratio": ratio,
        "target": f"<= {STEP_TARGET_PREDICTS:g}" if targeted else None,
        "pass": ratio <= STEP_TARGET_PREDICTS if targeted else None,
    }
    return [step, per_predict]


#: A row filter: whether a row of this name is wanted.
Only = Callable[[str], bool]


def matching(patterns: list[str] | None) -> Only:
    """The filter of shell-style row-name patterns (everything when there are none)."""
    if not patterns:
        return lambda name: True
    return lambda name: any(fnmatch.fnmatchcase(name, p) for p in patterns)


def wanted(only: Only, *names: str) -> bool:
    return any(only(name) for name in names)


def run(quick: bool = False, only: Only | None = None) -> list[dict[str, Any]]:
    only = only or matching(None)
    repeats, inner = (7, 50) if quick else (21, 200)
    tables = profiled_tables()
    rows: list[dict[str, Any]] = []

    def inner_for(r: int) -> int:
        return max(5, inner * 256 // max(r, 256))

    for k in (4, 8, 16):
        for r in (8, 64, 256, 1024):
            if wanted(only, f"plan R={r} K={k}", f"plan (budget from current) R={r} K={k}"):
                rows += plan_rows(r, k, tables, repeats, inner_for(r))
    for r in (8, 64, 256, 1024):
        if wanted(only, f"VerificationPlanner.plan R={r} K=8"):
            rows += stateful_rows(r, 8, tables, repeats, inner_for(r))
    for r in (64, 256, 1024):
        names = (f"depth R={r} K=8", f"depth (per request) R={r} K=8", f"depth + plan R={r} K=8")
        if wanted(only, *names):
            rows += depth_rows(r, 8, tables, repeats, inner_for(r))
    for k in (4, 8, 16):
        for r in (64, 256, 1024):
            if wanted(only, f"whole step R={r} K={k}", f"whole step / predict R={r} K={k}"):
                rows += step_rows(r, k, tables, repeats, inner_for(r * k // 8))
    return [row for row in rows if only(row["name"])]


def plan_time(r: int, tables: CostTables, repeats: int, inner: int) -> float:
    current, previous, scheduled = workload(r, 8)
    samples = timed(
        {
            "av_core": lambda: plan_verification(
                current,
                scheduled,
                num_non_draft_tokens=r,
                num_sampling_requests=r,
                cost_tables=tables,
                budget_confidences=previous,
            )
        },
        repeats,
        inner,
    )
    return summary(samples["av_core"])[0]


def scaling(quick: bool = False, only: Only | None = None) -> list[dict[str, Any]]:
    """Cost per call against R at K = 8, and the fitted exponent in N = R·K (R >= 128)."""
    sizes = (8, 32, 128, 512, 2048, 4096)
    if only is not None and not wanted(only, *(f"plan R={r} K=8" for r in sizes)):
        return []
    repeats, inner = (5, 20) if quick else (11, 50)
    tables = profiled_tables()
    times = [plan_time(r, tables, repeats, max(3, inner * 256 // max(r, 256))) for r in sizes]
    big = [i for i, r in enumerate(sizes) if r >= 128]
    n = [sizes[i] * 8 for i in big]
    exponent = float(np.polyfit(np.log(n), np.log([times[i] for i in big]), 1)[0])
    # N log N between the smallest and largest fitted sizes, as an exponent on N.
    n_log_n = float(np.log(n[-1] * np.log(n[-1]) / (n[0] * np.log(n[0]))) / np.log(n[-1] / n[0]))
    return [
        {
            "group": "scaling",
            "name": f"plan R={r} K=8",
            "R": r,
            "median_us": t,
            "growth_exponent": exponent,
            "n_log_n_exponent": n_log_n,
            "pass": exponent <= n_log_n,
        }
        for r, t in zip(sizes, times, strict=True)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json")
    parser.add_argument(
        "--only", action="append", metavar="GLOB", help="rows whose name matches (repeatable)"
    )
    args = parser.parse_args()
    only = matching(args.only)
    rows = run(args.quick, only)
    print(f"{'call':44} {'median us':>10} {'IQR us':>15} {'ref us':>10} {'figure':>8}  target")
    for r in rows:
        verdict = "" if r["target"] is None else ("PASS" if r["pass"] else "MISS")
        figure = f"{r['speedup']:7.1f}x" if "speedup" in r else f"{r['ratio']:7.2f} "
        print(
            f"{r['name']:44} {r['median_us']:10.2f} {r['q1_us']:7.2f}-{r['q3_us']:<7.2f}"
            f" {r['reference_median_us']:10.2f} {figure}  {verdict}"
            f" {r['target'] or ''}"
        )
    growth = scaling(args.quick, only if args.only else None)
    if growth:
        print("\ngrowth with R at K = 8:")
        for r in growth:
            print(f"  R={r['R']:5d} {r['median_us']:9.2f} us")
        exponent, bound = growth[0]["growth_exponent"], growth[0]["n_log_n_exponent"]
        verdict = "PASS" if growth[0]["pass"] else "MISS"
        print(f"  fitted exponent {exponent:.2f} in N = R*K (N log N here: {bound:.2f}) {verdict}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows + growth, f, indent=1)


if __name__ == "__main__":
    main()
