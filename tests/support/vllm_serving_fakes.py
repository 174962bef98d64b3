"""Fake vLLM modules for the plugin's warm restarts and data-parallel pooling
(av_core.vllm.serving), with the control flow tests/vllm/test_vllm_contract.py checks in the
released source:

- ``DraftModelSpeculator.load_model`` builds the estimator module's ``OnlineAcceptanceEstimator``
  (whatever the plugin swapped in) and ``observe_verification`` steps it;
- ``GPUModelRunner.execute_model`` runs the data-parallel batch sync (a CPU all-reduce over the
  group), ``sample_tokens`` grades the verdicts and then proposes, ``_dummy_run`` runs
  ``execute_model`` and then ``propose(dummy_run=True)``;
- ``Worker.execute_dummy_batch`` runs ``_dummy_run``; ``get_dp_group()`` returns a group
  coordinator with ``cpu_group``, ``world_size`` and ``ranks``.

Also runnable: ``python vllm_serving_fakes.py RANK WORLD PORT STATE_DIR OUT`` serves the lockstep
data-parallel scenario of tests/vllm/test_vllm_serving.py on one rank (rank 0 has requests, the
others only dummy batches).
"""

from __future__ import annotations

import json
import sys
import types
from typing import Any

import torch

from av_core.vllm import plugin as vllm_plugin

SPEC = "vllm.v1.worker.gpu.spec_decode"
M, K, VOCAB = 8, 3, 48


class Group:
    """``GroupCoordinator`` as the plugin reads it."""

    def __init__(self, cpu_group: Any, world_size: int, ranks: list[int]) -> None:
        self.cpu_group, self.world_size, self.ranks = cpu_group, world_size, ranks


def build(dp_group: Group | None = None, version: str = "0.33.0") -> dict[str, types.ModuleType]:
    import test_vllm  # the estimator and budget modules of the plugin's own tests

    modules = test_vllm.build_fake_vllm(version)
    estimator_module = modules[vllm_plugin.ESTIMATOR_MODULE]
    speculator = modules[f"{SPEC}.speculator"]

    class DraftModelSpeculator:
        def __init__(self, vllm_config: Any, device: torch.device) -> None:
            self.vllm_config = vllm_config
            self.device = device
            self.speculative_config = vllm_config.speculative_config
            self.method = self.speculative_config.method
            self.num_speculative_steps = self.speculative_config.num_speculative_tokens
            self.draft_model_config = self.speculative_config.draft_model_config
            self.acceptance_estimator: Any = None
            self.proposed: list[bool] = []

        def load_model(self, target_model: Any) -> None:
            self.acceptance_estimator = estimator_module.OnlineAcceptanceEstimator(
                M, self.num_speculative_steps, self.device
            )

        def observe_verification(self, idx: Any, sampled: Any, rejected: Any) -> None:
            self.acceptance_estimator.step(idx, sampled, rejected)

        def propose(self, input_batch: Any, *, dummy_run: bool = False, **_: Any) -> None:
            self.proposed.append(dummy_run)
            if dummy_run or input_batch is None:
                return
            conf = torch.zeros(M, self.num_speculative_steps)
            for k, logits in enumerate(input_batch["logits"]):
                self.acceptance_estimator.predict(
                    logits, input_batch["idx"], torch.tensor(k), conf, torch.ones(M)
                )

    speculator.DraftModelSpeculator = DraftModelSpeculator  # type: ignore[attr-defined]

    class GPUModelRunner:
        def __init__(self, spec: Any) -> None:
            self.speculator = spec

        def execute_model(self, scheduled: Any, dummy_run: bool = False) -> None:
            if dp_group is not None:  # the DP batch sync every step starts with
                import torch.distributed as dist

                dist.all_reduce(torch.zeros(7, dtype=torch.int32), group=dp_group.cpu_group)

        def sample_tokens(self, verdict: Any, batch: Any) -> None:
            self.speculator.observe_verification(*verdict)
            self.speculator.propose(batch)

        def _dummy_run(self, num_tokens: int, **_: Any) -> None:
            self.execute_model(None, dummy_run=True)
            self.speculator.propose(None, dummy_run=True)

    class Worker:
        def __init__(self, runner: GPUModelRunner) -> None:
            self.model_runner = runner

        def execute_dummy_batch(self) -> None:
            self.model_runner._dummy_run(1, uniform_decode=True)

    worker = types.ModuleType("vllm.v1.worker.gpu_worker")
    worker.Worker = Worker  # type: ignore[attr-defined]
    worker.GPUModelRunner = GPUModelRunner  # type: ignore[attr-defined]
    parallel_state = types.ModuleType("vllm.distributed.parallel_state")
    parallel_state.get_dp_group = lambda: dp_group or Group(None, 1, [0])  # type: ignore[attr-defined]
    distributed = types.ModuleType("vllm.distributed")
    modules.update(
        {
            "vllm.v1.worker.gpu_worker": worker,
            "vllm.distributed": distributed,
            "vllm.distributed.parallel_state": parallel_state,
        }
    )
    return modules


