"""SGLang main's adaptive-speculation protocol, reproduced in our own words for the tests.

SGLang's main branch is not on PyPI and its source may not be committed here, so this module
writes, as a tiny importable ``sglang`` package, our own reproduction of the parts av_core's
policy meets, as they stand at sgl-project/sglang a12239f6ac74d804d169ee5d3cfed3c49fa7162c
(``python/sglang/srt/speculative/adaptive_runtime_state.py``, ``adaptive_spec_params.py``,
``adaptive_step_router.py``, ``throughput_aware_controller.py`` and ``EAGLEWorkerV2`` in
``eagle_worker_v2.py``; read through the public code index, 2026-12-02):

- the ``AdaptiveSpecPolicy`` protocol with ``on_verify_complete(self,
  num_correct_drafts_per_req, batch_size, num_steps=None)`` and ``on_state_activated(self,
  steps)``; the optional ``AdaptiveProfilingPolicy`` (``profile_plan``, ``record_profile``,
  ``profile_summary``) with the ``SpecProfilePoint``/``SpecProfilePlan`` dataclasses;
- ``AdaptiveController``: ``init_states`` (set the CUDA-graph sizes, build every candidate's
  state, activate the worker's initial step), ``activate_step_by_batch`` (one policy decision,
  activation when it differs from the running step), ``on_verify_complete(..., num_steps=None)``
  (a step the policy returns is activated), ``run_profiling(tree_cache, *,
  max_running_requests)`` (only for a policy that is an ``AdaptiveProfilingPolicy``: activate
  each point's state, time it, hand the milliseconds to ``record_profile`` after a broadcast
  from tensor-parallel rank 0, re-activate the original step, log ``profile_summary``), and
  ``_activate`` calling ``on_state_activated`` on every switch;
- ``adaptive_spec_params``: ``resolve_adaptive_strategy`` (the config's ``"strategy"``:
  ``"ema"`` or ``"throughput_aware"``), ``DEFAULT_ADAPTIVE_CONFIG`` (SGLang's tiers) and
  ``AdaptiveSpeculativeParams(initial_steps, cfg_path=None)``;
- ``throughput_aware_controller.ThroughputAwarePolicy(initial_steps, config_path=None)`` and its
  ``DEFAULT_THROUGHPUT_AWARE_CONFIG``;
- ``EAGLEWorkerV2``: ``__init__`` builds ``AdaptiveController(self,
  ThroughputAwarePolicy(initial_steps=..., config_path=...))`` for a throughput-aware config
  (imported there, when built) and ``AdaptiveController(self,
  AdaptiveSpeculativeParams(initial_steps=..., cfg_path=...))`` otherwise;
  ``forward_batch_generation`` asks ``activate_step_by_batch`` before each decode batch;
  ``on_verify_complete_cpu(..., batch_size=0, num_steps=None)`` and
  ``run_startup_spec_profiling(tree_cache, *, max_running_requests)`` hand over to the
  controller; the scheduler's result processor feeds ``on_verify_complete_cpu(...,
  batch_size=len(batch.reqs))``.

The SGLang policies' own decision logic is not reproduced (the tests drive av_core's); their
classes exist so that the installer has what to check and replace. What SGLang measures while
profiling is the test's: ``SpecProfilingSession.measure()`` returns ``COST(batch_size,
num_steps)`` of ``spec_profiling_session``, a function the test sets.

SGLang's DP-attention change (sgl-project/sglang#35898, open) is not on main; the tests
reproduce its rule themselves: every rank votes its policy's step, the batch runs the minimum.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import textwrap
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

#: The upstream revision reproduced.
REVISION = "sgl-project/sglang@a12239f6ac74d804d169ee5d3cfed3c49fa7162c"
RUNTIME = "sglang.srt.speculative.adaptive_runtime_state"
PARAMS = "sglang.srt.speculative.adaptive_spec_params"
WORKER = "sglang.srt.speculative.eagle_worker_v2"
THROUGHPUT = "sglang.srt.speculative.throughput_aware_controller"
PROCESSOR = "sglang.srt.managers.scheduler_components.batch_result_processor"
SESSION = "sglang.srt.speculative.spec_profiling_session"
STANDINS = "sglang.srt.speculative._standins"

RUNTIME_SOURCE = '''\
"""Reproduction (av_core tests) of SGLang main's adaptive runtime state and controller."""

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass
class SpecRuntimeState:
    speculative_num_steps: int
    speculative_num_draft_tokens: int
    draft_attn_backend: object = None
    cuda_graph_runner: object = None
    target_attn_backend: object = None
    target_graph_runner: object = None
    draft_extend_attn_backend: object = None
    cuda_graph_runner_for_draft_extend: object = None


