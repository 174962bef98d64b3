"""`av-core evaluate`: prequential replay, batch fits, decode-order regrouping and the command."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from av_core.tools.cli import main
from av_core.tools.evaluate import (
    ONLINE,
    RAW,
    Correlation,
    DraftRounds,
    evaluate_trace,
    fit_batch,
    replay_online,
)
from av_core.tools.trace import DraftTrace, write_trace


def synthetic_trace(
    num_requests: int = 6,
    num_steps: int = 40,
    k: int = 4,
    slope: float = 0.55,
    intercepts: tuple[float, ...] = (1.2, 0.8, 0.5, 0.1),
    seed: int = 0,
    interleave: bool = False,
) -> DraftTrace:
    """Full-verification trace whose labels follow sigmoid(slope * x + intercepts[k]).

    Rows are written request by request (or step-interleaved), positions in order.
    """
    rng = np.random.default_rng(seed)
    rows: dict[str, list[object]] = {
        name: []
        for name in (
            "request_id",
            "step",
            "position",
            "workload",
            "logit_q_max",
            "admitted",
            "label",
            "prompt_id",
            "entropy",
            "logit_q_sampled",
        )
    }
    order = [(r, s) for r in range(num_requests) for s in range(num_steps)]
    if interleave:
        order.sort(key=lambda rs: (rs[1], rs[0]))
    for r, s in order:
        x = rng.normal(1.0, 2.5, size=k)
        p = 1.0 / (1.0 + np.exp(-(slope * x + np.asarray(intercepts[:k]))))
        stopped = False
        for position in range(k):
            if stopped:
                label = -1
            else:
                label = int(rng.random() < p[position])
                stopped = label == 0
            rows["request_id"].append(r)
            rows["step"].append(s)
            rows["position"].append(position)
            rows["workload"].append("code" if r % 2 == 0 else "prose")
            rows["logit_q_max"].append(float(x[position]))
            rows["admitted"].append(True)
            rows["label"].append(label)
            rows["prompt_id"].append(f"p{r}")
            rows["entropy"].append(float(np.log1p(np.exp(-x[position]))))
            rows["logit_q_sampled"].append(float(x[position] - rng.exponential(0.5)))
    return DraftTrace(**{name: np.asarray(values) for name, values in rows.items()})  # type: ignore[arg-type]


def test_rounds_follow_first_appearance_and_count_leading_accepts() -> None:
    trace = synthetic_trace(num_requests=3, num_steps=5, interleave=True)
    rounds = DraftRounds.from_trace(trace)
    assert rounds.num_rounds == 15 and rounds.num_positions == 4
    # Interleaved file: step-major order survives.
    assert rounds.step.tolist() == [s for s in range(5) for _ in range(3)]
    assert rounds.request_id.tolist() == [r for _ in range(5) for r in range(3)]
    for i in range(rounds.num_rounds):
        mask = (trace.request_id == rounds.request_id[i]) & (trace.step == rounds.step[i])
        labels = trace.label[mask][np.argsort(trace.position[mask])].tolist()
        accepted = 0
        while accepted < len(labels) and labels[accepted] == 1:
            accepted += 1
        assert rounds.num_accepted[i] == accepted
        verified = accepted + (1 if accepted < len(labels) and labels[accepted] == 0 else 0)
        assert rounds.num_verified[i] == verified
        assert rounds.labels[i].tolist() == labels
    assert rounds.fully_verified


def test_a_drafts_own_label_never_changes_its_score() -> None:
    trace = synthetic_trace(num_requests=4, num_steps=60)
    rounds = DraftRounds.from_trace(trace)
    x = rounds.column(trace.logit_q_max)
    base = replay_online(rounds, x, refit_interval=1)
    target = 137  # a round whose first label we flip (a valid trace either way)
    flipped_labels = rounds.labels.copy()
    flipped_accepted = rounds.num_accepted.copy()
    flipped_verified = rounds.num_verified.copy()
    if rounds.labels[target, 0] == 1:
        flipped_labels[target] = [0, -1, -1, -1]
        flipped_accepted[target], flipped_verified[target] = 0, 1
    else:
        flipped_labels[target] = [1, 1, 1, 1]
        flipped_accepted[target], flipped_verified[target] = 4, 4
    perturbed = DraftRounds(
        **{
            **rounds.__dict__,
            "labels": flipped_labels,
            "num_accepted": flipped_accepted,
            "num_verified": flipped_verified,
        }
    )
    changed = replay_online(perturbed, x, refit_interval=1)
    # Up to and including the perturbed round, every score is identical ...
    np.testing.assert_array_equal(changed.predictions[: target + 1], base.predictions[: target + 1])
    # ... and the perturbation does reach later rounds (the replay is not frozen).
    assert not np.array_equal(changed.predictions[target + 1 :], base.predictions[target + 1 :])


def test_every_round_of_a_batch_is_scored_before_its_step_is_observed() -> None:
    trace = synthetic_trace(num_requests=4, num_steps=30)
    rounds = DraftRounds.from_trace(trace)
    x = rounds.column(trace.logit_q_max)
    replay = replay_online(rounds, x, refit_interval=1, batch_rounds=8)
    # Within the first batch nothing has been observed: cold-start coefficients for all 8.
    cold = 1.0 / (1.0 + np.exp(-(0.5 * x[:8].astype(np.float32) - 0.2)))
    np.testing.assert_allclose(replay.predictions[:8], cold, rtol=1e-5)
    assert replay.trajectory.rounds.tolist()[:3] == [8, 16, 24]


def test_batch_fit_matches_scikit_learn() -> None:
    linear_model = pytest.importorskip("sklearn.linear_model")
    rng = np.random.default_rng(3)
    n, k = 800, 3
    x = rng.normal(0.5, 2.0, n)
    positions = rng.integers(0, k, n)
    p = 1.0 / (1.0 + np.exp(-(0.6 * x + np.array([0.9, 0.1, -0.4])[positions])))
    y = (rng.random(n) < p).astype(np.int64)
    fit = fit_batch(x, positions, y, k, l2=1.0)
    design = np.column_stack([x, np.eye(k)[positions]])
    model = linear_model.LogisticRegression(C=1.0, fit_intercept=False, tol=1e-12, max_iter=10000)
    model.fit(design, y)
    assert fit.converged
    np.testing.assert_allclose(
        np.r_[fit.slope, fit.intercepts], model.coef_[0], rtol=1e-5, atol=1e-6
    )


def test_correlation_against_numpy() -> None:
    a, b = [1.0, 2.0, 3.0, 4.0, 5.0], [2.0, 1.0, 4.0, 3.0, 6.0]
    corr = Correlation.of(a, b)
    assert corr.r == pytest.approx(np.corrcoef(a, b)[0, 1])
    assert corr.low < corr.r < corr.high
    assert math.isnan(Correlation.of([1.0, 2.0], [3.0, 3.0]).r)


def test_evaluation_scores_every_label_and_the_online_fit_calibrates() -> None:
    trace = synthetic_trace(
        num_requests=8, num_steps=150, slope=0.5, intercepts=(1.5, 1.0, 0.5, 0.0)
    )
    evaluation = evaluate_trace(trace, refit_interval=20)
    labeled = int(trace.labeled.sum())
    assert evaluation.num_labeled == labeled
    online = evaluation.feature(ONLINE).report
    raw = evaluation.feature(RAW).report
    assert online.overall.count == labeled
    # Raw q_max is sigmoid(x) exactly, no fit involved.
    x = trace.logit_q_max[trace.labeled]
    assert raw.overall.mean_predicted == pytest.approx(float(np.mean(1 / (1 + np.exp(-x)))))
    # Labels follow sigmoid(0.5 x + b_k) with b_k != 0: raw q_max is miscalibrated, the fit is not.
    assert online.overall.ece < raw.overall.ece
    assert online.overall.log_loss < raw.overall.log_loss
    # Per-workload batch fits recover the shared slope.
    for fit in evaluation.workloads:
        assert fit.fit.slope == pytest.approx(0.5, abs=0.12)
    assert evaluation.feature("logit(q_sampled), online [LOSSY]").lossy
    text = evaluation.to_text()
    assert "per-position AUC" in text and "batch fit per workload" in text


def test_evaluate_command_prints_the_tables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "trace.csv"
    write_trace(synthetic_trace(num_requests=4, num_steps=40), path)
    assert main(["evaluate", str(path), "--no-plots", "--refit-interval", "10"]) == 0
    out = capsys.readouterr().out
    assert ONLINE in out and RAW in out and "rounds of 10 observes" in out