def vllm_config(target: str = "org/target", draft: str = "org/draft") -> Any:
    ns = types.SimpleNamespace
    return ns(
        model_config=ns(model=target),
        parallel_config=ns(data_parallel_index=0),
        speculative_config=ns(
            method="eagle3",
            num_speculative_tokens=K,
            model=draft,
            draft_model_config=ns(model=draft),
        ),
    )


def install(modules: dict[str, types.ModuleType]) -> None:
    for name, module in modules.items():
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent in modules:
            setattr(modules[parent], child, module)


def trace(steps: int, seed: int = 3) -> list[dict[str, Any]]:
    """Rank 0's requests: a verdict on the previous step's slots and new drafts per step."""
    gen = torch.Generator().manual_seed(seed)
    out, previous = [], torch.zeros(0, dtype=torch.int32)
    for _ in range(steps):
        accepted = torch.randint(0, K + 1, (previous.shape[0],), generator=gen)
        rejected = (torch.rand(previous.shape[0], generator=gen) < 0.7) & (accepted < K)
        idx = torch.randperm(M, generator=gen)[: int(torch.randint(1, M, (1,), generator=gen))]
        idx = idx.to(torch.int32)
        logits = [torch.randn(idx.shape[0], VOCAB, generator=gen) * 3 for _ in range(K)]
        out.append(
            {
                "verdict": (previous, (accepted + 1).to(torch.int32), rejected.to(torch.int32)),
                "batch": {"idx": idx, "logits": logits},
            }
        )
        previous = idx
    return out


def bits(estimator: Any) -> list[str]:
    slope, intercepts = estimator.host_coefficients
    return [float(slope).hex()] + [float(v).hex() for v in intercepts]


def main(argv: list[str]) -> None:
    import os

    import torch.distributed as dist
    from distributed_scenarios import join_gloo

    rank, world, port, state_dir, out = int(argv[1]), int(argv[2]), argv[3], argv[4], argv[5]
    torch.set_num_threads(1)
    join_gloo(rank, world, port)
    os.environ.update(AV_CORE_VLLM="1", AV_CORE_SHARE_STATS="dp", AV_CORE_STATE_SAVE_EVERY="1")
    if state_dir != "-":
        os.environ["AV_CORE_STATE_DIR"] = state_dir
    install(build(Group(dist.group.WORLD, world, list(range(world)))))
    vllm_plugin.register()
    speculator_class = sys.modules[f"{SPEC}.speculator"].DraftModelSpeculator
    worker_module = sys.modules["vllm.v1.worker.gpu_worker"]
    config = vllm_config()
    config.parallel_config.data_parallel_index = rank
    spec = speculator_class(config, torch.device("cpu"))
    spec.load_model(None)
    est = spec.acceptance_estimator
    est.REFIT_INTERVAL = 5
    after_load = bits(est)
    runner = worker_module.GPUModelRunner(spec)
    worker = worker_module.Worker(runner)
    trajectory = []
    for step in trace(23):
        if rank == 0:  # a real step: execute_model, then sample_tokens
            runner.execute_model(object())
            runner.sample_tokens(step["verdict"], step["batch"])
        else:  # no requests: the engine runs a dummy batch
            worker.execute_dummy_batch()
        trajectory.append(bits(est))
    with open(out, "w") as handle:
        json.dump(
            {
                "after_load": after_load,
                "trajectory": trajectory,
                "refits": est.num_refits,
                "dummy_proposes": sum(spec.proposed),
                "steps_since_refit": est.steps_since_refit,
            },
            handle,
        )
    for warm_save in list(getattr(est, "_refit_listeners", [])):
        owner = getattr(warm_save, "__self__", None)
        if owner is not None and hasattr(owner, "close"):
            owner.close()
    # Both ranks done with every collective before either ends; the process then ends without
    # tearing its gloo group down (distributed_scenarios.exit_now).
    dist.barrier()


if __name__ == "__main__":
    from distributed_scenarios import exit_now

    main(sys.argv)
    exit_now()