class AdaptiveSpecWorker(Protocol):
    speculative_num_steps: int

    def build_adaptive_runtime_state(
        self, speculative_num_steps, speculative_num_draft_tokens, cuda_graph_bs=None
    ): ...

    def apply_runtime_state(self, state): ...


class AdaptiveSpecPolicy(Protocol):
    @property
    def candidate_steps(self): ...

    def set_cuda_graph_bs(self, cuda_graph_bs): ...

    def get_steps_for_batch(self, batch_size): ...

    def on_verify_complete(self, num_correct_drafts_per_req, batch_size, num_steps=None): ...

    def cuda_graph_bs_for_step(self, step): ...

    def on_state_activated(self, steps): ...


@dataclass(frozen=True)
class SpecProfilePoint:
    steps: int
    batch_size: int


@dataclass(frozen=True)
class SpecProfilePlan:
    points: tuple
    seq_len: int
    n_warmup: int
    n_measure: int


@runtime_checkable
class AdaptiveProfilingPolicy(Protocol):
    def profile_plan(self, worker, *, max_running_requests): ...

    def record_profile(self, batch_size, steps, avg_ms): ...

    def profile_summary(self): ...


def _broadcast_float_from_rank0(value):
    # One process here: rank 0's value is everyone's.
    return value


class AdaptiveController:
    def __init__(self, worker, policy):
        self.worker = worker
        self.params = policy
        self._states = {}
        self.summaries = []

    @property
    def candidate_steps(self):
        return self.params.candidate_steps

    def register(self, state, steps=None):
        self._states[state.speculative_num_steps if steps is None else steps] = state

    def init_states(self, cuda_graph_bs=None):
        self.params.set_cuda_graph_bs(cuda_graph_bs)
        for steps in self.candidate_steps:
            if steps not in self._states:
                self._states[steps] = self.worker.build_adaptive_runtime_state(
                    speculative_num_steps=steps,
                    speculative_num_draft_tokens=steps + 1,
                    cuda_graph_bs=self.params.cuda_graph_bs_for_step(steps),
                )
        self._activate(self.worker.speculative_num_steps)

    def activate_step_by_batch(self, batch_size):
        wanted = self.params.get_steps_for_batch(batch_size)
        if wanted != self.worker.speculative_num_steps:
            self._activate(wanted)

    def on_verify_complete(self, num_correct_drafts_per_req, batch_size, num_steps=None):
        switch = self.params.on_verify_complete(num_correct_drafts_per_req, batch_size, num_steps)
        if switch is not None:
            self._activate(switch)

    def run_profiling(self, tree_cache, *, max_running_requests):
        if not isinstance(self.params, AdaptiveProfilingPolicy):
            return
        plan = self.params.profile_plan(self.worker, max_running_requests=max_running_requests)
        if not plan.points:
            return
        from sglang.srt.speculative.spec_profiling_session import SpecProfilingSession

        running = self.worker.speculative_num_steps
        for point in plan.points:
            self._activate(point.steps)
            ms = SpecProfilingSession(
                worker=self.worker,
                tree_cache=tree_cache,
                batch_size=point.batch_size,
                num_steps=point.steps,
                seq_len=plan.seq_len,
                n_warmup=plan.n_warmup,
                n_measure=plan.n_measure,
            ).measure()
            self.params.record_profile(
                point.batch_size, point.steps, _broadcast_float_from_rank0(ms)
            )
        self._activate(running)
        self.summaries.append(self.params.profile_summary())

    def _activate(self, speculative_num_steps):
        if speculative_num_steps not in self._states:
            raise ValueError(
                f"Missing adaptive runtime state for steps={speculative_num_steps}"
            )
        self.worker.apply_runtime_state(self._states[speculative_num_steps])
        self.params.on_state_activated(speculative_num_steps)
