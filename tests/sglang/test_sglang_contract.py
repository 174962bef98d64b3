"""The contract with SGLang 0.5.23, checked against its released source (the wheel).

SGLang needs CUDA, so nothing of it is installed. Three parts:

1. Static (:mod:`ast` on the wheel's files): ``AdaptiveSpecPolicy``'s members and signatures are
   those ``av_core.sglang`` implements and checks (``POLICY_METHODS``), ``AdaptiveController``
   and the worker hooks have the signatures the installer checks, ``EAGLEWorkerV2.__init__``
   builds its policy at exactly one ``AdaptiveSpeculativeParams(initial_steps=..., cfg_path=...)``
   bound from ``adaptive_spec_params``, the scheduler feeds ``on_verify_complete_cpu`` with
   ``batch_size`` and loads the ``sglang.srt.plugins`` entry points (our pyproject's group)
   before building workers, and SGLang's default adaptive configuration is the one
   ``av_core.tools.peers`` reproduces.
2. Live, on CPU: the wheel's ``adaptive_runtime_state.py`` and ``adaptive_spec_params.py`` are
   imported as released (stand-ins for the four small modules the latter imports), and a
   stand-in worker module carries ``EAGLEWorkerV2``'s own ``__init__``,
   ``on_verify_complete_cpu`` and ``activate_step_by_batch`` taken from the wheel. ``install``
   passes its checks on them, ``EAGLEWorkerV2(...)`` then builds av_core's policy, and SGLang's
   ``AdaptiveController`` drives it through 400 synthetic verify rounds, each choice checked
   against a brute-force search. SGLang's own ``AdaptiveSpeculativeParams`` runs the same rounds:
   ``av_core.tools.peers.EmaTierPolicy`` reproduces every one of its choices.
3. Refusal: on modified sources (a signature, the construction site, the controller's use of
   the policy, the version) ``install`` raises and patches nothing.

The wheel is fetched once by ``scripts/fetch_reference_wheels.py`` (``pip download --no-deps
sglang==0.5.23``) into ``~/.cache/av_core/sglang-0.5.23`` (``AV_CORE_CACHE`` moves
``~/.cache/av_core``, ``AV_CORE_SGLANG_WHEEL`` names a wheel to use instead). Without it
(offline) these tests are skipped with that reason; ``.ci/run`` prefetches it.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import json
import logging
import sys
import tomllib
import zipfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import sglang_main_reproduction as main
from test_sglang import geometric_counts, reference_choice, reference_rates

from av_core import CostTables
from av_core import sglang as av_sglang
from av_core._engine_interface import compare_signatures, signature_text
from av_core.sglang import (
    CONTROLLER_SIGNATURES,
    PARAMS_MODULE,
    POLICY_METHODS,
    RUNTIME_STATE_MODULE,
    WORKER_MODULE,
    CostAwarePolicy,
    SglangCompatibilityError,
)
from av_core.tools.peers import SGLANG_DEFAULT_TIERS, EmaTier, EmaTierPolicy

SGLANG_VERSION = "0.5.23"
FETCH_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "fetch_reference_wheels.py"
PATHS = {
    RUNTIME_STATE_MODULE: "sglang/srt/speculative/adaptive_runtime_state.py",
    PARAMS_MODULE: "sglang/srt/speculative/adaptive_spec_params.py",
    WORKER_MODULE: "sglang/srt/speculative/eagle_worker_v2.py",
    "processor": "sglang/srt/managers/scheduler_components/batch_result_processor.py",
    "scheduler": "sglang/srt/managers/scheduler.py",
    "plugins": "sglang/srt/plugins/__init__.py",
    "version": "sglang/_version.py",
}
ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.sglang


# --- the released wheel ---------------------------------------------------------------------


def sglang_wheel() -> Path:
    """The SGLang wheel from the cache, downloaded once (``scripts/fetch_reference_wheels.py``,
    which ``.ci/run`` runs first); skips with the reason offline."""
    spec = importlib.util.spec_from_file_location("fetch_reference_wheels", FETCH_SCRIPT)
    assert spec is not None and spec.loader is not None
    fetcher = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fetcher)
    try:
        wheel: Path = fetcher.fetch("sglang", SGLANG_VERSION)
    except RuntimeError as error:
        pytest.skip(f"SGLang {SGLANG_VERSION} wheel unavailable: {error}")
    return wheel


@pytest.fixture(scope="module")
def sources() -> dict[str, str]:
    with zipfile.ZipFile(sglang_wheel()) as archive:
        return {name: archive.read(path).decode() for name, path in PATHS.items()}


# --- 1. static checks -----------------------------------------------------------------------


def arguments_text(arguments: ast.arguments) -> str:
    """A def's parameters in ``signature_text``'s notation."""
    parts: list[str] = []
    positional = arguments.posonlyargs + arguments.args
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(arguments.defaults))
    defaults += arguments.defaults
    for arg, default in zip(positional, defaults, strict=True):
        parts.append(arg.arg if default is None else f"{arg.arg}={ast.unparse(default)}")
    if arguments.vararg is not None:
        parts.append(f"*{arguments.vararg.arg}")
    elif arguments.kwonlyargs:
        parts.append("*")
    for arg, kw_default in zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True):
        parts.append(arg.arg if kw_default is None else f"{arg.arg}={ast.unparse(kw_default)}")
    if arguments.kwarg is not None:
        parts.append(f"**{arguments.kwarg.arg}")
    return "(" + ", ".join(parts) + ")"


def classes(source: str) -> dict[str, ast.ClassDef]:
    return {n.name: n for n in ast.parse(source).body if isinstance(n, ast.ClassDef)}


def methods(node: ast.ClassDef) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in node.body if isinstance(n, ast.FunctionDef)}


def segment(source: str, node: ast.AST) -> str:
    lines = source.splitlines(keepends=True)
    return "".join(lines[node.lineno - 1 : node.end_lineno])  # type: ignore[attr-defined]


def contract_problems(src: Mapping[str, str]) -> list[str]:
    """Every difference between the released sources and what av_core.sglang relies on."""
    problems: list[str] = []
    runtime = classes(src[RUNTIME_STATE_MODULE])
    protocol = runtime.get("AdaptiveSpecPolicy")
    if protocol is None:
        return ["AdaptiveSpecPolicy: not found"]
    members = methods(protocol)
    if set(members) != {*POLICY_METHODS, "candidate_steps"}:
        problems.append(f"AdaptiveSpecPolicy members {sorted(members)}")
    for name, text in POLICY_METHODS.items():
        if name in members and arguments_text(members[name].args) != text:
            problems.append(f"AdaptiveSpecPolicy.{name}{arguments_text(members[name].args)}")
    steps = members.get("candidate_steps")
    if steps is None or not any(
        isinstance(d, ast.Name) and d.id == "property" for d in steps.decorator_list
    ):
        problems.append("AdaptiveSpecPolicy.candidate_steps is not a property")
    by_module = {
        RUNTIME_STATE_MODULE: runtime,
        PARAMS_MODULE: classes(src[PARAMS_MODULE]),
        WORKER_MODULE: classes(src[WORKER_MODULE]),
    }
    for (module, dotted), text in CONTROLLER_SIGNATURES.items():
        class_name, method = dotted.split(".")
        node = methods(by_module[module][class_name]).get(method)
        found = None if node is None else arguments_text(node.args)
        if found != text:
            problems.append(f"{module}.{dotted}{found} is not {text}")
    controller = segment(src[RUNTIME_STATE_MODULE], runtime["AdaptiveController"])
    used = av_sglang.policy_calls(controller)
    if not set(used) <= {*POLICY_METHODS, "candidate_steps"} or not {
        "get_steps_for_batch",
        "on_verify_complete",
    } <= set(used):
        problems.append(f"AdaptiveController uses the policy's {sorted(used)}")
    worker_tree = ast.parse(src[WORKER_MODULE])
    imported = [
        n
        for n in worker_tree.body
        if isinstance(n, ast.ImportFrom)
        and n.module == PARAMS_MODULE
        and any(a.name == "AdaptiveSpeculativeParams" and a.asname is None for a in n.names)
    ]
    if len(imported) != 1:
        problems.append("eagle_worker_v2 does not import AdaptiveSpeculativeParams by name")
    init = methods(by_module[WORKER_MODULE]["EAGLEWorkerV2"])["__init__"]
    if len(av_sglang.construction_sites(segment(src[WORKER_MODULE], init))) != 1:
        problems.append("EAGLEWorkerV2.__init__: not one construction site")
    forward = methods(by_module[WORKER_MODULE]["EAGLEWorkerV2"])["forward_batch_generation"]
    if "self.activate_step_by_batch(batch.seq_lens.shape[0])" not in ast.unparse(forward):
        problems.append("EAGLEWorkerV2.forward_batch_generation: no activate_step_by_batch")
    feeds = [
        n
        for n in ast.walk(ast.parse(src["processor"]))
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "on_verify_complete_cpu"
    ]
    if len(feeds) != 1 or [k.arg for k in feeds[0].keywords] != ["batch_size"]:
        problems.append("the scheduler does not feed on_verify_complete_cpu(..., batch_size=)")
    scheduler = next(
        n
        for n in ast.parse(src["scheduler"]).body
        if isinstance(n, ast.FunctionDef) and n.name == "run_scheduler_process"
    )
    first = scheduler.body[0]
    if not (isinstance(first, ast.Expr) and ast.unparse(first) == "load_plugins()"):
        problems.append("run_scheduler_process does not start with load_plugins()")
    groups = {
        t.id: n.value.value
        for n in ast.parse(src["plugins"]).body
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    group = groups.get("GENERAL_PLUGINS_GROUP")
    if declared.get(group, {}).get("av_core") != "av_core.sglang:register":
        problems.append(f"pyproject declares no av_core entry point in {group!r}")
    return problems


def test_wheel_is_the_expected_release(sources: dict[str, str]) -> None:
    assert f"__version__ = version = '{SGLANG_VERSION}'" in sources["version"]


def test_released_source_matches_every_relied_on_interface(sources: dict[str, str]) -> None:
    assert contract_problems(sources) == []
    # av_core's side of the protocol takes every call the released protocol allows.
    for name, text in POLICY_METHODS.items():
        assert compare_signatures(text, signature_text(getattr(CostAwarePolicy, name))).kind in (
            "same",
            "additive",
        )
    assert isinstance(CostAwarePolicy.__dict__["candidate_steps"], property)


@pytest.mark.parametrize(
    ("module", "old", "new"),
    [
        (
            RUNTIME_STATE_MODULE,
            "    def get_steps_for_batch(self, batch_size: int) -> int: ...",
            "    def get_steps_for_batch(self, batch_size: int, tokens: int) -> int: ...",
        ),
        (
            RUNTIME_STATE_MODULE,
            "target = self.params.get_steps_for_batch(batch_size)",
            "target = self.params.steps_for(batch_size)",
        ),
        (
            WORKER_MODULE,
            "                    initial_steps=self.speculative_num_steps,\n",
            "                    self.speculative_num_steps,\n",
        ),
        ("processor", "batch_size=len(batch.reqs)", "len(batch.reqs)"),
    ],
)
def test_a_changed_upstream_source_fails_the_static_check(
    sources: dict[str, str], module: str, old: str, new: str
) -> None:
    assert old in sources[module]
    assert contract_problems({**sources, module: sources[module].replace(old, new)}) != []


def test_sglang_default_configuration_is_the_one_reproduced(sources: dict[str, str]) -> None:
    tree = ast.parse(sources[PARAMS_MODULE])
    default = next(
        n.value
        for n in tree.body
        if isinstance(n, ast.AnnAssign)
        and isinstance(n.target, ast.Name)
        and n.target.id == "DEFAULT_ADAPTIVE_CONFIG"
    )
    config = ast.literal_eval(default)
    assert {int(k): v["candidate_steps"] for k, v in config.items()} == {
        k: list(t.candidate_steps) for k, t in SGLANG_DEFAULT_TIERS.items()
    }
    slot = methods(classes(sources[PARAMS_MODULE])["AdaptiveStepSlot"])["__init__"]
    defaults = {
        n.args[0].value: ast.literal_eval(n.args[1])
        for n in ast.walk(slot)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "get"
        and len(n.args) == 2
    }
    tier = EmaTier((1,))
    assert defaults == {
        "ema_alpha": tier.ema_alpha,
        "update_interval": tier.update_interval,
        "warmup_batches": tier.warmup_batches,
        "down_hysteresis": tier.down_hysteresis,
        "up_hysteresis": tier.up_hysteresis,
        "ceiling_coeff": tier.ceiling_coeff,
    }
    for key, entry in config.items():
        ours = SGLANG_DEFAULT_TIERS[int(key)]
        assert (entry["up_hysteresis"], entry["down_hysteresis"], entry["ceiling_coeff"]) == (
            ours.up_hysteresis,
            ours.down_hysteresis,
            ours.ceiling_coeff,
        )


# --- 2. live: the released pieces on CPU ------------------------------------------------------

STANDINS = {
    "sglang/srt/arg_groups/overrides.py": (
        "def resolved_view(args):\n    return args\n\n\n"
        "def resolving_view(args):\n    return args\n"
    ),
    "sglang/srt/runtime_context.py": "def attn_dp_enabled_of(view):\n    return False\n",
    "sglang/srt/speculative/spec_info.py": (
        "class SpeculativeAlgorithm:\n    @staticmethod\n    def from_string(name):\n"
        "        return name\n"
    ),
    "sglang/srt/utils.py": "def log_info_on_rank0(logger, message):\n    logger.info(message)\n",
    "sglang/srt/speculative/_standins.py": main.STANDINS_SOURCE,
}

#: ``EAGLEWorkerV2``'s own methods taken from the wheel (``forward_batch_generation`` is only
#: read, by the installer's call-site check); the runtime-state methods are stand-ins.
WORKER_METHODS = (
    "__init__",
    "on_verify_complete_cpu",
    "activate_step_by_batch",
    "forward_batch_generation",
)


@contextlib.contextmanager
def sglang_on_cpu(
    src: Mapping[str, str], root: Path, version: str = SGLANG_VERSION
) -> Iterator[dict[str, ModuleType]]:
    """Imports the released adaptive modules (and the stand-in worker) from ``root``; removes
    every ``sglang`` module and undoes any install afterwards."""
    files = {
        "sglang/__init__.py": f"__version__ = {version!r}\n",
        "sglang/srt/__init__.py": "",
        "sglang/srt/arg_groups/__init__.py": "",
        "sglang/srt/speculative/__init__.py": "",
        **STANDINS,
        PATHS[RUNTIME_STATE_MODULE]: src[RUNTIME_STATE_MODULE],
        PATHS[PARAMS_MODULE]: src[PARAMS_MODULE],
        PATHS[WORKER_MODULE]: main.worker_with(src[WORKER_MODULE], WORKER_METHODS),
        # Read (not imported) by the installer: where the scheduler feeds the verify counts.
        "sglang/srt/managers/scheduler_components/__init__.py": "",
        PATHS["processor"]: src["processor"],
    }
    with main.importable(files, root) as modules:
        yield modules


def gpu_like_tables(k: int, max_reqs: int = 512) -> CostTables:
    tokens = np.arange(max_reqs * (k + 1) + 1)
    verify = 6.0 + np.maximum(0, tokens - 256) * 0.03
    return CostTables(np.full(max_reqs + 1, 0.6 * k), verify).with_draft_depth(
        "autoregressive", max_depth=k
    )


CONFIG = {
    "1": {"candidate_steps": [1, 2, 3, 5]},
    "8": {"candidate_steps": [0, 1, 2, 3], "down_hysteresis": 0.0},
    "64": {"candidate_steps": [0, 1, 2], "down_hysteresis": 0.0},
}
GRAPH_BS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]


def padded(batch: int) -> int:
    return next((b for b in GRAPH_BS if b >= batch), batch)


def tier_of(batch: int) -> int:
    return max([k for k in (1, 8, 64) if k <= batch] or [1])


def rounds_script(seed: int, n: int = 400) -> list[tuple[int, list[float]]]:
    """Batch sizes and true per-position acceptance: small confident batches, then medium, then
    a high load with poor drafts, then small batches with good drafts again."""
    rng = np.random.default_rng(seed)
    script = []
    for t in range(n):
        if t < 100:
            script.append((int(rng.integers(1, 8)), [0.9, 0.85, 0.8, 0.8, 0.7]))
        elif t < 200:
            script.append((int(rng.integers(8, 64)), [0.8, 0.7, 0.6, 0.5, 0.5]))
        elif t < 300:
            script.append((int(rng.integers(64, 513)), [0.1, 0.1, 0.1, 0.1, 0.1]))
        else:
            script.append((int(rng.integers(1, 48)), [0.95, 0.9, 0.9, 0.85, 0.8]))
    return script


TIERS = {int(key): entry["candidate_steps"] for key, entry in CONFIG.items()}


def expected_steps(
    price: Callable[[int, list[int]], dict[int, float]],
    margin: float,
    interval: int,
) -> Callable[[int], int]:
    """The brute-force decision of each batch with hysteresis and probes, on :data:`CONFIG`'s
    tiers (``price``: the reference rates of a batch's candidates, from the policy's estimator
    as it stands)."""
    current: dict[int, int | None] = {1: None, 8: 2, 64: 2}
    since_probe = [0]

    def decide(batch: int) -> int:
        tier = tier_of(padded(batch))
        allowed = TIERS[tier]
        rates = price(batch, allowed)
        best = reference_choice(rates)
        running = current[tier]
        keep = running is not None and rates[best] <= rates[running] * (1 + margin)
        choice = running if keep and running is not None else best
        current[tier] = choice
        higher = [s for s in allowed if s > choice]
        if higher:
            since_probe[0] += 1
            if since_probe[0] > interval:
                since_probe[0] = 0
                return higher[0]
        return choice

    return decide


def drive_rounds(
    worker: Any,
    policy: CostAwarePolicy,
    tables: CostTables,
    margin: float,
    interval: int,
    *,
    num_steps: bool | None = None,
) -> list[int]:
    """SGLang's worker hooks through :func:`rounds_script`'s 400 rounds, each step the worker
    runs checked against :func:`expected_steps` priced by the reference; the verify reports the
    steps (``num_steps=True``, SGLang main), ``None`` (``False``) or has no such argument
    (``None``, 0.5.23). Returns the steps run."""
    depth = tables.draft_depth_ms
    assert depth is not None

    def price(batch: int, allowed: list[int]) -> dict[int, float]:
        return reference_rates(
            policy.estimator.intercepts,
            tables.draft_ms,
            depth,
            tables.verify_ms,
            batch,
            allowed,
            extend_at_zero=True,  # the installer's default: SGLang runs draft-extend at 0
        )

    decide = expected_steps(price, margin, interval)
    rng = np.random.default_rng(11)
    history = []
    for t, (batch, p) in enumerate(rounds_script(0)):
        expected = decide(batch)
        worker.activate_step_by_batch(batch)  # SGLang's own hook → controller → policy
        steps = worker.speculative_num_steps
        assert steps == expected, (t, batch)
        history.append(steps)
        counts = geometric_counts(rng, p, steps, batch)
        if num_steps is None:
            worker.on_verify_complete_cpu(counts, batch_size=batch)
        else:
            worker.on_verify_complete_cpu(
                counts, batch_size=batch, num_steps=steps if num_steps else None
            )
    return history


def test_install_passes_on_the_released_modules_and_builds_the_policy(
    sources: dict[str, str], tmp_path: Path
) -> None:
    with sglang_on_cpu(sources, tmp_path) as modules:
        worker_module_ = modules[WORKER_MODULE]
        assert av_sglang.check_interface(modules, SGLANG_VERSION) == []
        # The scheduler's feed is read from its file: not found is a difference, not a pass.
        unseen = av_sglang.check_interface(
            modules, SGLANG_VERSION, sources={av_sglang.PROCESSOR_MODULE: None}
        )
        assert len(unseen) == 1 and av_sglang.PROCESSOR_MODULE in unseen[0]
        original = worker_module_.AdaptiveSpeculativeParams
        assert av_sglang.install(cost_tables=gpu_like_tables(7)) == [
            f"{WORKER_MODULE}.AdaptiveSpeculativeParams"
        ]
        assert signature_text(worker_module_.AdaptiveSpeculativeParams) == (
            "(initial_steps, cfg_path=None)"
        )
        worker = worker_module_.EAGLEWorkerV2(None, 0, 0, None)  # SGLang's own __init__
        policy = worker.adaptive_controller.params
        assert isinstance(policy, CostAwarePolicy)
        assert policy.candidate_steps == [0, 1, 3, 5, 7]  # SGLang's default tiers
        assert set(policy.expected_rates(100)) == {0}
        av_sglang.uninstall()
        assert worker_module_.AdaptiveSpeculativeParams is original
        assert not isinstance(
            worker_module_.EAGLEWorkerV2(None, 0, 0, None).adaptive_controller.params,
            CostAwarePolicy,
        )


def test_sglang_controller_drives_the_policy_through_verify_rounds(
    sources: dict[str, str], tmp_path: Path
) -> None:
    config_path = tmp_path / "adaptive.json"
    config_path.write_text(json.dumps(CONFIG))
    k, interval, margin = 5, 25, 0.02
    tables = gpu_like_tables(k)
    depth = tables.draft_depth_ms
    assert depth is not None
    with sglang_on_cpu(sources, tmp_path / "pkg") as modules:
        standins = sys.modules["sglang.srt.speculative._standins"]
        standins.SPEC.speculative_adaptive_config = str(config_path)  # type: ignore[attr-defined]
        standins.SPEC.speculative_num_steps = 2  # type: ignore[attr-defined]
        standins.SPEC.speculative_num_draft_tokens = 3  # type: ignore[attr-defined]
        av_sglang.install(cost_tables=tables, hysteresis=margin, probe_interval=interval)
        worker = modules[WORKER_MODULE].EAGLEWorkerV2(None, 0, 0, None)
        controller = worker.adaptive_controller
        policy = controller.params
        assert isinstance(policy, CostAwarePolicy)
        runtime = modules[RUNTIME_STATE_MODULE]
        controller.register(runtime.SpecRuntimeState(2, 3, None, None, None, None, None, None))
        controller.init_states(cuda_graph_bs=GRAPH_BS)
        # Graphs are captured where a tier may run the step, as SGLang's own policy does.
        for steps, graph_bs in worker.built.items():
            assert graph_bs == [b for b in GRAPH_BS if steps in TIERS[tier_of(b)]], steps
        assert sorted(worker.built) == [0, 1, 3, 5]  # 2 was registered first

        history = drive_rounds(worker, policy, tables, margin, interval)
        assert policy.counters.observed == sum(1 for s in history if s > 0)
        assert policy.counters.unmatched == 0 and policy.counters.inconsistent == 0
        assert 0 in history[200:300]  # poor drafts at high load: no speculation
        assert min(history[320:]) >= 1  # small batches and good drafts: back on
        assert len(set(history[:100])) > 1 and policy.counters.probes > 0


def test_sglang_own_policy_on_the_same_rounds_is_reproduced(
    sources: dict[str, str], tmp_path: Path
) -> None:
    """SGLang's AdaptiveSpeculativeParams under its AdaptiveController: av_core.tools.peers'
    EmaTierPolicy (routing the CUDA-graph-padded batch size) makes every same choice; and on the
    same verify rounds av_core's policy serves more tokens per modelled ms."""
    config_path = tmp_path / "adaptive.json"
    config_path.write_text(json.dumps(CONFIG))
    k = 5
    tables = gpu_like_tables(k)
    with sglang_on_cpu(sources, tmp_path / "pkg") as modules:
        runtime, params = modules[RUNTIME_STATE_MODULE], modules[PARAMS_MODULE]

        def drive(policy: Any) -> tuple[list[int], float]:
            worker = main.standin_worker(runtime)
            controller = runtime.AdaptiveController(worker, policy)
            controller.register(runtime.SpecRuntimeState(2, 3, *[None] * 6))
            controller.init_states(cuda_graph_bs=GRAPH_BS)
            rng = np.random.default_rng(3)  # the same verdict draws for both policies
            steps_run, tokens, ms = [], 0.0, 0.0
            for batch, p in rounds_script(1):
                controller.activate_step_by_batch(batch)
                steps = worker.speculative_num_steps
                counts = geometric_counts(rng, p, steps, batch)
                controller.on_verify_complete(counts, batch)
                steps_run.append(steps)
                tokens += batch + sum(counts)
                extend = steps if steps else 1
                ms += tables.draft_cost_ms(batch, extend) + tables.verify_ms[batch * (steps + 1)]
            return steps_run, tokens / ms

        sglang_steps, sglang_rate = drive(params.AdaptiveSpeculativeParams(2, str(config_path)))
        ours = EmaTierPolicy(
            {
                int(key): EmaTier(
                    tuple(entry["candidate_steps"]),
                    down_hysteresis=entry.get("down_hysteresis", -0.25),
                )
                for key, entry in CONFIG.items()
            },
            initial_steps=2,
        )
        reproduced = []
        rng = np.random.default_rng(3)
        for batch, p in rounds_script(1):
            steps = ours.steps_for(padded(batch))
            reproduced.append(steps)
            ours.update(geometric_counts(rng, p, steps, batch), padded(batch))
        assert reproduced == sglang_steps
        assert len(set(sglang_steps)) > 2
        av_core_steps, av_core_rate = drive(
            CostAwarePolicy(
                tables,
                {int(key): entry["candidate_steps"] for key, entry in CONFIG.items()},
                initial_steps=2,
                draft_extend_at_zero=True,
            )
        )
        assert av_core_rate > sglang_rate


