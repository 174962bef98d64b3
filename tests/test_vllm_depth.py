"""av_core.vllm_depth.DraftDepthHook and the plugin's drafting-depth wiring, on stand-ins for
vLLM's classes (the released signatures are checked in tests/test_vllm_contract.py)."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from av_core import CostTables, vllm_plugin
from av_core.vllm_depth import DraftDepthHook

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


def test_exploration_steps_draft_a_few_whole_blocks() -> None:
    hook = DraftDepthHook(tables(draft_pass_ms=50.0), 64, K, exploration=0.2, seed=1)
    slots = np.arange(32)
    hook.record(slots, np.full((32, K), 0.01), K)
    steps = []
    for _ in range(200):
        depths = hook.choose(slots, num_non_draft_tokens=32, num_sampling_requests=32)
        assert set(depths.tolist()) <= {0, K}
        assert hook.explored == bool(depths.any())
        steps.append(int((depths == K).sum()))
    exploring = [n for n in steps if n]
    assert 20 <= len(exploring) <= 70
    assert np.mean(exploring) < 0.5 * 32  # a few requests, not the batch


# --- the plugin, on stand-in vLLM modules ------------------------------------------------------


class _Buffer:
    def __init__(self, rows: int) -> None:
        self.np = np.ones((rows, K), dtype=np.float32)


class FakeManager:
    def __init__(self, max_num_reqs: int) -> None:
        self.cost_tables: Any = None
        self._stale_confidences = [_Buffer(max_num_reqs), _Buffer(max_num_reqs)]
        self._stale_idx = 0


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


def test_depth_control_is_off_unless_enabled(
    fake_vllm: dict[str, types.ModuleType], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(vllm_plugin.ENV_DEPTH)
    vllm_plugin.register()
    assert vllm_plugin.installed() == []


def test_plugin_chooses_depth_before_propose(fake_vllm: dict[str, types.ModuleType]) -> None:
    vllm_plugin.register()
    assert len(vllm_plugin.installed()) == 1 + len(vllm_plugin.DEPTH_SPECULATORS)
    module_name, class_name = vllm_plugin.DEPTH_SPECULATORS[0]
    speculator = getattr(fake_vllm[module_name], class_name)()
    manager = fake_vllm[vllm_plugin.BUDGET_MODULE].AdaptiveVerificationManager(16)
    # Before profiling (no cost tables) the call passes through unchanged.
    speculator.propose(batch([0, 1]), num_speculative_tokens=K)
    assert speculator.depths_asked == [K]
    # With vLLM's (draft_ms, verify_ms) tables: drafting costs 20 ms a pass, so the hopeless
    # remembered confidences stop drafting...
    verify = np.full(16 * (K + 1) + 1, 6.0)
    manager.cost_tables = (np.r_[0.0, np.full(16, 20.0 * K)], verify)
    manager._stale_confidences[0].np[:] = 0.01
    out = speculator.propose(batch([0, 1]), num_speculative_tokens=K)
    assert speculator.depths_asked[-1] == 0
    assert torch.all(out == -1)
    # ...and confident ones draft fully (the wrapper records the stale rows it reads).
    manager._stale_confidences[0].np[:] = 0.999
    manager.cost_tables = (np.r_[0.0, np.full(16, 0.1 * K)], verify)
    out = speculator.propose(batch([0, 1]), num_speculative_tokens=K)
    assert speculator.depths_asked[-1] == K and torch.all(out >= 100)
    vllm_plugin.uninstall()
    assert getattr(fake_vllm[module_name], class_name).propose is FakeSpeculator.propose


def test_bad_settings_patch_nothing(
    fake_vllm: dict[str, types.ModuleType], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(vllm_plugin.ENV_DRAFTER, "tree")
    with pytest.raises(vllm_plugin.VllmCompatibilityError, match="tree"):
        vllm_plugin.register()
    assert vllm_plugin.installed() == []
    monkeypatch.setenv(vllm_plugin.ENV_DRAFTER, "parallel")
    module_name, class_name = vllm_plugin.DEPTH_SPECULATORS[1]

    def propose(self: Any, batch: Any) -> None: ...

    getattr(fake_vllm[module_name], class_name).propose = propose
    with pytest.raises(vllm_plugin.VllmCompatibilityError, match=class_name):
        vllm_plugin.register()
    assert vllm_plugin.installed() == []
