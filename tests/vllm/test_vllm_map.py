"""The vLLM drop-in on av_core's own update (``update="map"`` / ``AV_CORE_VLLM_ESTIMATOR=map``):
opt-in only, its schedule (fits after the 1st, 2nd, 4th, ... step of a round and at its end, run
by the drop-in on its one-step-lag schedule), the same bits as the native map update fed the same
verdicts, and states moved between the updates."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from av_core import AcceptanceEstimator  # noqa: E402
from av_core.vllm import ENV_ESTIMATOR, OnlineAcceptanceEstimator  # noqa: E402

CPU = torch.device("cpu")


def fill_slots(est: OnlineAcceptanceEstimator, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    shape = est.features.shape
    est.features.copy_(torch.randn(shape, generator=gen) * 3)
    est.predictions.copy_(torch.rand(shape, generator=gen) * 0.98 + 0.01)


def grade(est: OnlineAcceptanceEstimator, seed: int, rows: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    k = est.num_speculative_steps
    slots = torch.randperm(est.max_num_reqs, generator=gen)[:rows].to(torch.int32)
    admitted = torch.randint(0, k + 1, (rows,), generator=gen)
    accepted = (torch.rand(rows, generator=gen) * (admitted + 1)).floor().long().clamp(max=admitted)
    return {
        "idx_mapping": slots,
        "num_sampled": (accepted + 1).to(torch.int32),
        "num_rejected": (admitted - accepted).to(torch.int32),
    }


def native_rows(est: OnlineAcceptanceEstimator, batch: dict[str, torch.Tensor]) -> tuple[Any, ...]:
    """The rows the drop-in observes for one graded batch, in the native estimator's terms."""
    slots = batch["idx_mapping"].numpy().astype(np.int64)
    accepted = np.maximum(batch["num_sampled"].numpy().astype(np.int64) - 1, 0)
    admitted = np.minimum(accepted + batch["num_rejected"].numpy().astype(np.int64), 4)
    keep = admitted > 0
    x = est.features.numpy()[slots[keep]]
    return x, admitted[keep], np.minimum(accepted, admitted)[keep]


def test_the_drop_in_keeps_vllms_update_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_ESTIMATOR, raising=False)
    assert OnlineAcceptanceEstimator(8, 4, CPU).update == "vllm"
    assert OnlineAcceptanceEstimator(8, 4, CPU)._native.update == "vllm"
    assert OnlineAcceptanceEstimator(8, 4, CPU, update="map")._native.update == "map"
    monkeypatch.setenv(ENV_ESTIMATOR, "map")
    est = OnlineAcceptanceEstimator(8, 4, CPU)
    assert est.update == "map" and est._native.memory == AcceptanceEstimator(4, update="map").memory
    assert OnlineAcceptanceEstimator(8, 4, CPU, update="vllm").update == "vllm"
    # Built without the plugin's check, a value the variable does not take is a warning and
    # vLLM's update (docs/settings.md); the plugin refuses it before patching (test_edges.py).
    monkeypatch.setenv(ENV_ESTIMATOR, "newton")
    assert OnlineAcceptanceEstimator(8, 4, CPU).update == "vllm"
    with pytest.raises(ValueError, match="exact"):
        OnlineAcceptanceEstimator(8, 4, CPU, update="map", exact=True)


def test_the_map_drop_in_fits_on_the_doubling_schedule_with_the_natives_bits() -> None:
    est = OnlineAcceptanceEstimator(32, 4, CPU, update="map")
    est.REFIT_INTERVAL = 10
    # The same schedule, run natively.
    native = AcceptanceEstimator(4, refit_interval=10, update="map")
    fill_slots(est, 4)
    refits = []
    for seed in range(23):
        batch = grade(est, 100 + seed, rows=12)
        native.observe(*native_rows(est, batch))
        est.step(**batch)
        refits.append(est.num_refits)
        assert est.slope.item() == np.float32(native.slope)
        np.testing.assert_array_equal(est.intercepts.numpy(), native.intercepts.astype(np.float32))
    # Steps 1, 2, 4, 8 and 10 of each round of 10; then 1 and 2 of the third.
    assert refits[-1] == native.num_refits == 5 + 5 + 2
    assert est.steps_since_refit == 3
    assert est.host_coefficients[0] == native.slope


def test_a_state_saved_under_vllms_update_resumes_under_map_with_its_coefficients() -> None:
    vllm = OnlineAcceptanceEstimator(16, 3, CPU)
    vllm.REFIT_INTERVAL = 3
    fill_slots(vllm, 1)
    for seed in range(7):
        vllm.step(**grade(vllm, seed, rows=8))
    state = vllm.state_dict()
    mapped = OnlineAcceptanceEstimator(16, 3, CPU, update="map")
    mapped.load_state_dict(state)
    assert mapped._native.update == "map"
    assert mapped.host_coefficients[0] == vllm.host_coefficients[0]
    np.testing.assert_array_equal(mapped.host_coefficients[1], vllm.host_coefficients[1])
    # And the way back keeps them too.
    back = OnlineAcceptanceEstimator(16, 3, CPU)
    back.load_state_dict(mapped.state_dict())
    assert back._native.update == "vllm"
    np.testing.assert_array_equal(back.host_coefficients[1], vllm.host_coefficients[1])
