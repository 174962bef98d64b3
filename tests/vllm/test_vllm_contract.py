"""The contract with vLLM, checked against each supported release's own source (0.32.0, 0.33.0).

Three parts:

1. A static checker (``contract_problems``) reads vLLM's ``acceptance_estimator.py`` and
   ``adaptive_verification.py`` with :mod:`ast` and compares every class, method, parameter name,
   kind and default, and every constant, that ``av_core.vllm`` mirrors and
   ``av_core.vllm.plugin`` checks at runtime. The checker is itself tested on hand-written and on
   modified sources, so a changed upstream signature is known to fail it.
2. Differential tests (marked ``vllm``): vLLM's own code, taken from the wheel, run on the host
   next to ours on the same inputs: its Triton estimator under Triton's interpreter (in a
   subprocess), and its numpy/torch budget helpers directly. The plugin is installed over the
   real modules (imported with stub dependencies) to prove its runtime checks pass on them.
3. vLLM's documented numeric behaviour, reproduced with small host tensors and float64
   references (no download): the feature, the damping example, untouched deeper intercepts and
   padded rows.

Every test that reads a release runs once per release in ``RELEASES``. Each wheel is fetched
once by ``scripts/fetch_reference_wheels.py`` (``pip download --no-deps vllm==<version>``) into
``~/.cache/av_core/vllm-<version>`` (``AV_CORE_CACHE`` moves ``~/.cache/av_core``;
``AV_CORE_VLLM_WHEEL`` lists wheels to use instead, separated by ``os.pathsep``) and reused;
``.ci/run`` fetches them before the tests. Without network or cache the tests that read a
release skip with the reason.
"""

from __future__ import annotations

import ast
import importlib.util
import linecache
import os
import subprocess
import sys
import textwrap
import types
import zipfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from av_core import vllm as av_vllm  # noqa: E402
from av_core.vllm import OnlineAcceptanceEstimator  # noqa: E402
from av_core.vllm import plugin as vllm_plugin  # noqa: E402
from av_core.vllm.plugin import BUDGET_MODULE, ESTIMATOR_MODULE  # noqa: E402

import reference  # noqa: E402

#: The releases checked, one of each line the plugin accepts (vllm_plugin.SUPPORTED_VLLM_VERSIONS).
RELEASES = ("0.32.0", "0.33.0")
FETCH_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "fetch_reference_wheels.py"
SPEC_DECODE = "vllm/v1/worker/gpu/spec_decode"
PATHS = {
    ESTIMATOR_MODULE: f"{SPEC_DECODE}/acceptance_estimator.py",
    BUDGET_MODULE: f"{SPEC_DECODE}/adaptive_verification.py",
}
CPU = torch.device("cpu")

# What each mirrored vLLM definition is mirrored by.
DROP_INS: dict[tuple[str, str], Callable[..., Any]] = {
    (ESTIMATOR_MODULE, "OnlineAcceptanceEstimator.__init__"): OnlineAcceptanceEstimator.__init__,
    (ESTIMATOR_MODULE, "OnlineAcceptanceEstimator.step"): OnlineAcceptanceEstimator.step,
    (ESTIMATOR_MODULE, "OnlineAcceptanceEstimator.predict"): OnlineAcceptanceEstimator.predict,
    (BUDGET_MODULE, "build_cost_tables_from_curves"): av_vllm.build_cost_tables_from_curves,
    (BUDGET_MODULE, "_assign_draft_token_budget"): av_vllm.assign_draft_token_budget,
    (BUDGET_MODULE, "AdaptiveVerificationManager.get_num_tokens"): vllm_plugin._get_num_tokens,
}
MIRRORED_CONSTANTS: dict[tuple[str, str], float] = {
    (ESTIMATOR_MODULE, "OnlineAcceptanceEstimator.REFIT_INTERVAL"): (
        OnlineAcceptanceEstimator.REFIT_INTERVAL
    ),
    (ESTIMATOR_MODULE, "OnlineAcceptanceEstimator.DAMPING_OBSERVATIONS"): (
        OnlineAcceptanceEstimator.DAMPING_OBSERVATIONS
    ),
    (ESTIMATOR_MODULE, "OnlineAcceptanceEstimator.L2"): OnlineAcceptanceEstimator.L2,
    (ESTIMATOR_MODULE, "_MAX_LOG_ODDS"): av_vllm.MAX_LOG_ODDS,
    (ESTIMATOR_MODULE, "_INIT_SLOPE"): av_vllm.INIT_SLOPE,
    (ESTIMATOR_MODULE, "_INIT_BIAS"): av_vllm.INIT_INTERCEPT,
}
# Instance attributes of vLLM's estimator that ours exposes too.
MIRRORED_ATTRIBUTES = (
    "num_speculative_steps",
    "device",
    "slope",
    "intercepts",
    "features",
    "predictions",
)


# --- the static checker --------------------------------------------------------------------


def arguments_text(arguments: ast.arguments) -> str:
    """A def's parameters in ``vllm_plugin.signature_text``'s notation."""
    parts: list[str] = []
    positional = arguments.posonlyargs + arguments.args
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(arguments.defaults))
    defaults += arguments.defaults
    for index, (arg, default) in enumerate(zip(positional, defaults, strict=True)):
        parts.append(arg.arg if default is None else f"{arg.arg}={ast.unparse(default)}")
        if arguments.posonlyargs and index == len(arguments.posonlyargs) - 1:
            parts.append("/")
    if arguments.vararg is not None:
        parts.append(f"*{arguments.vararg.arg}")
    elif arguments.kwonlyargs:
        parts.append("*")
    for arg, kw_default in zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True):
        parts.append(arg.arg if kw_default is None else f"{arg.arg}={ast.unparse(kw_default)}")
    if arguments.kwarg is not None:
        parts.append(f"**{arguments.kwarg.arg}")
    return "(" + ", ".join(parts) + ")"


def definitions(source: str) -> dict[str, ast.FunctionDef]:
    """Top-level functions and the methods of top-level classes, by dotted name."""
    found: dict[str, ast.FunctionDef] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef):
            found[node.name] = node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    found[f"{node.name}.{item.name}"] = item
    return found


def constants(source: str) -> dict[str, Any]:
    """Literal assignments at module and class level, by dotted name."""

    def literal(target: ast.expr, value: ast.expr | None, prefix: str) -> tuple[str, Any] | None:
        if not isinstance(target, ast.Name) or value is None:
            return None
        try:
            return prefix + target.id, ast.literal_eval(value)
        except ValueError:
            return None

    found: dict[str, Any] = {}
    for node in ast.parse(source).body:
        scopes = [(node, "")]
        if isinstance(node, ast.ClassDef):
            scopes = [(item, f"{node.name}.") for item in node.body]
        for statement, prefix in scopes:
            pair = None
            if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
                pair = literal(statement.targets[0], statement.value, prefix)
            elif isinstance(statement, ast.AnnAssign):
                pair = literal(statement.target, statement.value, prefix)
            if pair is not None:
                found[pair[0]] = pair[1]
    return found