'''

PARAMS_SOURCE = '''\
"""Reproduction (av_core tests) of SGLang main's adaptive config and EMA policy's interface."""

import json

DEFAULT_ADAPTIVE_CONFIG = {
    "1": {"candidate_steps": [1, 3, 5, 7]},
    "8": {"candidate_steps": [0, 1, 3]},
    "32": {"candidate_steps": [0, 1]},
    "64": {"candidate_steps": [0]},
}


def resolve_adaptive_strategy(cfg_path=None):
    if cfg_path is None:
        return "ema"
    with open(cfg_path) as file:
        strategy = json.load(file).get("strategy", "ema")
    if strategy not in ("ema", "throughput_aware"):
        raise ValueError(f"unknown adaptive strategy {strategy!r}")
    return strategy


class AdaptiveSpeculativeParams:
    """SGLang's EMA policy (its decisions are not reproduced: the tests drive av_core's)."""

    def __init__(self, initial_steps, cfg_path=None):
        self.initial_steps = initial_steps
        self.cfg_path = cfg_path
'''

THROUGHPUT_SOURCE = '''\
"""Reproduction (av_core tests) of SGLang main's throughput-aware policy's interface."""

DEFAULT_THROUGHPUT_AWARE_CONFIG = {
    "strategy": "throughput_aware",
    "profile_run_n_warmup": 5,
    "profile_run_n_measure": 10,
    "profile_run_seq_len": 128,
    "1": {"candidate_steps": [1, 3, 5, 7]},
}


class ThroughputAwarePolicy:
    def __init__(self, initial_steps, config_path=None):
        self.initial_steps = initial_steps
        self.config_path = config_path
'''

SESSION_SOURCE = '''\
"""Stand-in for SGLang's start-up profiling session: its cost is the test's COST."""

COST = None


class SpecProfilingSession:
    def __init__(self, *, worker, tree_cache, batch_size, num_steps, seq_len, n_warmup,
                 n_measure):
        assert worker.speculative_num_steps == num_steps  # the controller activated it
        self.batch_size, self.num_steps = batch_size, num_steps

    def measure(self):
        return COST(self.batch_size, self.num_steps)
'''

STANDINS_SOURCE = '''\
"""Stand-ins for what EAGLEWorkerV2.__init__ reads besides the adaptive controller."""

from types import SimpleNamespace

SPEC = SimpleNamespace(
    speculative_eagle_topk=1, speculative_num_steps=3, speculative_num_draft_tokens=4,
    speculative_algorithm="EAGLE", speculative_adaptive=True, speculative_adaptive_config=None,
)


class _Off:
    def get(self):
        return False


envs = SimpleNamespace(
    SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND=_Off(),
    SGLANG_ENABLE_DP_SPEC_PREFILL_COORDINATION=_Off(),
)
torch = SimpleNamespace(empty=lambda *args, **kwargs: None, int64="int64")


def get_spec():
    return SPEC


def get_device():
    return SimpleNamespace(device="cpu")


def get_schedule():
    return SimpleNamespace(page_size=1)


def get_parallel():
    return SimpleNamespace(pp_group=SimpleNamespace(is_last_rank=True))


def get_pp_group():
    return SimpleNamespace(is_last_rank=True)


def get_exec():
    return SimpleNamespace(graph=SimpleNamespace(cuda_graph_config=None))


def get_plan_stream(device):
    return None, None


class SpeculativeAlgorithm:
    @staticmethod
    def from_string(name):
        return name


class EagleDraftWorker:
    def __init__(self, *args, **kwargs):
        pass