# --- 3. refusal -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("module", "old", "new", "message"),
    [
        (
            RUNTIME_STATE_MODULE,
            "    def get_steps_for_batch(self, batch_size: int) -> int: ...",
            "    def get_steps_for_batch(self, batch_size: int, tokens: int) -> int: ...",
            "AdaptiveSpecPolicy.get_steps_for_batch",
        ),
        (
            RUNTIME_STATE_MODULE,
            "    def cuda_graph_bs_for_step(self, step: int) -> list[int] | None: ...",
            "    def cuda_graph_bs_for_step(self, step: int) -> list[int] | None: ...\n\n"
            "    def reset(self) -> None: ...",
            "AdaptiveSpecPolicy.reset.*does not implement it",
        ),
        (
            RUNTIME_STATE_MODULE,
            "target = self.params.get_steps_for_batch(batch_size)",
            "target = self.params.steps_for(batch_size)",
            "does not implement",
        ),
        (
            PARAMS_MODULE,
            "        cfg_path: str | None = None,\n    ):\n        cfg, bs_entries",
            "        cfg_path: str | None = 'adaptive.json',\n    ):\n        cfg, bs_entries",
            "AdaptiveSpeculativeParams.__init__",
        ),
        (
            WORKER_MODULE,
            "                    initial_steps=self.speculative_num_steps,\n",
            "                    self.speculative_num_steps,\n",
            "expected one AdaptiveController",
        ),
        (
            WORKER_MODULE,
            "self, num_correct_drafts_per_req: list[int], batch_size: int = 0\n    ) -> None:\n"
            "        if self.adaptive_controller",
            "self, num_correct_drafts_per_req: list[int], batch_size: int = 1\n    ) -> None:\n"
            "        if self.adaptive_controller",
            "on_verify_complete_cpu",
        ),
        (
            WORKER_MODULE,
            "            self.activate_step_by_batch(batch.seq_lens.shape[0])\n",
            "            pass\n",
            "forward_batch_generation no longer calls self.activate_step_by_batch",
        ),
        (
            WORKER_MODULE,
            "num_correct_drafts_per_req, batch_size=batch_size\n",
            "num_correct_drafts_per_req\n",
            "does not pass batch_size=",
        ),
        (
            "processor",
            "result.num_correct_drafts_per_req_cpu, batch_size=len(batch.reqs)",
            "result.num_correct_drafts_per_req_cpu",
            "batch_result_processor: .*does not pass batch_size=",
        ),
    ],
)
def test_install_refuses_and_patches_nothing_on_a_changed_sglang(
    sources: dict[str, str], tmp_path: Path, module: str, old: str, new: str, message: str
) -> None:
    assert sources[module].count(old) == 1
    changed = {**sources, module: sources[module].replace(old, new)}
    with sglang_on_cpu(changed, tmp_path) as modules:
        original = modules[WORKER_MODULE].AdaptiveSpeculativeParams
        with pytest.raises(SglangCompatibilityError, match=message):
            av_sglang.install(cost_tables=gpu_like_tables(7))
        assert modules[WORKER_MODULE].AdaptiveSpeculativeParams is original
        assert av_sglang.installed() == []