def module_names(source: str) -> set[str]:
    """Every name bound at module level (defs, classes, assignments)."""
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def self_attributes(function: ast.FunctionDef) -> set[str]:
    """Names ``X`` of every ``self.X = ...`` in a method."""
    names: set[str] = set()
    for node in ast.walk(function):
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            if (
                isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.value.id == "self"
            ):
                names.add(target.attr)
    return names


def mirrors(ours: str, theirs: str) -> bool:
    """Our signature mirrors theirs: identical, or theirs followed by keyword-only parameters
    that all have defaults (so every call vLLM makes means the same)."""
    if ours == theirs:
        return True
    head = theirs[:-1] + ", *, "
    if not ours.startswith(head):
        return False
    extras = ours[len(head) : -1].split(", ")
    return all("=" in extra and not extra.startswith("*") for extra in extras)


def contract_problems(sources: Mapping[str, str]) -> list[str]:
    """Every way vLLM's source differs from what av_core mirrors; empty when it matches."""
    problems: list[str] = []
    defs = {module: definitions(source) for module, source in sources.items()}
    consts = {module: constants(source) for module, source in sources.items()}
    for (module, dotted), expected in vllm_plugin.EXPECTED_SIGNATURES.items():
        node = defs[module].get(dotted)
        if node is None:
            problems.append(f"{dotted}: not defined in {module}")
            continue
        theirs = arguments_text(node.args)
        if theirs != expected:
            problems.append(f"{dotted}{theirs}: the plugin expects {dotted}{expected}")
        ours = vllm_plugin.signature_text(DROP_INS[(module, dotted)])
        if not mirrors(ours, theirs):
            problems.append(f"{dotted}{theirs}: the drop-in has {ours}")
    for (module, dotted), expected_value in vllm_plugin.EXPECTED_CONSTANTS.items():
        if dotted not in consts[module]:
            problems.append(f"{dotted}: no literal assignment in {module}")
            continue
        value = consts[module][dotted]
        if value != expected_value:
            problems.append(f"{dotted} = {value!r}: the plugin expects {expected_value!r}")
        if value != MIRRORED_CONSTANTS[(module, dotted)]:
            problems.append(
                f"{dotted} = {value!r}: the drop-in uses {MIRRORED_CONSTANTS[(module, dotted)]!r}"
            )
    if "_assign_draft_token_budget_compiled" not in module_names(sources[BUDGET_MODULE]):
        problems.append("_assign_draft_token_budget_compiled: not defined")
    get_num_tokens = defs[BUDGET_MODULE].get("AdaptiveVerificationManager.get_num_tokens")
    if get_num_tokens is not None:
        used = {node.attr for node in ast.walk(get_num_tokens) if isinstance(node, ast.Attribute)}
        for name in vllm_plugin.GET_NUM_TOKENS_READS:
            if name not in used:
                problems.append(f"AdaptiveVerificationManager.get_num_tokens no longer uses {name}")
    init = defs[ESTIMATOR_MODULE].get("OnlineAcceptanceEstimator.__init__")
    if init is not None:
        assigned = self_attributes(init)
        for name in MIRRORED_ATTRIBUTES:
            if name not in assigned:
                problems.append(f"OnlineAcceptanceEstimator.__init__ no longer sets self.{name}")
    return problems


# A hand-written pair of sources with vLLM 0.33.0's interface, to test the checker without the
# wheel. Bodies are irrelevant to it.
MINI_SOURCES = {
    ESTIMATOR_MODULE: textwrap.dedent(
        """
        _MAX_LOG_ODDS = 40.0
        _INIT_SLOPE = 0.5
        _INIT_BIAS = -0.2

        class OnlineAcceptanceEstimator:
            REFIT_INTERVAL = 100
            DAMPING_OBSERVATIONS = 50.0
            L2 = 1e-3

            def __init__(self, max_num_reqs: int, num_speculative_steps: int, device):
                self.num_speculative_steps = num_speculative_steps
                self.device = device
                self.slope = self.intercepts = None
                self.features = None
                self.predictions = None

            def step(self, idx_mapping, num_sampled, num_rejected) -> None: ...

            def predict(self, logits, idx_mapping, draft_step, confidence_probs, temperature): ...
        """
    ),
    BUDGET_MODULE: textwrap.dedent(
        """
        def _assign_draft_token_budget(
            confidence_probs, idx_mapping, capacities, draft_budget: int, num_steps: int
        ) -> None: ...

        _assign_draft_token_budget_compiled = _assign_draft_token_budget

        def build_cost_tables_from_curves(
            draft_curve, verify_curve, max_num_reqs, max_batch_tokens, cudagraph_limit: int = 0
        ): ...

        class AdaptiveVerificationManager:
            def get_num_tokens(self, num_tokens_per_req, draft_tokens) -> int:
                self.cost_tables, self.req_states.req_id_to_index, self._stale_idx
                self._stale_confidences, self._max_total_logits, self.num_bonus_tokens
                self.req_states.num_computed_tokens_np, self.req_states.prefill_len.np
                self._batch_budget = None
        """
    ),
}


def test_the_checker_accepts_a_matching_source() -> None:
    assert contract_problems(MINI_SOURCES) == []


@pytest.mark.parametrize(
    ("module", "old", "new", "named"),
    [
        (ESTIMATOR_MODULE, "num_rejected)", "num_rejected, num_bonus)", "step"),
        (ESTIMATOR_MODULE, "idx_mapping, num_sampled", "idx_map, num_sampled", "step"),
        (
            ESTIMATOR_MODULE,
            "confidence_probs, temperature",
            "temperature, confidence_probs",
            "pred",
        ),
        (ESTIMATOR_MODULE, "def predict(", "def predict_acceptance(", "predict"),
        (ESTIMATOR_MODULE, "device):", "device=None):", "__init__"),
        (ESTIMATOR_MODULE, "REFIT_INTERVAL = 100", "REFIT_INTERVAL = 64", "REFIT_INTERVAL"),
        (ESTIMATOR_MODULE, "_INIT_BIAS = -0.2", "_INIT_BIAS = 0.0", "_INIT_BIAS"),
        (ESTIMATOR_MODULE, "self.predictions = None", "self.preds = None", "predictions"),
        (BUDGET_MODULE, "cudagraph_limit: int = 0", "cudagraph_limit: int = 1", "cudagraph"),
        (BUDGET_MODULE, "draft_budget: int, num_steps", "draft_budget: int, *, num_steps", "_as"),
        (BUDGET_MODULE, "self._stale_idx", "self._stale_slot", "_stale_idx"),
        (BUDGET_MODULE, "_compiled = _assign", "_jit = _assign", "_compiled"),
        (BUDGET_MODULE, ", draft_tokens)", ")", "get_num_tokens"),
    ],
)
def test_the_checker_fails_on_a_modified_source(
    module: str, old: str, new: str, named: str
) -> None:
    assert old in MINI_SOURCES[module]
    modified = {**MINI_SOURCES, module: MINI_SOURCES[module].replace(old, new)}
    problems = contract_problems(modified)
    assert problems, (old, new)
    assert any(named in problem for problem in problems), problems