class BaseSpecWorker:
    def __init__(self):
        self.built = {}
'''

WORKER_SOURCE = '''\
"""Reproduction (av_core tests) of SGLang main's EAGLEWorkerV2 adaptive hooks."""

from __future__ import annotations

from typing import Optional

from sglang.srt.speculative._standins import (
    BaseSpecWorker,
    EagleDraftWorker,
    SpeculativeAlgorithm,
    get_device,
    get_plan_stream,
    get_pp_group,
    get_schedule,
    get_spec,
)
from sglang.srt.speculative.adaptive_runtime_state import AdaptiveController, SpecRuntimeState
from sglang.srt.speculative.adaptive_spec_params import AdaptiveSpeculativeParams


class EAGLEWorkerV2(BaseSpecWorker):
    def __init__(self, server_args, gpu_id, ps, nccl_port, target_worker):
        super().__init__()
        self.server_args = server_args
        self.topk = get_spec().speculative_eagle_topk
        self.speculative_num_steps = get_spec().speculative_num_steps
        self.speculative_num_draft_tokens = get_spec().speculative_num_draft_tokens
        self.device = get_device().device
        self.page_size = get_schedule().page_size
        self.speculative_algorithm = SpeculativeAlgorithm.from_string(
            get_spec().speculative_algorithm
        )
        self._hosts_draft = get_pp_group().is_last_rank
        self._draft_worker = EagleDraftWorker(server_args) if self._hosts_draft else None
        self.adaptive_controller: Optional[AdaptiveController] = None
        if get_spec().speculative_adaptive and self._hosts_draft:
            from sglang.srt.speculative.adaptive_spec_params import resolve_adaptive_strategy

            config = get_spec().speculative_adaptive_config
            if resolve_adaptive_strategy(config) == "throughput_aware":
                from sglang.srt.speculative.throughput_aware_controller import (
                    ThroughputAwarePolicy,
                )

                self.adaptive_controller = AdaptiveController(
                    self,
                    ThroughputAwarePolicy(
                        initial_steps=self.speculative_num_steps, config_path=config
                    ),
                )
            else:
                self.adaptive_controller = AdaptiveController(
                    self,
                    AdaptiveSpeculativeParams(
                        initial_steps=self.speculative_num_steps, cfg_path=config
                    ),
                )
        self.plan_stream, self.plan_stream_ctx = get_plan_stream(self.device)

    def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None):
        if batch.forward_mode.is_extend():
            return None
        self.activate_step_by_batch(batch.seq_lens.shape[0])
        return None

    def on_verify_complete_cpu(self, num_correct_drafts_per_req, batch_size=0, num_steps=None):
        if self.adaptive_controller is not None:
            self.adaptive_controller.on_verify_complete(
                num_correct_drafts_per_req, batch_size=batch_size, num_steps=num_steps
            )

    def activate_step_by_batch(self, batch_size):
        if self.adaptive_controller is not None:
            self.adaptive_controller.activate_step_by_batch(batch_size)

    def run_startup_spec_profiling(self, tree_cache, *, max_running_requests):
        if self.adaptive_controller is not None:
            self.adaptive_controller.run_profiling(
                tree_cache, max_running_requests=max_running_requests
            )

    def build_adaptive_runtime_state(
        self, speculative_num_steps, speculative_num_draft_tokens, cuda_graph_bs=None
    ):
        self.built[speculative_num_steps] = cuda_graph_bs
        return SpecRuntimeState(
            speculative_num_steps, speculative_num_draft_tokens, *[None] * 6
        )

    def apply_runtime_state(self, state):
        self.speculative_num_steps = state.speculative_num_steps
        self.speculative_num_draft_tokens = state.speculative_num_draft_tokens
'''

PROCESSOR_SOURCE = '''\
"""Reproduction (av_core tests): where SGLang main's scheduler feeds each verify's counts."""