def test_a_newer_version_installs_on_matching_interfaces_an_older_one_only_when_waived(
    sources: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before, any version but 0.5.23 was refused, so the day SGLang shipped a release av_core
    stopped installing whatever the release changed."""
    with sglang_on_cpu(sources, tmp_path / "new", version="0.5.24") as modules:
        with caplog.at_level(logging.INFO, logger="sglang.av_core"):
            assert av_sglang.install(cost_tables=gpu_like_tables(7))
        assert modules[WORKER_MODULE].AdaptiveSpeculativeParams is not (
            modules[PARAMS_MODULE].AdaptiveSpeculativeParams
        )
        assert any("0.5.24 is not one of the releases" in r.getMessage() for r in caplog.records)
    with sglang_on_cpu(sources, tmp_path / "old", version="0.5.22") as modules:
        with pytest.raises(SglangCompatibilityError, match="version 0.5.22 is older"):
            av_sglang.install(cost_tables=gpu_like_tables(7))
        assert av_sglang.installed() == []
        monkeypatch.setenv(av_sglang.ENV_ANY_VERSION, "1")
        assert av_sglang.install(cost_tables=gpu_like_tables(7))
        assert modules[WORKER_MODULE].AdaptiveSpeculativeParams is not (
            modules[PARAMS_MODULE].AdaptiveSpeculativeParams
        )


def test_register_installs_only_when_asked(
    sources: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    costs = tmp_path / "tables.json"
    costs.write_text(gpu_like_tables(7).to_json())
    with sglang_on_cpu(sources, tmp_path / "pkg") as modules:
        monkeypatch.delenv(av_sglang.ENV_ENABLE, raising=False)
        av_sglang.register()
        assert av_sglang.installed() == []
        monkeypatch.setenv(av_sglang.ENV_ENABLE, "1")
        monkeypatch.delenv(av_sglang.ENV_COSTS, raising=False)
        with pytest.raises(ValueError, match=av_sglang.ENV_COSTS):
            av_sglang.register()
        assert av_sglang.installed() == []
        monkeypatch.setenv(av_sglang.ENV_COSTS, str(costs))
        av_sglang.register()
        worker = modules[WORKER_MODULE].EAGLEWorkerV2(None, 0, 0, None)
        policy = worker.adaptive_controller.params
        assert isinstance(policy, CostAwarePolicy)
        assert policy.cost_tables == gpu_like_tables(7)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("ENV_ANY_VERSION", "sure"),
        ("ENV_SKIP_ZERO_STEP_EXTEND", "2"),
        ("ENV_SKIP_ZERO_STEP_EXTEND", "on"),  # SGLang's own reader takes it as off
        ("AV_CORE_SIMD", "sse2"),
    ],
)
def test_install_refuses_a_setting_it_does_not_take_before_patching(
    sources: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    variable: str,
    value: str,
) -> None:
    """Before, an unknown spelling of a switch (``on``, ``2``, a typo) was quietly off."""
    name = getattr(av_sglang, variable, variable)
    with sglang_on_cpu(sources, tmp_path) as modules:
        original = modules[WORKER_MODULE].AdaptiveSpeculativeParams
        monkeypatch.setenv(name, value)
        with pytest.raises(ValueError, match=f"{name}") as error:
            av_sglang.install(cost_tables=gpu_like_tables(7))
        assert repr(value) in str(error.value) or f'"{value}"' in str(error.value)
        assert modules[WORKER_MODULE].AdaptiveSpeculativeParams is original
        assert av_sglang.installed() == []


@pytest.mark.parametrize(
    ("value", "on"), [("on", True), (" TRUE ", True), ("off", False), ("", False)]
)
def test_register_reads_the_switch_in_every_spelling(
    sources: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str, on: bool
) -> None:
    costs = tmp_path / "tables.json"
    costs.write_text(gpu_like_tables(7).to_json())
    with sglang_on_cpu(sources, tmp_path / "pkg"):
        monkeypatch.setenv(av_sglang.ENV_ENABLE, value)
        monkeypatch.setenv(av_sglang.ENV_COSTS, str(costs))
        av_sglang.register()
        assert bool(av_sglang.installed()) is on
        av_sglang.uninstall()


def test_register_refuses_an_unknown_switch_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(av_sglang.ENV_ENABLE, "enable")
    with pytest.raises(ValueError, match=f"{av_sglang.ENV_ENABLE}='enable'"):
        av_sglang.register()
    assert av_sglang.installed() == []


@pytest.mark.parametrize(
    ("value", "on"), [("y", True), ("TRUE", True), ("1", True), ("n", False), ("0", False)]
)
def test_sglangs_own_switch_is_read_as_sglang_reads_it(
    monkeypatch: pytest.MonkeyPatch, value: str, on: bool
) -> None:
    from av_core.sglang.installer import _sglang_flag

    monkeypatch.setenv(av_sglang.ENV_SKIP_ZERO_STEP_EXTEND, value)
    assert _sglang_flag(av_sglang.ENV_SKIP_ZERO_STEP_EXTEND) is on
    monkeypatch.delenv(av_sglang.ENV_SKIP_ZERO_STEP_EXTEND)
    assert _sglang_flag(av_sglang.ENV_SKIP_ZERO_STEP_EXTEND) is False


def test_the_mirrored_spellings_are_sglangs() -> None:
    """``SGLANG_ON``/``SGLANG_OFF`` against the two lists of SGLang's own ``EnvBool.parse``,
    read from its source in the reference wheel."""
    from av_core.sglang.installer import SGLANG_OFF, SGLANG_ON

    with zipfile.ZipFile(sglang_wheel()) as archive:
        tree = ast.parse(archive.read("sglang/srt/environ.py").decode())
    env_bool = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "EnvBool")
    lists = [
        [element.value for element in node.comparators[0].elts]  # type: ignore[attr-defined]
        for node in ast.walk(env_bool)
        if isinstance(node, ast.Compare) and isinstance(node.comparators[0], ast.List)
    ]
    assert lists == [list(SGLANG_ON), list(SGLANG_OFF)], lists