def test_mirrors_allows_only_defaulted_keyword_only_extras() -> None:
    assert mirrors("(self, a, b)", "(self, a, b)")
    assert mirrors("(self, a, b, *, skip=None)", "(self, a, b)")
    assert not mirrors("(self, a, b, skip=None)", "(self, a, b)")
    assert not mirrors("(self, a, b, *, skip)", "(self, a, b)")
    assert not mirrors("(self, a)", "(self, a, b)")


def test_arguments_text_agrees_with_the_plugin_on_live_functions() -> None:
    for function in DROP_INS.values():
        source = textwrap.dedent(inspect_source(function))
        node = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef))
        assert arguments_text(node.args) == vllm_plugin.signature_text(function)


def inspect_source(function: Callable[..., Any]) -> str:
    import inspect

    return inspect.getsource(function)


# --- the released source -----------------------------------------------------------------------


def vllm_wheel(version: str) -> Path:
    """The vLLM ``version`` wheel from the cache, downloaded once
    (``scripts/fetch_reference_wheels.py``, which ``.ci/run`` runs first so CI always has it);
    without it (no network, no cache) the tests that read it skip and say why."""
    spec = importlib.util.spec_from_file_location("fetch_reference_wheels", FETCH_SCRIPT)
    assert spec is not None and spec.loader is not None
    fetcher = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fetcher)
    try:
        wheel: Path = fetcher.fetch("vllm", version)
    except RuntimeError as error:
        pytest.skip(f"vLLM {version} wheel unavailable: {error}")
    return wheel