class SchedulerBatchResultProcessor:
    def _resolve_spec_v2_tokens(self, result, batch):
        accept_lens = result.accept_lens.tolist()
        result.num_correct_drafts_per_req_cpu = [n - 1 for n in accept_lens]
        self.model_worker.on_verify_complete_cpu(
            result.num_correct_drafts_per_req_cpu, batch_size=len(batch.reqs)
        )
'''

#: The reproduction's files, relative to the root of an importable tree.
FILES: dict[str, str] = {
    "sglang/__init__.py": '__version__ = "0.5.24.dev0"\n',
    "sglang/srt/__init__.py": "",
    "sglang/srt/speculative/__init__.py": "",
    "sglang/srt/managers/__init__.py": "",
    "sglang/srt/managers/scheduler_components/__init__.py": "",
    "sglang/srt/speculative/adaptive_runtime_state.py": RUNTIME_SOURCE,
    "sglang/srt/speculative/adaptive_spec_params.py": PARAMS_SOURCE,
    "sglang/srt/speculative/throughput_aware_controller.py": THROUGHPUT_SOURCE,
    "sglang/srt/speculative/spec_profiling_session.py": SESSION_SOURCE,
    "sglang/srt/speculative/_standins.py": STANDINS_SOURCE,
    "sglang/srt/speculative/eagle_worker_v2.py": WORKER_SOURCE,
    "sglang/srt/managers/scheduler_components/batch_result_processor.py": PROCESSOR_SOURCE,
}


def standin_worker(runtime: ModuleType, steps: int = 2) -> Any:
    """A worker of SGLang's ``AdaptiveSpecWorker`` protocol running ``steps``, whose runtime
    states are ``runtime.SpecRuntimeState`` records (no backends, no graphs)."""

    class Worker:
        speculative_num_steps = steps

        def build_adaptive_runtime_state(
            self,
            speculative_num_steps: int,
            speculative_num_draft_tokens: int,
            cuda_graph_bs: Any = None,
        ) -> Any:
            return runtime.SpecRuntimeState(
                speculative_num_steps, speculative_num_draft_tokens, *[None] * 6
            )

        def apply_runtime_state(self, state: Any) -> None:
            self.speculative_num_steps = state.speculative_num_steps

    return Worker()


def standin_spec() -> Any:
    """The ``get_spec()`` answer of the tree imported last (the test sets its fields)."""
    return sys.modules[STANDINS].SPEC


@contextlib.contextmanager
def importable(files: Mapping[str, str], root: Path) -> Iterator[dict[str, ModuleType]]:
    """Writes ``files`` under ``root`` and imports SGLang's three adaptive modules from there
    (and the throughput-aware one when present); every ``sglang`` module loaded before is set
    aside and restored afterwards, av_core's install undone."""
    from av_core import sglang as av_sglang

    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text) if text.startswith("\n") else text)
    saved = {name: module for name, module in sys.modules.items() if name.startswith("sglang")}
    for name in saved:
        del sys.modules[name]
    sys.path.insert(0, str(root))
    importlib.invalidate_caches()
    try:
        names = [RUNTIME, PARAMS, WORKER]
        if any(relative.endswith("throughput_aware_controller.py") for relative in files):
            names.append(THROUGHPUT)
        yield {name: importlib.import_module(name) for name in names}
    finally:
        av_sglang.uninstall()
        sys.path.remove(str(root))
        for name in [n for n in sys.modules if n.startswith("sglang")]:
            del sys.modules[name]
        sys.modules.update(saved)


# --- a real SGLang checkout (AV_CORE_SGLANG_MAIN_SRC) ----------------------------------------

#: The variable naming an SGLang checkout (its root, or its ``python/`` directory) whose real
#: adaptive modules the tests then drive too.
ENV_MAIN_SRC = "AV_CORE_SGLANG_MAIN_SRC"

#: Files of the checkout used as they are (those absent in it are skipped).
CHECKOUT_MODULES = (
    "sglang/srt/speculative/adaptive_runtime_state.py",
    "sglang/srt/speculative/adaptive_spec_params.py",
    "sglang/srt/speculative/adaptive_step_router.py",
    "sglang/srt/speculative/throughput_aware_controller.py",
    "sglang/srt/speculative/throughput_aware_spec_params.py",
    "sglang/srt/managers/scheduler_components/batch_result_processor.py",  # read, not imported
)

#: ``EAGLEWorkerV2``'s own methods taken from the checkout (``forward_batch_generation`` is only
#: read, by the installer's call-site check); the rest of the worker is :data:`WORKER_SOURCE`'s.
WORKER_METHODS = (
    "__init__",
    "on_verify_complete_cpu",
    "activate_step_by_batch",
    "forward_batch_generation",
    "run_startup_spec_profiling",
)

#: Stand-ins for the small modules SGLang main's adaptive modules import.
CHECKOUT_STANDINS: dict[str, str] = {
    "sglang/srt/utils/__init__.py": (
        "def log_info_on_rank0(logger, message):\n    logger.info(message)\n"
    ),
    "sglang/srt/utils/common.py": (
        "def log_info_on_rank0(logger, message):\n    logger.info(message)\n\n\n"
        "def log_debug_on_rank0(logger, message):\n    logger.debug(message)\n"
    ),
    "sglang/srt/arg_groups/__init__.py": "",
    "sglang/srt/arg_groups/overrides.py": (
        "def resolved_view(args):\n    return args\n\n\ndef resolving_view(args):\n"
        "    return args\n"
    ),
}


def checkout_root(value: str) -> Path:
    """The directory holding the checkout's ``sglang`` package."""
    root = Path(value).expanduser()
    return root / "python" if (root / "python" / "sglang").is_dir() else root


#: The worker's methods that stay :data:`WORKER_SOURCE`'s where the rest is an SGLang source's.
WORKER_STANDINS = ("build_adaptive_runtime_state", "apply_runtime_state")


def worker_with(source: str, methods: tuple[str, ...] = WORKER_METHODS) -> str:
    """An ``EAGLEWorkerV2`` with ``methods`` exactly as ``source`` (an ``eagle_worker_v2.py``)
    writes them and :data:`WORKER_STANDINS` from :data:`WORKER_SOURCE`."""
    import ast

    def own(text: str) -> dict[str, ast.FunctionDef]:
        tree = ast.parse(text)
        worker = next(
            n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "EAGLEWorkerV2"
        )
        return {n.name: n for n in worker.body if isinstance(n, ast.FunctionDef)}

    def segment(text: str, node: ast.FunctionDef) -> str:
        lines = text.splitlines(keepends=True)
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        return "".join(lines[first - 1 : node.end_lineno])

    theirs, ours = own(source), own(WORKER_SOURCE)
    header, _, _ = WORKER_SOURCE.partition("class EAGLEWorkerV2(BaseSpecWorker):\n")
    header = header.replace(
        "    get_spec,\n)",
        "    get_exec,\n    get_parallel,\n    get_spec,\n    envs,\n    torch,\n)",
    )
    body = [segment(source, theirs[name]) for name in methods if name in theirs]
    body += [segment(WORKER_SOURCE, ours[name]) for name in WORKER_STANDINS]
    return header + "class EAGLEWorkerV2(BaseSpecWorker):\n" + "\n".join(body)


def checkout_files(value: str) -> dict[str, str]:
    """The files of :func:`importable` for SGLang's real modules in the checkout at ``value``:
    :data:`CHECKOUT_MODULES` as they are, ``EAGLEWorkerV2``'s :data:`WORKER_METHODS`, and the
    stand-ins (the profiling session is still the test's)."""
    root = checkout_root(value)
    files = {**FILES, **CHECKOUT_STANDINS}
    for relative in CHECKOUT_MODULES:
        path = root / relative
        if path.is_file():
            files[relative] = path.read_text()
        elif relative.endswith("throughput_aware_controller.py"):
            files.pop(relative, None)
    worker = root / "sglang/srt/speculative/eagle_worker_v2.py"
    files["sglang/srt/speculative/eagle_worker_v2.py"] = worker_with(worker.read_text())
    return files
