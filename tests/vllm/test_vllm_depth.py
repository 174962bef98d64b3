"""av_core.vllm.depth.DraftDepthHook and the plugin's drafting-depth wiring, on stand-ins for
vLLM's classes (the released signatures are checked in tests/vllm/test_vllm_contract.py)."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from av_core import CostTables, SettingError
from av_core.vllm import plugin as vllm_plugin
from av_core.vllm.depth import DraftDepthHook

K = 4


def tables(draft_pass_ms: float = 0.6, max_reqs: int = 64) -> CostTables:
    verify = 6.0 + np.maximum(0, np.arange(max_reqs * (K + 1) + 1) - 32) * 0.5
    draft = np.r_[0.0, np.full(max_reqs, K * draft_pass_ms)]
    return CostTables(draft, verify).with_draft_depth("autoregressive", max_depth=K)


def test_hook_drafts_deep_when_cheap_and_stops_when_hopeless() -> None:
    hook = DraftDepthHook(tables(), 64, K, exploration=0.0)
    slots = np.array([3, 9])
    assert (
        hook.num_speculative_tokens(slots, limit=K, num_non_draft_tokens=2, num_sampling_requests=2)
        == K
    )  # fresh slots: optimistic 1.0
    hook.record(slots, np.full((2, K), 0.02), K)
    assert (
        hook.num_speculative_tokens(slots, limit=K, num_non_draft_tokens=2, num_sampling_requests=2)
        == 0
    )
    hook.add_request(9)  # a new request in slot 9: optimistic again
    np.testing.assert_array_equal(hook.remembered(9), np.ones(K))
    assert (
        hook.num_speculative_tokens(slots, limit=2, num_non_draft_tokens=2, num_sampling_requests=2)
        == 2
    )  # capped by the scheduler's own count


def test_record_keeps_undrafted_positions_and_validates_first() -> None:
    hook = DraftDepthHook(tables(), 8, K, exploration=0.0)
    hook.record([1, 2], [[0.5] * K, [0.25] * K], [2, 0])
    np.testing.assert_array_equal(hook.remembered(1), [0.5, 0.5, 1.0, 1.0])
    np.testing.assert_array_equal(hook.remembered(2), np.ones(K))
    before = [hook.remembered(s) for s in range(8)]
    for args, argument in (
        (([1, 8], np.full((2, K), 0.5), K), "idx_mapping"),
        (([1, 1], np.full((2, K), 0.5), K), "idx_mapping"),
        (([1, 2], np.full((2, K - 1), 0.5), K), "confidences"),
        (([1, 2], np.full((2, K), 1.5), K), "confidences"),
        (([1, 2], np.full((2, K), 0.5), K + 1), "num_drafted"),
    ):
        with pytest.raises(ValueError, match=argument):
            hook.record(*args)
    assert all(np.array_equal(a, hook.remembered(s)) for s, a in enumerate(before))
    # A torch tensor is accepted (copied to the host once).
    hook.record(torch.tensor([3]), torch.full((1, K), 0.75), K)
    np.testing.assert_array_equal(hook.remembered(3), np.full(K, 0.75))


def test_hook_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="cost_tables"):
        DraftDepthHook(CostTables([0.0, 1.0], [1.0] * 9), 8, K)
    with pytest.raises(ValueError, match="cost_tables"):
        DraftDepthHook(tables().with_draft_depth("parallel", max_depth=2), 8, K)
    with pytest.raises(TypeError, match="cost_tables"):
        DraftDepthHook((np.zeros(2), np.ones(9)), 8, K)  # type: ignore[arg-type]
    for kwargs, argument in (
        ({"mode": "deep"}, "mode"),
        ({"exploration": 2.0}, "exploration"),
    ):
        with pytest.raises(ValueError, match=argument):
            DraftDepthHook(tables(), 8, K, **kwargs)  # type: ignore[arg-type]


def test_per_request_mask_marks_positions_past_each_depth() -> None:
    # Every verified token costs 0.5 ms, every request in the drafter's batch 0.1 ms a pass.
    costs = CostTables(np.arange(9) * 0.1 * K, 6.0 + 0.5 * np.arange(8 * (K + 1) + 1))
    costs = costs.with_draft_depth("autoregressive", max_depth=K)
    hook = DraftDepthHook(costs, 8, K, mode="per_request", exploration=0.0)
    hook.record([0, 1], [[0.99] * K, [0.001] * K], K)
    depths = hook.choose([0, 1], num_non_draft_tokens=2, num_sampling_requests=2)
    assert depths[0] > depths[1]
    drafts = np.arange(2 * K).reshape(2, K)
    hook.mask(drafts)
    for r in range(2):
        assert np.all(drafts[r, depths[r] :] == -1) and np.all(drafts[r, : depths[r]] >= 0)
    tensor = torch.arange(2 * K).reshape(2, K)
    hook.mask(tensor)
    np.testing.assert_array_equal(tensor.numpy(), drafts)


_MASK = (1 << 64) - 1


def _mix(z: int) -> int:
    """splitmix64's finalizer, in Python integers: the reference for the planner's draws."""
    z = (z + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def _draws(seed: int, step: int, slot: int, p: float) -> bool:
    """Whether ``slot`` explores at ``step`` (``slot = 2**64 - 1``: whether the step is an
    exploration step): a hash of (seed, step, slot) and nothing else, never a token."""
    return (_mix(seed ^ _mix(step ^ _mix(slot))) >> 11) * 2.0**-53 < p


def test_exploration_steps_draft_a_few_whole_blocks() -> None:
    hook = DraftDepthHook(tables(draft_pass_ms=50.0), 64, K, exploration=0.2, seed=1)
    slots = np.arange(32)
    hook.record(slots, np.full((32, K), 0.01), K)
    steps = []
    whole_steps = explorers_in_whole_steps = 0
    for step in range(1, 201):
        depths = hook.choose(slots, num_non_draft_tokens=32, num_sampling_requests=32)
        assert set(depths.tolist()) <= {0, K}
        assert hook.explored == bool(depths.any())
        steps.append(int((depths == K).sum()))
        # The planner's policy, each decision one step: every request explores with
        # probability 0.2 (drafting as deep as the batch, here 0), and in an exploration step
        # (one more draw, probability 0.2) the explorers draft their whole block.
        whole = _draws(1, step, 2**64 - 1, 0.2)
        expected = [_draws(1, step, int(s), 0.2) for s in slots]
        assert hook.explorers is not None and hook.explorers.tolist() == expected, step
        np.testing.assert_array_equal(depths, np.where(whole, K * np.array(expected), 0))
        whole_steps += whole
        explorers_in_whole_steps += sum(expected) if whole else 0
    exploring = [n for n in steps if n]
    assert 20 <= len(exploring) <= 70
    assert np.mean(exploring) < 0.5 * 32  # a few requests, not the batch
    # Binomial rates (about 4 standard deviations): steps and explorers each with ε = 0.2.
    assert 18 <= whole_steps <= 62
    assert 0.1 <= explorers_in_whole_steps / (32 * whole_steps) <= 0.3
    # Exploration off: nothing explores, the step still counts.
    hook.exploration = 0.0
    assert not hook.choose(slots, num_non_draft_tokens=32, num_sampling_requests=32).any()
    assert not hook.explored and hook.explorers is not None and not hook.explorers.any()


def test_exploration_never_reads_the_confidences() -> None:
    """Two hooks with one seed and different histories (one hopeless, one confident and
    cheap to draft) draw the same explorers every step; each explorer drafts as deep as its
    batch, and in an exploration step its whole block."""
    a = DraftDepthHook(tables(draft_pass_ms=50.0), 16, K, mode="per_request", exploration=0.3)
    b = DraftDepthHook(tables(), 16, K, mode="per_request", exploration=0.3)
    slots = np.arange(16)
    rng = np.random.default_rng(0)
    widened = 0
    for _ in range(60):
        a.record(slots, rng.uniform(0.0, 0.05, (16, K)), K)
        b.record(slots, rng.uniform(0.3, 1.0, (16, K)), K)
        da = a.choose(slots, num_non_draft_tokens=16, num_sampling_requests=16)
        db = b.choose(slots, num_non_draft_tokens=16, num_sampling_requests=16)
        assert a.explorers is not None and b.explorers is not None
        np.testing.assert_array_equal(a.explorers, b.explorers)
        # Hopeless: only an exploration step's explorers draft, their whole block.
        np.testing.assert_array_equal(da, np.where(a.explored, K * a.explorers, 0))
        # Confident: explorers draft the batch's deepest depth (K in an exploration step).
        assert np.all(db[b.explorers] == (K if b.explored else db.max()))
        widened += int(b.explorers.any() and db.min() < db.max())
    assert widened  # per-request depths differed in some steps with explorers


# --- the plugin, on stand-in vLLM modules ------------------------------------------------------


class _Buffer:
    def __init__(self, rows: int) -> None:
        self.np = np.ones((rows, K), dtype=np.float32)


class FakeManager:
    """vLLM 0.33.0's host side of AdaptiveVerificationManager: confidences are copied to one of
    two host buffers asynchronously, and the copy a call starts is only synchronized (and read)
    at the next call, so the buffer the budget reads lags two proposals behind."""

    def __init__(self, max_num_reqs: int) -> None:
        self.cost_tables: Any = None
        self._stale_confidences = [_Buffer(max_num_reqs), _Buffer(max_num_reqs)]
        self._stale_idx = 0
        self._confidence_probs = np.ones((max_num_reqs, K), dtype=np.float32)
        self._pending_resets: list[int] = []
        self._in_flight: tuple[int, np.ndarray] | None = None

    def add_request(self, req_idx: int) -> None:
        self._stale_confidences[self._stale_idx].np[req_idx] = 1.0
        self._pending_resets.append(req_idx)
        self._confidence_probs[req_idx] = 1.0

    def record_confidences(self, confidence_probs: Any, input_batch: Any) -> None:
        ready = self._stale_idx ^ 1
        if self._in_flight is not None:  # the copy started last call lands now
            index, data = self._in_flight
            self._stale_confidences[index].np[:] = data
        if self._pending_resets:
            self._stale_confidences[ready].np[self._pending_resets] = 1.0
            self._pending_resets.clear()
        self._stale_idx, write = ready, self._stale_idx
        n = input_batch.num_reqs
        self._confidence_probs[input_batch.idx_mapping_np[:n]] = confidence_probs[:n]
        self._in_flight = (write, self._confidence_probs.copy())


class FakeSpeculator:
    num_speculative_steps = K

    def __init__(self) -> None:
        self.depths_asked: list[int | None] = []

    def propose(
        self,
        input_batch: Any,
        last_hidden_states: Any = None,
        *,
        dummy_run: bool = False,
        num_speculative_tokens: int | None = None,
    ) -> torch.Tensor:
        self.depths_asked.append(num_speculative_tokens)
        return torch.arange(input_batch.num_reqs * K).reshape(-1, K) + 100


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, types.ModuleType]]:
    modules = {}
    for module_name, class_name in vllm_plugin.DEPTH_SPECULATORS:
        module = types.ModuleType(module_name)
        setattr(module, class_name, type(class_name, (FakeSpeculator,), {}))
        monkeypatch.setitem(sys.modules, module_name, module)
        modules[module_name] = module
    budget = types.ModuleType(vllm_plugin.BUDGET_MODULE)
    budget.AdaptiveVerificationManager = type(  # type: ignore[attr-defined]
        "AdaptiveVerificationManager", (FakeManager,), {}
    )
    monkeypatch.setitem(sys.modules, vllm_plugin.BUDGET_MODULE, budget)
    modules[vllm_plugin.BUDGET_MODULE] = budget
    monkeypatch.setenv(vllm_plugin.ENV_DEPTH, "batch")
    monkeypatch.delenv(vllm_plugin.ENV_ENABLE, raising=False)
    yield modules
    vllm_plugin.uninstall()


def batch(slots: list[int]) -> types.SimpleNamespace:
    return types.SimpleNamespace(idx_mapping_np=np.array(slots), num_reqs=len(slots))


def speculator_and_manager(
    fake_vllm: dict[str, types.ModuleType], draft_pass_ms: float
) -> tuple[Any, Any]:
    module_name, class_name = vllm_plugin.DEPTH_SPECULATORS[0]
    speculator = getattr(fake_vllm[module_name], class_name)()
    manager = fake_vllm[vllm_plugin.BUDGET_MODULE].AdaptiveVerificationManager(16)
    # vLLM's (draft_ms, verify_ms): flat verification, drafting priced per full depth.
    manager.cost_tables = (np.r_[0.0, np.full(16, draft_pass_ms * K)], np.full(16 * 5 + 1, 6.0))
    return speculator, manager


def step(speculator: Any, manager: Any, slots: list[int], q: float) -> int:
    """One decode step: propose, then record this step's confidences (q where drafted, 0.77 past
    the drafted depth, which must never be remembered)."""
    speculator.propose(batch(slots), num_speculative_tokens=K)
    depth = speculator.depths_asked[-1]
    confidences = np.full((len(slots), K), 0.77, dtype=np.float32)
    hook = vllm_plugin._DepthState.hook
    depths = hook.last_depths if hook is not None and hook.last_depths is not None else [depth]
    for r, d in enumerate(np.broadcast_to(depths, (len(slots),))):
        confidences[r, : int(d)] = q
    manager.record_confidences(confidences, batch(slots))
    return int(depth)


def test_depth_control_is_off_unless_enabled(
    fake_vllm: dict[str, types.ModuleType], monkeypatch: pytest.MonkeyPatch
) -> None:
    for value in ("", "0", "off", "false"):
        monkeypatch.setenv(vllm_plugin.ENV_DEPTH, value)
        vllm_plugin.register()
        assert vllm_plugin.installed() == []


def test_plugin_chooses_depth_before_propose(fake_vllm: dict[str, types.ModuleType]) -> None:
    vllm_plugin.register()
    vllm_plugin.register()  # idempotent
    assert len(vllm_plugin.installed()) == 3 + len(vllm_plugin.DEPTH_SPECULATORS)
    speculator, manager = speculator_and_manager(fake_vllm, draft_pass_ms=2.0)
    manager.cost_tables = None
    # Before profiling (no cost tables) the call passes through unchanged.
    speculator.propose(batch([0, 1]), num_speculative_tokens=K)
    assert speculator.depths_asked == [K]
    speculator, manager = speculator_and_manager(fake_vllm, draft_pass_ms=2.0)
    # Fresh slots are optimistic: the first steps draft; the hopeless confidences recorded
    # then reach the decision two proposals later (vLLM's copy lag) and drafting stops.
    depths = [step(speculator, manager, [0, 1], 0.01) for _ in range(6)]
    assert depths[0] == K and depths[-1] == 0
    out = speculator.propose(batch([0, 1]), num_speculative_tokens=K)
    assert speculator.depths_asked[-1] == 0 and torch.all(out == -1)
    hook = vllm_plugin._DepthState.hook
    # What was remembered is what was drafted: 0.01, never the 0.77 past the depth.
    np.testing.assert_allclose(hook.remembered(0), 0.01, rtol=1e-6)
    vllm_plugin.uninstall()
    module_name, class_name = vllm_plugin.DEPTH_SPECULATORS[0]
    assert getattr(fake_vllm[module_name], class_name).propose is FakeSpeculator.propose


def test_exploration_refreshes_memory_after_depth_zero(
    fake_vllm: dict[str, types.ModuleType],
) -> None:
    vllm_plugin.register()
    speculator, manager = speculator_and_manager(fake_vllm, draft_pass_ms=1.0)
    slots = list(range(8))
    for _ in range(8):
        step(speculator, manager, slots, 0.01)
    hook = vllm_plugin._DepthState.hook
    assert speculator.depths_asked[-1] == 0
    # The drafts became good; only exploration steps draft now, and what their explorers
    # drafted must reach the memory (with the depths they drafted, two proposals later).
    hook.exploration = 0.5
    for _ in range(40):
        step(speculator, manager, slots, 0.95)
    refreshed = [s for s in slots if np.allclose(hook.remembered(s), 0.95)]
    assert refreshed, [hook.remembered(s) for s in slots]
    # Once rows are back up, the batch drafts again.
    assert max(speculator.depths_asked[-5:]) > 0


def test_a_new_request_in_a_slot_starts_optimistic(
    fake_vllm: dict[str, types.ModuleType],
) -> None:
    vllm_plugin.register()
    speculator, manager = speculator_and_manager(fake_vllm, draft_pass_ms=2.0)
    for _ in range(6):
        step(speculator, manager, [0, 1], 0.01)
    hook = vllm_plugin._DepthState.hook
    hook.exploration = 0.0
    assert speculator.depths_asked[-1] == 0
    manager.add_request(1)  # a new request takes slot 1
    np.testing.assert_array_equal(hook.remembered(1), np.ones(K))
    for _ in range(3):
        step(speculator, manager, [0, 1], 0.9)
    # The old request's confidences, still in flight, never land on the new one.
    assert hook.remembered(1)[0] != pytest.approx(0.01)


def test_bad_settings_patch_nothing(
    fake_vllm: dict[str, types.ModuleType], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A value a variable does not take is a SettingError naming it (docs/settings.md).
    monkeypatch.setenv(vllm_plugin.ENV_DEPTH, "batch")
    monkeypatch.setenv(vllm_plugin.ENV_DRAFTER, "tree")
    with pytest.raises(SettingError, match="AV_CORE_VLLM_DRAFTER='tree'"):
        vllm_plugin.register()
    assert vllm_plugin.installed() == []
    monkeypatch.setenv(vllm_plugin.ENV_DRAFTER, "parallel")
    monkeypatch.setenv(vllm_plugin.ENV_DEPTH, "deep")
    with pytest.raises(SettingError, match="AV_CORE_VLLM_DEPTH='deep'"):
        vllm_plugin.register()
    monkeypatch.setenv(vllm_plugin.ENV_DEPTH, "per_request")
    module_name, class_name = vllm_plugin.DEPTH_SPECULATORS[1]

    def propose(self: Any, batch: Any) -> None: ...

    getattr(fake_vllm[module_name], class_name).propose = propose
    with pytest.raises(vllm_plugin.VllmCompatibilityError, match=class_name):
        vllm_plugin.register()
    assert vllm_plugin.installed() == []