@pytest.fixture(scope="module", params=RELEASES)
def release(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def wheel(release: str) -> Path:
    return vllm_wheel(release)


@pytest.fixture(scope="module")
def vllm_sources(wheel: Path) -> dict[str, str]:
    with zipfile.ZipFile(wheel) as archive:
        return {module: archive.read(path).decode() for module, path in PATHS.items()}


@pytest.mark.vllm
def test_wheel_is_the_expected_release(wheel: Path, release: str) -> None:
    with zipfile.ZipFile(wheel) as archive:
        version_file = archive.read("vllm/_version.py").decode()
    assert f"__version__ = version = '{release}'" in version_file
    assert vllm_plugin.version_supported(release)


@pytest.mark.vllm
def test_released_source_matches_every_mirrored_interface(vllm_sources: dict[str, str]) -> None:
    assert contract_problems(vllm_sources) == []


@pytest.mark.vllm
@pytest.mark.parametrize(
    ("module", "old", "new"),
    [
        (ESTIMATOR_MODULE, "        num_rejected: torch.Tensor,\n", "        num_bonus: int,\n"),
        (BUDGET_MODULE, "    cudagraph_limit: int = 0,\n", "    cudagraph_limit: int = 8,\n"),
        (ESTIMATOR_MODULE, "    L2 = 1e-3\n", "    L2 = 1e-4\n"),
    ],
)
def test_a_changed_upstream_source_fails_loudly(
    vllm_sources: dict[str, str], module: str, old: str, new: str
) -> None:
    assert old in vllm_sources[module]
    changed = {**vllm_sources, module: vllm_sources[module].replace(old, new)}
    assert contract_problems(changed)


# --- vLLM's own code, run on the host next to ours -----------------------------------------

# Runs vLLM's estimator (its Triton kernels under Triton's interpreter) on a saved scenario,
# in a separate process so that the interpreter flag and the stub `vllm` modules stay there.
_VLLM_RUNNER = """
import ast, os, sys, types, zipfile
os.environ["TRITON_INTERPRET"] = "1"
import torch, triton, triton.language as tl

wheel, scenario_path, out_path = sys.argv[1:4]
archive = zipfile.ZipFile(wheel)
def source(path):
    return archive.read("vllm/v1/worker/gpu/spec_decode/" + path).decode()
def module(name, **attrs):
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    sys.modules[name] = m
    return m
module("vllm")
module("vllm.triton_utils", tl=tl, triton=triton)
helper = next(
    node for node in ast.parse(source("rejection_sampler_utils.py")).body
    if isinstance(node, ast.FunctionDef) and node.name == "_compute_max_and_sumexp"
)
namespace = {"tl": tl, "triton": triton}
exec(compile(ast.Module([helper], []), "rejection_sampler_utils.py", "exec"), namespace)
module(
    "vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils",
    _compute_max_and_sumexp=namespace["_compute_max_and_sumexp"],
)
estimator_module = module("vllm.v1.worker.gpu.spec_decode.acceptance_estimator")
exec(compile(source("acceptance_estimator.py"), "acceptance_estimator.py", "exec"),
     estimator_module.__dict__)

scenario = torch.load(scenario_path)
est = estimator_module.OnlineAcceptanceEstimator(
    scenario["max_num_reqs"], scenario["K"], torch.device("cpu")
)
est.REFIT_INTERVAL = scenario["refit_interval"]
conf = torch.zeros(scenario["max_num_reqs"], scenario["K"])
trajectory = []
for step in scenario["steps"]:
    if "fill" in step:  # features and predictions set directly: the refit's inputs alone
        est.features[step["fill"]["slots"]] = step["fill"]["features"]
        est.predictions[step["fill"]["slots"]] = step["fill"]["predictions"]
    est.step(*step["verdict"])
    trajectory.append(torch.cat([est.slope, est.intercepts]).clone())
    for call in step["predict"]:
        est.predict(call["logits"], call["idx_mapping"], call["draft_step"], conf,
                    scenario["temperature"])
torch.save({"trajectory": torch.stack(trajectory), "features": est.features,
            "predictions": est.predictions, "confidence_probs": conf}, out_path)
"""


def differential_scenario(seed: int) -> dict[str, Any]:
    """Serving steps that mix vLLM's two predict layouts, padding and greedy requests."""
    gen = torch.Generator().manual_seed(seed)
    m, k, vocab = 6, 3, 64
    steps = []
    for index in range(26):
        live = int(torch.randint(1, m + 1, (1,), generator=gen))
        slots = torch.randperm(m, generator=gen)[:live].to(torch.int32)
        calls = []
        if index % 3 == 2:  # a block drafter: one pass, one row per (request, position)
            idx = torch.cat([slots.repeat_interleave(k), torch.full((k,), -1, dtype=torch.int32)])
            scale = torch.rand(len(idx), 1, generator=gen) * 4 + 0.5
            calls.append(
                {
                    "logits": torch.randn(len(idx), vocab, generator=gen) * scale,
                    "idx_mapping": idx,
                    "draft_step": torch.arange(k).repeat(live + 1),
                }
            )
        else:
            idx = torch.cat([slots, torch.full((2,), -1, dtype=torch.int32)])
            for position in range(k):
                scale = torch.rand(len(idx), 1, generator=gen) * 4 + 0.5
                calls.append(
                    {
                        "logits": torch.randn(len(idx), vocab, generator=gen) * scale,
                        "idx_mapping": idx,
                        "draft_step": torch.tensor(position),
                    }
                )
        admitted = torch.randint(0, k + 1, (live,), generator=gen)
        accepted = (torch.rand(live, generator=gen) * (admitted + 1)).floor().long()
        accepted = accepted.clamp(max=admitted)
        verdict = (slots, (accepted + 1).to(torch.int32), (admitted - accepted).to(torch.int32))
        steps.append({"verdict": verdict, "predict": calls})
    temperature = torch.tensor([1.0, 0.0, 0.7, 1.3, -1.0, 0.5])
    return {
        "max_num_reqs": m,
        "K": k,
        "refit_interval": 8,
        "temperature": temperature,
        "steps": steps,
    }


def run_ours(scenario: dict[str, Any]) -> dict[str, torch.Tensor]:
    m, k = scenario["max_num_reqs"], scenario["K"]
    est = OnlineAcceptanceEstimator(m, k, CPU)  # AV_CORE_VLLM_EXACT decides the refit
    est.REFIT_INTERVAL = scenario["refit_interval"]
    conf = torch.zeros(m, k)
    trajectory = []
    for step in scenario["steps"]:
        if "fill" in step:
            est.features[step["fill"]["slots"]] = step["fill"]["features"]
            est.predictions[step["fill"]["slots"]] = step["fill"]["predictions"]
        est.step(*step["verdict"])
        trajectory.append(torch.cat([est.slope, est.intercepts]).clone())
        for call in step["predict"]:
            est.predict(
                call["logits"],
                call["idx_mapping"],
                call["draft_step"],
                conf,
                scenario["temperature"],
            )
    return {
        "trajectory": torch.stack(trajectory),
        "features": est.features,
        "predictions": est.predictions,
        "confidence_probs": conf,
    }


@pytest.mark.vllm
def test_vllm_estimator_and_ours_agree_step_by_step(wheel: Path, tmp_path: Path) -> None:
    pytest.importorskip("triton")
    scenario = differential_scenario(seed=21)
    torch.save(scenario, tmp_path / "scenario.pt")
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _VLLM_RUNNER,
            str(wheel),
            str(tmp_path / "scenario.pt"),
            str(tmp_path / "vllm.pt"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    theirs = torch.load(tmp_path / "vllm.pt")
    ours = run_ours(scenario)
    # Refits at steps 8, 16 and 24 move the coefficients; both move them the same way.
    moved = (theirs["trajectory"][1:] != theirs["trajectory"][:-1]).any(dim=1)
    assert (moved.nonzero().squeeze(1) + 2).tolist() == [8, 16, 24]
    torch.testing.assert_close(ours["trajectory"], theirs["trajectory"], atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(ours["features"], theirs["features"], atol=2e-4, rtol=1e-5)
    torch.testing.assert_close(ours["predictions"], theirs["predictions"], atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(
        ours["confidence_probs"], theirs["confidence_probs"], atol=2e-5, rtol=1e-5
    )


def vllm_functions(source: str, names: list[str]) -> dict[str, Any]:
    """Top-level functions or class methods (``Class.method``) of vLLM's source, compiled on
    their own with numpy and torch in scope (the ones taken here need nothing else)."""
    defs = definitions(source)
    namespace: dict[str, Any] = {"np": np, "torch": torch}
    for name in names:
        node = defs[name]
        exec(compile(ast.Module([node], []), f"<vllm {name}>", "exec"), namespace)  # noqa: S102
    return {name: namespace[name.rsplit(".", 1)[-1]] for name in names}


@pytest.mark.vllm
@pytest.mark.parametrize("graph_limit", [0, 16, 48])
def test_cost_tables_equal_vllms(vllm_sources: dict[str, str], graph_limit: int) -> None:
    theirs = vllm_functions(vllm_sources[BUDGET_MODULE], ["build_cost_tables_from_curves"])
    rng = np.random.default_rng(graph_limit)
    draft = list(zip([1, 2, 4, 8, 16, 32], rng.uniform(0.2, 2, 6).tolist(), strict=True))
    verify = list(zip([1, 8, 16, 32, 64, 96], rng.uniform(1, 9, 6).tolist(), strict=True))
    expected = theirs["build_cost_tables_from_curves"](draft, verify, 40, 160, graph_limit)
    got = av_vllm.build_cost_tables_from_curves(draft, verify, 40, 160, graph_limit)
    for ours_table, their_table in zip(got, expected, strict=True):
        np.testing.assert_allclose(ours_table, their_table, rtol=1e-12, atol=0)


@pytest.mark.vllm
@pytest.mark.parametrize("seed", range(4))
def test_assignment_equals_vllms(vllm_sources: dict[str, str], seed: int) -> None:
    theirs = vllm_functions(vllm_sources[BUDGET_MODULE], ["_assign_draft_token_budget"])
    rng = np.random.default_rng(seed)
    conf = torch.from_numpy(rng.uniform(0.05, 0.99, size=(16, 5)).astype(np.float32))
    idx = torch.from_numpy(rng.permutation(16)[:9].astype(np.int64))
    capacity = torch.from_numpy(rng.integers(0, 6, size=9).astype(np.int32))
    for budget in range(0, int(capacity.sum())):  # vLLM is only called below the total
        expected, got = capacity.clone(), capacity.clone()
        theirs["_assign_draft_token_budget"](conf, idx, expected, budget, 5)
        av_vllm.assign_draft_token_budget(conf, idx, got, budget, 5)
        assert got.tolist() == expected.tolist(), budget


@pytest.mark.vllm
@pytest.mark.parametrize("seed", range(8))
def test_budget_equals_vllms_get_num_tokens(vllm_sources: dict[str, str], seed: int) -> None:
    names = ["build_cost_tables_from_curves", "AdaptiveVerificationManager.get_num_tokens"]
    theirs = vllm_functions(vllm_sources[BUDGET_MODULE], names)
    rng = np.random.default_rng(seed)
    max_reqs, k = 32, 4
    curves = ([(1, 0.3), (8, 0.6), (32, 1.4)], [(1, 2.0), (32, 2.5), (64, 3.6), (256, 11.0)])
    tables = theirs["build_cost_tables_from_curves"](*curves, max_reqs, 256, 32)
    req_ids = [f"r{i}" for i in range(int(rng.integers(1, 24)))]
    slot_of = {r: int(s) for r, s in zip(req_ids, rng.permutation(max_reqs), strict=False)}
    drafts = {r: list(range(int(rng.integers(0, k + 1)))) for r in req_ids}
    tokens = {r: len(drafts[r]) + int(rng.integers(1, 4)) for r in req_ids}
    stale = rng.uniform(0.1, 1.0, size=(max_reqs, k)).astype(np.float32)
    computed = rng.integers(0, 40, size=max_reqs)
    prefill = computed + rng.integers(-2, 5, size=max_reqs)

    def manager(cost_tables: Any) -> types.SimpleNamespace:
        return types.SimpleNamespace(
            cost_tables=cost_tables,
            num_speculative_steps=k,
            num_bonus_tokens=1,
            _max_total_logits=int(rng.integers(len(req_ids), 80)),
            _stale_idx=0,
            _stale_confidences=[types.SimpleNamespace(np=stale)],
            _batch_budget=None,
            req_states=types.SimpleNamespace(
                req_id_to_index=slot_of,
                num_computed_tokens_np=computed,
                prefill_len=types.SimpleNamespace(np=prefill),
            ),
        )

    their_manager = manager(tables)
    our_manager = manager(av_vllm.build_cost_tables_from_curves(*curves, max_reqs, 256, 32))
    our_manager._max_total_logits = their_manager._max_total_logits
    expected = theirs["AdaptiveVerificationManager.get_num_tokens"](their_manager, tokens, drafts)
    got = vllm_plugin._get_num_tokens(our_manager, tokens, drafts)
    assert got == expected
    assert our_manager._batch_budget == their_manager._batch_budget


class _Anything:
    """Stands in for any vLLM dependency the two modules import but these tests never use."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> _Anything:
        return _Anything()

    def __getattr__(self, name: str) -> Any:
        return _Anything()


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything


def load_vllm(
    vllm_sources: Mapping[str, str], wheel: Path, monkeypatch: pytest.MonkeyPatch
) -> dict[str, types.ModuleType]:
    """vLLM's two modules from ``vllm_sources`` (the release's, or modified ones), executed
    with stub dependencies and registered under their names (undone by ``monkeypatch``); plus a
    module holding speculator.py's own `from ... import OnlineAcceptanceEstimator`."""
    triton = pytest.importorskip("triton")
    import triton.language as tl

    def register(name: str, module: types.ModuleType) -> types.ModuleType:
        monkeypatch.setitem(sys.modules, name, module)
        parent, _, child = name.rpartition(".")
        if parent:
            if parent not in sys.modules or not isinstance(sys.modules[parent], types.ModuleType):
                register(parent, _StubModule(parent))
            monkeypatch.setattr(sys.modules[parent], child, module, raising=False)
        return module

    with zipfile.ZipFile(wheel) as archive:
        version = archive.read("vllm/_version.py").decode()
        speculator = archive.read(f"{SPEC_DECODE}/speculator.py").decode()
    version_module = register("vllm.version", _StubModule("vllm.version"))
    exec(version, version_module.__dict__)  # noqa: S102
    register("vllm.triton_utils", types.SimpleNamespace(tl=tl, triton=triton))  # type: ignore[arg-type]
    for stub in (
        "vllm.envs",
        "vllm.logger",
        "vllm.config",
        "vllm.config.compilation",
        "vllm.distributed.parallel_state",
        "vllm.utils.gpu_sync_debug",
        "vllm.utils.torch_utils",
        "vllm.v1.attention.backend",
        "vllm.v1.utils",
        "vllm.v1.worker.gpu.async_utils",
        "vllm.v1.worker.gpu.attn_utils",
        f"{SPEC_DECODE.replace('/', '.')}.rejection_sampler_utils",
    ):
        register(stub, _StubModule(stub))
    modules = {}
    for name, source in vllm_sources.items():
        # triton.jit and the plugin's checks read the source back through linecache.
        filename = f"{wheel}/{PATHS[name]}"
        lines = source.splitlines(keepends=True)
        monkeypatch.setitem(linecache.cache, filename, (len(source), None, lines, filename))
        module = register(name, types.ModuleType(name))
        module.__file__ = filename
        exec(compile(source, filename, "exec"), module.__dict__)  # noqa: S102
        modules[name] = module
    # speculator.py's import statement of the estimator, executed on its own.
    binding = next(
        node
        for node in ast.parse(speculator).body
        if isinstance(node, ast.ImportFrom) and node.module == ESTIMATOR_MODULE
    )
    speculator_name = f"{SPEC_DECODE.replace('/', '.')}.speculator"
    speculator_module = register(speculator_name, types.ModuleType(speculator_name))
    exec(compile(ast.Module([binding], []), "speculator.py", "exec"), speculator_module.__dict__)  # noqa: S102
    modules[speculator_name] = speculator_module
    monkeypatch.setenv("AV_CORE_VLLM", "1")
    monkeypatch.delenv("AV_CORE_VLLM_ANY_VERSION", raising=False)
    return modules


@pytest.fixture
def real_vllm_modules(
    vllm_sources: dict[str, str], wheel: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, types.ModuleType]]:
    """vLLM's two real modules (:func:`load_vllm`), the plugin uninstalled afterwards."""
    yield load_vllm(vllm_sources, wheel, monkeypatch)
    vllm_plugin.uninstall()


@pytest.mark.vllm
def test_plugin_installs_over_the_real_vllm_modules(
    real_vllm_modules: dict[str, types.ModuleType],
) -> None:
    speculator = real_vllm_modules[f"{SPEC_DECODE.replace('/', '.')}.speculator"]
    original = real_vllm_modules[ESTIMATOR_MODULE].OnlineAcceptanceEstimator
    assert speculator.OnlineAcceptanceEstimator is original
    vllm_plugin.register()
    assert (
        real_vllm_modules[ESTIMATOR_MODULE].OnlineAcceptanceEstimator is OnlineAcceptanceEstimator
    )
    assert speculator.OnlineAcceptanceEstimator is OnlineAcceptanceEstimator
    budget = real_vllm_modules[BUDGET_MODULE]
    assert budget._assign_draft_token_budget_compiled is av_vllm.assign_draft_token_budget
    assert budget.AdaptiveVerificationManager.get_num_tokens is vllm_plugin._get_num_tokens
    vllm_plugin.uninstall()
    assert speculator.OnlineAcceptanceEstimator is original


# --- vLLM's documented numeric behaviour (no download) -----------------------------------------


def log_odds_64(logits: np.ndarray, temperature: np.ndarray) -> np.ndarray:
    """logit(q_max) of softmax(z / T) in float64 (T <= 0: unscaled), clamped to +-40."""
    z = np.asarray(logits, dtype=np.float64)
    t = np.where(temperature > 0, temperature, 1.0)
    y = z / t[:, None]
    y -= y.max(axis=1, keepdims=True)
    e = np.exp(y)
    # Every term but the maximum's (exactly 1), summed directly rather than as total - 1.
    rest = np.array([np.sort(row)[:-1].sum() for row in e])
    return np.clip(-np.log(rest), -40.0, 40.0)


def sigmoid_64(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def test_features_and_confidences_match_the_float64_reference() -> None:
    m, k, vocab = 10, 4, 300
    est = OnlineAcceptanceEstimator(m, k, CPU)
    gen = torch.Generator().manual_seed(31)
    temperature = torch.tensor([1.0, 0.0, 0.6, 1.7, -1.0, 1.0, 0.3, 2.0, 1.0, 0.9])
    idx = torch.tensor([7, 2, -1, 0, 4, 9, -1, 1], dtype=torch.int32)
    conf = torch.zeros(len(idx), k)
    for step in range(k):
        scale = torch.rand(len(idx), 1, generator=gen) * 8
        logits = (torch.randn(len(idx), vocab, generator=gen) * scale).to(torch.bfloat16)
        est.predict(logits, idx, torch.tensor(step), conf, temperature)
        live = (idx >= 0).numpy()
        slots = idx.numpy()[live]
        x = log_odds_64(logits.float().numpy()[live], temperature.numpy()[slots])
        p = sigmoid_64(0.5 * x - 0.2)
        accurate = np.abs(x) <= 30  # float32 logits resolve log-odds to 1e-4 there
        got_x = est.features[slots, step].numpy()
        np.testing.assert_allclose(got_x[accurate], x[accurate], atol=1e-4)
        np.testing.assert_allclose(est.predictions[slots, step].numpy(), p, atol=1e-6)
        np.testing.assert_allclose(conf[np.flatnonzero(live), step].numpy(), p, atol=1e-6)
        assert (conf[~torch.from_numpy(live), step] == 0).all()


def test_padded_rows_leave_their_slots_untouched() -> None:
    m, k = 5, 2
    est = OnlineAcceptanceEstimator(m, k, CPU)
    est.features.fill_(3.0)
    est.predictions.fill_(0.25)
    conf = torch.full((4, k), 0.125)
    logits = torch.randn(4, 30)
    est.predict(
        logits, torch.full((4,), -1, dtype=torch.int32), torch.tensor(1), conf, torch.ones(m)
    )
    assert (est.features == 3.0).all() and (est.predictions == 0.25).all()
    assert (conf == 0.125).all()
    idx = torch.tensor([-1, 3, -1, 0], dtype=torch.int32)
    est.predict(logits, idx, torch.tensor(1), conf, torch.ones(m))
    changed = torch.zeros(m, k, dtype=torch.bool)
    changed[[3, 0], 1] = True
    assert (est.features[~changed] == 3.0).all() and (est.features[changed] != 3.0).all()
    assert (est.predictions[~changed] == 0.25).all()
    conf_changed = torch.zeros(4, k, dtype=torch.bool)
    conf_changed[[1, 3], 1] = True
    assert (conf[~conf_changed] == 0.125).all() and (conf[conf_changed] != 0.125).all()


def inject_round(est: OnlineAcceptanceEstimator, stats: dict[str, np.ndarray]) -> None:
    state = est.state_dict()
    fraction_bits = state["estimator"]["round_stats"]["fraction_bits"]
    scale = 2**fraction_bits
    state["estimator"]["round_stats"] = {
        "fraction_bits": fraction_bits,
        **{name: [round(v * scale) for v in stats[name]] for name in ("a", "b", "c", "g0", "g1")},
        "n": [int(v) for v in stats["n"]],
    }
    est.load_state_dict(state)


def refit_now(est: OnlineAcceptanceEstimator) -> None:
    """A step with no verdicts at REFIT_INTERVAL = 1: the refit sees only the round as it is."""
    est.REFIT_INTERVAL = 1
    empty = torch.zeros(0, dtype=torch.int32)
    est.step(empty, empty, empty)


@pytest.mark.parametrize("s", [0.5, 1.0, 4.0, 10.0])
def test_damping_example(s: float) -> None:
    # b = 0, c = s, g1 = 0.5 s, a = 30 s, g0 = 2 s, n_k = 20 s on K = 4 (no ridge): the Newton
    # step is (2/30, 0.5, ...), damped by N/(N+50) with N = 80 s and by n_k/(n_k+50).
    k = 4
    est = OnlineAcceptanceEstimator(8, k, CPU)
    est.L2 = 0.0
    inject_round(
        est,
        {
            "a": np.full(k, 30 * s / k),
            "b": np.zeros(k),
            "c": np.full(k, s),
            "g0": np.full(k, 2 * s / k),
            "g1": np.full(k, 0.5 * s),
            "n": np.full(k, 20 * s),
        },
    )
    refit_now(est)
    n_total = 80 * s
    slope = 0.5 + (2 / 30) * n_total / (n_total + 50)
    intercept = -0.2 + 0.5 * 20 * s / (20 * s + 50)
    native = est.state_dict()["estimator"]
    assert native["slope"] == pytest.approx(slope, rel=1e-9)
    np.testing.assert_allclose(native["intercepts"], intercept, rtol=1e-9)
    assert est.slope.item() == np.float32(slope)
    np.testing.assert_array_equal(est.intercepts.numpy(), np.float32(intercept))


def test_default_ridge_matches_vllms_refit_formula() -> None:
    k = 3
    stats = {
        "a": np.array([4.0, 2.0, 1.0]),
        "b": np.array([0.5, -0.25, 0.125]),
        "c": np.array([2.0, 1.0, 0.5]),
        "g0": np.array([0.75, -0.5, 0.25]),
        "g1": np.array([1.0, -0.5, 0.0]),
        "n": np.array([30.0, 12.0, 3.0]),
    }
    est = OnlineAcceptanceEstimator(4, k, CPU)
    inject_round(est, stats)
    refit_now(est)
    slope, intercepts = reference.vllm_refit(0.5, np.full(k, -0.2), stats)
    native = est.state_dict()["estimator"]
    assert native["slope"] == pytest.approx(slope, rel=1e-9)
    np.testing.assert_allclose(native["intercepts"], intercepts, rtol=1e-9)


def test_all_rejected_at_the_first_position_leaves_deeper_intercepts_bit_identical() -> None:
    m, k = 16, 4
    est = OnlineAcceptanceEstimator(m, k, CPU)
    est.REFIT_INTERVAL = 5
    gen = torch.Generator().manual_seed(41)
    idx = torch.arange(m, dtype=torch.int32)
    conf = torch.zeros(m, k)
    initial = est.intercepts.clone()
    for _ in range(10):
        for position in range(k):
            logits = torch.randn(m, 64, generator=gen) * 3
            est.predict(logits, idx, torch.tensor(position), conf, torch.ones(m))
        # Every request: nothing accepted (only the bonus token), its first draft rejected.
        est.step(idx, torch.ones(m, dtype=torch.int32), torch.ones(m, dtype=torch.int32))
    assert est.num_refits == 2
    assert est.intercepts[0] < initial[0]
    assert torch.equal(est.intercepts[1:], initial[1:])


# --- drafting-depth control: the speculators and manager attributes it wraps -------------------


def depth_control_problems(wheel: Path) -> list[str]:
    """What ``vllm_plugin.install_depth_control`` relies on, checked in the released source."""
    problems: list[str] = []
    with zipfile.ZipFile(wheel) as archive:
        budget = archive.read(PATHS[BUDGET_MODULE]).decode()
        for module, class_name in vllm_plugin.DEPTH_SPECULATORS:
            source = archive.read(module.replace(".", "/") + ".py").decode()
            node = definitions(source).get(f"{class_name}.propose")
            if node is None:
                problems.append(f"{module}.{class_name}.propose: not defined")
                continue
            text = arguments_text(node.args)
            if (
                not text.startswith("(self, input_batch,")
                or "num_speculative_tokens=None" not in text
            ):
                problems.append(f"{class_name}.propose{text}")
    budget_defs = definitions(budget)
    for dotted, expected in vllm_plugin.DEPTH_MANAGER_SIGNATURES.items():
        node = budget_defs.get(dotted)
        if node is None:
            problems.append(f"{dotted}: not defined")
        elif arguments_text(node.args) != expected:
            problems.append(f"{dotted}{arguments_text(node.args)}: expected {expected}")
    init = budget_defs["AdaptiveVerificationManager.__init__"]
    assigned = self_attributes(init)
    everywhere = {
        target.attr
        for node in ast.walk(ast.parse(budget))
        for target in (node.targets if isinstance(node, ast.Assign) else [])
        if isinstance(target, ast.Attribute)
    }
    for name in vllm_plugin.DEPTH_READS:
        if name not in assigned | everywhere:
            problems.append(f"AdaptiveVerificationManager no longer sets {name}")
    return problems


@pytest.mark.vllm
def test_depth_control_targets_exist_in_the_release(wheel: Path) -> None:
    assert depth_control_problems(wheel) == []


# --- warm restarts and data-parallel pooling: what av_core.vllm.serving relies on --------------

SERVING_PATHS = {
    "speculator": f"{SPEC_DECODE}/speculator.py",
    "worker": "vllm/v1/worker/gpu_worker.py",
    "runner": "vllm/v1/worker/gpu/model_runner.py",
    "parallel_state": "vllm/distributed/parallel_state.py",
    "parallel_config": "vllm/config/parallel.py",
}


def call_name(call: ast.Call) -> str:
    """``self.speculator.propose`` for ``self.speculator.propose(...)``."""
    parts: list[str] = []
    node: ast.expr = call.func
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def calls_in_order(function: ast.FunctionDef) -> list[ast.Call]:
    found = [node for node in ast.walk(function) if isinstance(node, ast.Call)]
    return sorted(found, key=lambda call: (call.lineno, call.col_offset))


def passes_true(call: ast.Call, keyword: str) -> bool:
    return any(
        k.arg == keyword and isinstance(k.value, ast.Constant) and k.value.value is True
        for k in call.keywords
    )


def serving_contract_problems(sources: Mapping[str, str]) -> list[str]:
    """Every way the sources differ from what ``av_core.vllm.serving`` relies on."""
    from av_core.vllm import serving as vllm_serving

    problems: list[str] = []
    speculator = definitions(sources["speculator"])
    worker = definitions(sources["worker"])
    runner = definitions(sources["runner"])
    signature_of = {
        vllm_serving.SPECULATOR_MODULE: speculator,
        vllm_serving.WORKER_MODULE: worker,
    }
    for (module, dotted), expected in vllm_serving.SERVING_SIGNATURES.items():
        node = signature_of[module].get(dotted)
        if node is None:
            problems.append(f"{dotted}: not defined")
        elif arguments_text(node.args) != expected:
            problems.append(f"{dotted}{arguments_text(node.args)}: the plugin expects {expected}")
    # The estimator is built in load_model, and the key's attributes are set in __init__.
    load_model = speculator.get("DraftModelSpeculator.load_model")
    builds = load_model is not None and any(
        isinstance(node, ast.Assign)
        and any(
            isinstance(t, ast.Attribute) and t.attr == "acceptance_estimator" for t in node.targets
        )
        and isinstance(node.value, ast.Call)
        and call_name(node.value) == "OnlineAcceptanceEstimator"
        for node in ast.walk(load_model)
    )
    if not builds:
        problems.append("DraftModelSpeculator.load_model no longer builds the estimator")
    init = speculator.get("DraftModelSpeculator.__init__")
    assigned = self_attributes(init) if init is not None else set()
    for name in ("vllm_config", "speculative_config", "method", "num_speculative_steps"):
        if name not in assigned:
            problems.append(f"DraftModelSpeculator.__init__ no longer sets self.{name}")
    # A dummy batch: the worker runs the runner's _dummy_run, which runs execute_model (the
    # data-parallel batch sync) and then the speculator's propose with dummy_run=True.
    dummy_batch = worker.get("Worker.execute_dummy_batch")
    if dummy_batch is None or "self.model_runner._dummy_run" not in {
        call_name(c) for c in calls_in_order(dummy_batch)
    }:
        problems.append("Worker.execute_dummy_batch no longer calls self.model_runner._dummy_run")
    dummy_run = runner.get("GPUModelRunner._dummy_run")
    order = [call_name(c) for c in calls_in_order(dummy_run)] if dummy_run else []
    proposes = [
        c
        for c in (calls_in_order(dummy_run) if dummy_run else [])
        if call_name(c) == "self.speculator.propose"
    ]
    if not proposes or not all(passes_true(c, "dummy_run") for c in proposes):
        problems.append("GPUModelRunner._dummy_run: no self.speculator.propose(dummy_run=True)")
    elif "self.execute_model" not in order or order.index("self.execute_model") > order.index(
        "self.speculator.propose"
    ):
        problems.append("GPUModelRunner._dummy_run: propose no longer follows execute_model")
    # A real step: the verdicts are graded in sample_tokens before propose, with no
    # data-parallel collective in between.
    sample = runner.get("GPUModelRunner.sample_tokens")
    names = [call_name(c) for c in calls_in_order(sample)] if sample else []
    collective = ("dispatch_cg_and_sync_dp", "cpu_all_reduce_", "get_dp_group")
    if "self.speculator.observe_verification" not in names or (
        "self.speculator.propose" not in names
    ):
        problems.append("GPUModelRunner.sample_tokens: no observe_verification and propose")
    else:
        first, last = (
            names.index("self.speculator.observe_verification"),
            names.index("self.speculator.propose"),
        )
        if first > last:
            problems.append("GPUModelRunner.sample_tokens: propose now precedes the verdicts")
        elif any(n.endswith(collective) for n in names[first:last]):
            problems.append("GPUModelRunner.sample_tokens: a DP collective before propose")
    execute = runner.get("GPUModelRunner.execute_model")
    if execute is None or not any(
        call_name(c).endswith("dispatch_cg_and_sync_dp") for c in calls_in_order(execute)
    ):
        problems.append("GPUModelRunner.execute_model: the DP batch sync moved")
    # vLLM's data-parallel group and its CPU group, and the data-parallel index of the key.
    state = definitions(sources["parallel_state"])
    if "get_dp_group" not in state:
        problems.append("parallel_state.get_dp_group: not defined")
    coordinator = state.get("GroupCoordinator.__init__")
    members = self_attributes(coordinator) if coordinator else set()
    for name in ("cpu_group", "world_size", "ranks"):
        if name not in members:
            problems.append(f"GroupCoordinator no longer sets self.{name}")
    if "data_parallel_index" not in sources["parallel_config"]:
        problems.append("ParallelConfig.data_parallel_index: not found")
    return problems


@pytest.fixture(scope="module")
def serving_sources(wheel: Path) -> dict[str, str]:
    with zipfile.ZipFile(wheel) as archive:
        return {name: archive.read(path).decode() for name, path in SERVING_PATHS.items()}


@pytest.mark.vllm
def test_serving_targets_hold_in_the_release(serving_sources: dict[str, str]) -> None:
    assert serving_contract_problems(serving_sources) == []


@pytest.mark.vllm
@pytest.mark.parametrize(
    ("name", "old", "new", "named"),
    [
        ("runner", "dummy_run=True,\n                    skip_attn", "skip_attn", "dummy_run"),
        ("worker", "def execute_dummy_batch(self)", "def execute_dummy_batch(self, n)", "dummy"),
        ("speculator", "self.acceptance_estimator = Online", "self.estimator = Online", "builds"),
        ("parallel_state", "def get_dp_group(", "def get_data_parallel_group(", "get_dp"),
    ],
)
def test_the_serving_checker_fails_on_a_modified_release(
    serving_sources: dict[str, str], name: str, old: str, new: str, named: str
) -> None:
    assert old in serving_sources[name], old
    changed = {**serving_sources, name: serving_sources[name].replace(old, new)}
    problems = serving_contract_problems(changed)
    assert any(named in problem for problem in problems), problems


@pytest.mark.vllm
def test_the_serving_checker_sees_verdicts_moved_after_propose(
    serving_sources: dict[str, str],
) -> None:
    source = serving_sources["runner"]
    start = source.index("    def sample_tokens(")
    stop = source.index("\n    def ", start + 1)
    body = source[start:stop]
    grade = "self.speculator.observe_verification("
    assert body.count(grade) == 1 and body.count("self.speculator.propose(") == 1
    # Swap the two calls' names inside sample_tokens: propose first, then the verdicts.
    body = (
        body.replace(grade, "@@GRADE@@(")
        .replace("self.speculator.propose(", grade)
        .replace("@@GRADE@@(", "self.speculator.propose(")
    )
    swapped = source[:start] + body + source[stop:]
    problems = serving_contract_problems({**serving_sources, "runner": swapped})
    assert any("precedes" in problem for problem in problems), problems


def test_the_plugin_accepts_exactly_the_checked_releases() -> None:
    for version in ("0.32.0", "0.32.1", "0.32.17", "0.33.0"):
        assert vllm_plugin.version_supported(version), version
    for version in ("0.33.1", "0.31.9", "0.34.0", "0.32", "0.32.0rc1", "0.32.1.dev3+gabc", "1.0"):
        assert not vllm_plugin.version_supported(version), version
    assert all(vllm_plugin.version_supported(v) for v in RELEASES)


# --- AV_CORE_VLLM_EXACT=1: vLLM's unbounded update, against vLLM's own kernels -----------------


def update_scenario(seed: int) -> dict[str, Any]:
    """The refit's inputs alone: each step sets features and draft-time predictions (float32,
    the same on both sides) for a few slots and grades them. Rounds of 4 steps; the third holds
    nothing but two confidently wrong drafts (feature 30, predicted 0.9995, rejected), the round
    vLLM's update throws the first intercept far down with."""
    gen = torch.Generator().manual_seed(seed)
    m, k = 6, 3
    steps = []
    for index in range(24):
        if index in (8, 10, 11):
            empty = torch.zeros(0, dtype=torch.int32)
            steps.append({"verdict": (empty, empty, empty), "predict": []})
            continue
        if index == 9:
            slots = torch.tensor([1, 4], dtype=torch.int32)
            features = torch.full((2, k), 30.0)
            predictions = torch.full((2, k), 0.9995)
            sampled = torch.ones(2, dtype=torch.int32)
            rejected = torch.ones(2, dtype=torch.int32)
        else:
            live = int(torch.randint(1, m + 1, (1,), generator=gen))
            slots = torch.randperm(m, generator=gen)[:live].to(torch.int32)
            features = torch.randn(live, k, generator=gen) * 3
            predictions = torch.rand(live, k, generator=gen) * 0.96 + 0.02
            admitted = torch.randint(0, k + 1, (live,), generator=gen)
            accepted = (torch.rand(live, generator=gen) * (admitted + 1)).floor().long()
            accepted = accepted.clamp(max=admitted)
            sampled = (accepted + 1).to(torch.int32)
            rejected = (admitted - accepted).to(torch.int32)
        fill = {"slots": slots.long(), "features": features, "predictions": predictions}
        steps.append({"fill": fill, "verdict": (slots, sampled, rejected), "predict": []})
    return {
        "max_num_reqs": m,
        "K": k,
        "refit_interval": 4,
        "temperature": torch.ones(m),
        "steps": steps,
    }


def run_vllm(wheel: Path, scenario: dict[str, Any], tmp_path: Path) -> dict[str, torch.Tensor]:
    torch.save(scenario, tmp_path / "scenario.pt")
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", _VLLM_RUNNER, str(wheel), str(tmp_path / "scenario.pt")]
        + [str(tmp_path / "vllm.pt")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(torch.load(tmp_path / "vllm.pt"))


@pytest.mark.vllm
@pytest.mark.parametrize("seed", [21, 5, 8])
def test_exact_mode_equals_vllms_kernels_where_the_bounds_bind(
    wheel: Path, tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("triton")
    scenario = update_scenario(seed)
    theirs = run_vllm(wheel, scenario, tmp_path)["trajectory"].double()
    monkeypatch.setenv("AV_CORE_VLLM_EXACT", "1")
    exact = run_ours(scenario)["trajectory"].double()
    monkeypatch.delenv("AV_CORE_VLLM_EXACT")
    bounded = run_ours(scenario)["trajectory"].double()
    # vLLM's update leaves av_core's bounds far behind: the first intercept falls by more than
    # 10 in one refit (the step after the third round).
    assert theirs[11, 1] - theirs[10, 1] < -10.0, theirs
    # Exact mode: vLLM's kernels to 1e-6 (float32 coefficients, so relative where they are large).
    torch.testing.assert_close(exact, theirs, rtol=1e-6, atol=1e-6)
    # The default keeps the bounds (a step of at most 4) and so parts from vLLM there.
    assert bounded[11, 1] - bounded[10, 1] == pytest.approx(-4.0, abs=1e-6)
    assert (bounded - theirs).abs().max() > 5.0
    torch.testing.assert_close(bounded[:11], theirs[:11], rtol=1e-6, atol=1e-6)
