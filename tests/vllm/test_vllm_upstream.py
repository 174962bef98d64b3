"""The vLLM plugin against the upstream changes it must see: each either handled or refused by
name, never patched past.

On the released source (each wheel the contract tests read), modified the way the upstream
change modifies it:

- vllm#56831 decides the draft budget on rank 0 and broadcasts it; inside ``get_num_tokens``,
  which av_core replaces, the broadcast would be dropped: refused naming it. The same broadcast
  in a method av_core leaves alone installs.
- a variant of ``adaptive_verification.py`` adds ``reserved=None, reserved_total=0`` to
  ``_assign_draft_token_budget``, a fourth entry to ``_batch_budget`` and a history mode read
  inside ``get_num_tokens``: each refused by name; new optional arguments of the manager's
  ``__init__`` alone (``min_draft_width=0``) are accepted.
- vllm#52559's ``DFlashAdaptiveKManager`` (reproduced in ``dflash_reproduction``) overrides
  ``get_num_tokens`` with a contract of its own (one K for the batch, ``batch_query_len``):
  the install proceeds and building one is refused by name, whether it was defined before or
  after the install; a subclass whose own ``get_num_tokens`` keeps vLLM's contract is patched
  as the base is, and av_core's budget then reads a verify table by batch size and K; a
  ``super()`` call is accepted unless it lands in a refused definition. Where
  ``AV_CORE_VLLM_PR52559`` names a copy of the pull request's own file, it is checked too.

Without vLLM: additive and changed signatures of what the plugin replaces and wraps, a patched
class's own ``__init_subclass__``, and a ``DraftConfidenceStop``
(vllm-project/vllm@41f9ab88bf8c4dd4f2d22f31d625006a9619b612) inside a speculator's
``propose``, which drafting-depth control refuses.
"""

from __future__ import annotations

import ast
import logging
import os
import re
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dflash_reproduction import DFLASH_MODULE, DFLASH_SOURCE, define, timing_samples
from test_vllm import build_fake_vllm, originals
from test_vllm_contract import (  # noqa: F401 - fixtures
    load_vllm,
    release,
    vllm_sources,
    wheel,
)
from test_vllm_depth import FakeManager, fake_vllm  # noqa: F401 - a fixture
from test_vllm_shape_costs import decode_budget

from av_core.vllm import plugin as vllm_plugin
from av_core.vllm.plugin import BUDGET_MODULE, VllmCompatibilityError


@pytest.fixture(autouse=True)
def _uninstalled() -> Any:
    """Every test starts and ends with nothing installed (a test that fails by installing
    must not leave it for the next)."""
    vllm_plugin.uninstall()
    yield
    vllm_plugin.uninstall()


def modified(sources: dict[str, str], old: str, new: str) -> dict[str, str]:
    text = sources[BUDGET_MODULE]
    assert text.count(old) == 1, old
    return {**sources, BUDGET_MODULE: text.replace(old, new)}


def refused(modules: dict[str, types.ModuleType], *messages: str) -> None:
    before = originals(modules)
    with pytest.raises(VllmCompatibilityError, match="nothing was patched") as error:
        vllm_plugin.install()
    for message in messages:
        assert message in str(error.value), (message, str(error.value))
    assert originals(modules) == before and vllm_plugin.installed() == []


def refused_by_real(modules: dict[str, types.ModuleType], message: str) -> None:
    """``install`` raises naming ``message`` and patches nothing (vLLM's real modules)."""
    manager = modules[BUDGET_MODULE].AdaptiveVerificationManager
    before = manager.__dict__["get_num_tokens"]
    with pytest.raises(VllmCompatibilityError, match="nothing was patched") as error:
        vllm_plugin.install()
    assert message in str(error.value), (message, str(error.value))
    assert manager.__dict__["get_num_tokens"] is before and vllm_plugin.installed() == []


def definition(tree: ast.Module, dotted: str) -> ast.FunctionDef:
    scope: list[ast.stmt] = tree.body
    node: Any = None
    for part in dotted.split("."):
        node = next(
            n for n in scope if isinstance(n, ast.ClassDef | ast.FunctionDef) and n.name == part
        )
        scope = node.body
    assert isinstance(node, ast.FunctionDef)
    return node


@pytest.mark.vllm
def test_the_replaced_bodies_are_those_of_the_release(
    vllm_sources: dict[str, str],  # noqa: F811
) -> None:
    """REPLACED_BODIES against the wheel's text (read with regular expressions over each body,
    not with the plugin's own walk of the syntax tree)."""
    for (module, dotted), (attributes, calls) in vllm_plugin.REPLACED_BODIES.items():
        node = definition(ast.parse(vllm_sources[module]), dotted)
        body = "\n".join(ast.unparse(statement) for statement in node.body)
        assert set(re.findall(r"\bself\.(\w+)", body)) == attributes, dotted
        assert set(re.findall(r"(\w+)\(", body)) == calls, dotted


BUDGET_LINE = "        self._batch_budget = (\n"
BROADCAST = "        draft_budget = int(get_tp_group().broadcast_object(draft_budget, src=0))\n"


@pytest.mark.vllm
def test_a_budget_broadcast_inside_get_num_tokens_is_refused_by_name(
    vllm_sources: dict[str, str],  # noqa: F811
    wheel: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before, av_core replaced the method and the broadcast silently went with it."""
    sources = modified(vllm_sources, BUDGET_LINE, BROADCAST + BUDGET_LINE)
    modules = load_vllm(sources, wheel, monkeypatch)
    refused_by_real(
        modules, "get_num_tokens communicates across ranks (broadcast_object, get_tp_group)"
    )


@pytest.mark.vllm
def test_a_broadcast_where_av_core_does_not_replace_is_accepted(
    vllm_sources: dict[str, str],  # noqa: F811
    wheel: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    old = "        _, _, draft_budget = batch_budget\n"
    sources = modified(vllm_sources, old, old + BROADCAST)
    modules = load_vllm(sources, wheel, monkeypatch)
    try:
        vllm_plugin.install()
        manager = modules[BUDGET_MODULE].AdaptiveVerificationManager
        assert manager.get_num_tokens is vllm_plugin._get_num_tokens
    finally:
        vllm_plugin.uninstall()


@pytest.mark.vllm
@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            "    num_steps: int,\n) -> None:\n",
            "    num_steps: int,\n    reserved: torch.Tensor | None = None,\n"
            "    reserved_total: int = 0,\n) -> None:\n",
            "new optional parameter reserved=None; new optional parameter reserved_total=0, "
            "which av_core's replacement",
        ),
        (
            "            draft_budget,\n        )\n        return",
            "            draft_budget,\n            {},\n        )\n        return",
            "get_num_tokens stores a 4-tuple in _batch_budget",
        ),
        (
            "        _, _, draft_budget = batch_budget\n",
            "        _, _, draft_budget, _reserved = batch_budget\n",
            "unpacks _batch_budget into 4 values",
        ),
        (
            "        assert self.cost_tables is not None\n        req_ids",
            "        assert self.cost_tables is not None\n        history = self._history\n"
            "        req_ids",
            "get_num_tokens uses self._history, which av_core's replacement ignores",
        ),
        (
            "        assert self.cost_tables is not None\n        req_ids",
            "        assert self.cost_tables is not None\n"
            "        _min_width_reservation(None, 0, 0, 0)\n        req_ids",
            "get_num_tokens calls _min_width_reservation",
        ),
    ],
)
def test_the_reserved_budget_variant_is_refused_naming_each_change(
    vllm_sources: dict[str, str],  # noqa: F811
    wheel: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    old: str,
    new: str,
    message: str,
) -> None:
    """Each piece of the variant alone; before, only a changed signature was seen."""
    modules = load_vllm(modified(vllm_sources, old, new), wheel, monkeypatch)
    refused_by_real(modules, message)


@pytest.mark.vllm
def test_new_optional_arguments_of_the_manager_are_accepted(
    vllm_sources: dict[str, str],  # noqa: F811
    wheel: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    old = "        max_total_logits: int,\n"
    new = (
        old + "        min_draft_width: int = 0,\n        min_width_max_reqs: int = 2,\n"
        '        confidence_source: str = "head",\n'
    )
    modules = load_vllm(modified(vllm_sources, old, new), wheel, monkeypatch)
    try:
        vllm_plugin.install()
        assert len(vllm_plugin.installed()) == 6
        del modules
    finally:
        vllm_plugin.uninstall()


# --- vllm#52559: a manager subclass that overrides get_num_tokens ------------------------------


def own_get_num_tokens(sources: dict[str, str], signature: str | None = None) -> str:
    """vLLM's own ``get_num_tokens`` (the wheel's text, read now), as a method of a class body;
    ``signature`` replaces its parameter list."""
    node = definition(
        ast.parse(sources[BUDGET_MODULE]), "AdaptiveVerificationManager.get_num_tokens"
    )
    text = ast.unparse(node)
    if signature is not None:
        text = re.sub(r"\(self,.*?\) -> int:", f"{signature} -> int:", text, count=1, flags=re.S)
    return textwrap.indent(text, "    ")


def subclass_source(name: str, base: str, body: str) -> str:
    return (
        "import numpy as np\n\n"
        "from vllm.v1.worker.gpu.spec_decode.adaptive_verification import "
        "AdaptiveVerificationManager\n"
        f"from {DFLASH_MODULE} import DFlashAdaptiveKManager, k_candidates\n\n\n"
        f"class {name}({base}):\n{body}\n"
    )


def logged(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(record.getMessage() for record in caplog.records)


REFUSED = [
    "DFlashAdaptiveKManager.get_num_tokens overrides",
    "select_k",
    "self.batch_query_len",
    "self._batch_is_unmodified",
]


@pytest.mark.vllm
def test_the_dflash_manager_is_refused_when_built_and_the_rest_installs(
    vllm_sources: dict[str, str],  # noqa: F811
    wheel: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Its get_num_tokens sets what vLLM's model runner reads for DFlash (batch_query_len for
    the graph dispatch, _batch_is_unmodified) from one K for the batch; av_core's replacement
    would drop both, so the subclass is refused, by name, when a server builds one; its mere
    presence must not refuse the install, or no drafter could run av_core on such a vLLM."""
    modules = load_vllm(vllm_sources, wheel, monkeypatch)
    dflash = define(DFLASH_SOURCE, DFLASH_MODULE, monkeypatch).DFlashAdaptiveKManager
    own = dict(vars(dflash))
    with caplog.at_level(logging.INFO, logger="vllm.av_core"):
        vllm_plugin.install()
    manager = modules[BUDGET_MODULE].AdaptiveVerificationManager
    assert manager.get_num_tokens is vllm_plugin._get_num_tokens
    assert vars(dflash)["get_num_tokens"] is own["get_num_tokens"]
    for text in [*REFUSED, "constructing one raises"]:
        assert text in logged(caplog), text
    with pytest.raises(VllmCompatibilityError) as error:
        dflash(types.SimpleNamespace(), None, 1, 1 << 20)
    for text in REFUSED:
        assert text in str(error.value), text
    vllm_plugin.uninstall()
    assert dict(vars(dflash)) == own


@pytest.mark.vllm
def test_subclasses_defined_after_the_install_get_the_same_at_their_definition(
    vllm_sources: dict[str, str],  # noqa: F811
    wheel: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A later overriding subclass is judged at its definition, which must not raise: vLLM's
    model runner imports DFlash's module whether or not it builds the manager."""
    modules = load_vllm(vllm_sources, wheel, monkeypatch)
    manager = modules[BUDGET_MODULE].AdaptiveVerificationManager

    def base_init(self: Any, req_states: Any, *args: Any, **kwargs: Any) -> None:
        self.req_states, self.num_speculative_steps = req_states, 3

    monkeypatch.setattr(manager, "__init__", base_init)
    vllm_plugin.install()
    dflash = define(DFLASH_SOURCE, DFLASH_MODULE, monkeypatch).DFlashAdaptiveKManager
    kept = define(
        subclass_source("Kept", "DFlashAdaptiveKManager", own_get_num_tokens(vllm_sources)),
        "av_core_test_kept",
        monkeypatch,
    ).Kept
    assert kept.get_num_tokens is vllm_plugin._get_num_tokens
    with pytest.raises(VllmCompatibilityError, match="DFlashAdaptiveKManager.get_num_tokens"):
        dflash(types.SimpleNamespace(), None, 1, 1 << 20)
    # Its own, accepted get_num_tokens: built through DFlash's constructor.
    built = kept(types.SimpleNamespace(), None, 1, 1 << 20)
    assert built.candidates == [0, 1, 3] and built.current_k == 3
    vllm_plugin.uninstall()
    assert "get_num_tokens" in vars(kept) and kept.get_num_tokens is not vllm_plugin._get_num_tokens
    dflash(types.SimpleNamespace(), None, 1, 1 << 20)  # nothing guards once uninstalled


@pytest.mark.vllm
def test_a_subclass_keeping_the_contract_gets_av_cores_budget_on_its_shape_table(
    vllm_sources: dict[str, str],  # noqa: F811
    wheel: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A manager that profiles verification by shape as DFlash's does but budgets with vLLM's
    own get_num_tokens: patched as the base is, and av_core's budget reads its table by batch
    size and K (against the brute force on the row of each step's batch size)."""
    load_vllm(vllm_sources, wheel, monkeypatch)
    define(DFLASH_SOURCE, DFLASH_MODULE, monkeypatch)
    body = (
        "    set_initial_cost_curves = DFlashAdaptiveKManager.set_initial_cost_curves\n"
        + own_get_num_tokens(vllm_sources)
    )
    shaped = define(
        subclass_source("ShapeProfiled", "AdaptiveVerificationManager", body),
        "av_core_test_shape_profiled",
        monkeypatch,
    ).ShapeProfiled
    own = vars(shaped)["get_num_tokens"]
    with caplog.at_level(logging.INFO, logger="vllm.av_core"):
        vllm_plugin.install()
    assert shaped.get_num_tokens is vllm_plugin._get_num_tokens
    assert "ShapeProfiled.get_num_tokens keeps the contract" in logged(caplog)

    k, max_reqs = 7, 8
    rng = np.random.default_rng(2)
    stale = rng.uniform(0.1, 1.0, (max_reqs, k)).astype(np.float32)
    manager = shaped.__new__(shaped)
    manager.num_speculative_steps = k
    manager.candidates = [0, 1, 3, 7]
    manager._capture_sizes = {1, 2, 4, 8, 16, 32, 64}
    manager.req_states = types.SimpleNamespace(
        max_num_reqs=max_reqs,
        req_id_to_index={f"r{i}": i for i in range(max_reqs)},
        num_computed_tokens_np=np.zeros(max_reqs, dtype=np.int64),
        prefill_len=types.SimpleNamespace(np=np.zeros(max_reqs, dtype=np.int64)),
    )
    manager._stale_confidences = [types.SimpleNamespace(np=stale)]
    manager._stale_idx, manager._max_total_logits, manager.num_bonus_tokens = 0, 1 << 20, 1
    manager.set_initial_cost_curves(timing_samples(max_reqs, manager.candidates))
    draft, verify = manager.cost_tables
    assert verify.shape == (max_reqs + 1, k + 1)
    for requests in (1, 2, 5, 8):
        ids = [f"r{i}" for i in range(requests)]
        tokens = manager.get_num_tokens({i: k + 1 for i in ids}, {i: [0] * k for i in ids})
        expected = decode_budget(stale, requests, k, draft, verify)
        assert tokens == requests + expected and manager._batch_budget[2] == expected
    vllm_plugin.uninstall()
    assert vars(shaped)["get_num_tokens"] is own


@pytest.mark.vllm
@pytest.mark.parametrize(
    ("name", "base", "body", "message"),
    [
        (
            "Logged",
            "DFlashAdaptiveKManager",
            "    def get_num_tokens(self, num_tokens_per_req, draft_tokens):\n"
            "        return super().get_num_tokens(num_tokens_per_req, draft_tokens)\n",
            "Logged.get_num_tokens calls super() into "
            f"{DFLASH_MODULE}.DFlashAdaptiveKManager.get_num_tokens, which av_core refuses",
        ),
        (
            "Reserving",
            "AdaptiveVerificationManager",
            None,
            "new required parameter reserved",
        ),
    ],
)
def test_an_override_that_departs_from_the_contract_is_refused_when_built(
    vllm_sources: dict[str, str],  # noqa: F811
    wheel: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    base: str,
    body: str | None,
    message: str,
) -> None:
    """A super() call that lands in a refused definition, and vLLM's own body under a changed
    signature (a new required parameter)."""
    load_vllm(vllm_sources, wheel, monkeypatch)
    define(DFLASH_SOURCE, DFLASH_MODULE, monkeypatch)
    if body is None:
        signature = "(self, num_tokens_per_req, draft_tokens, reserved)"
        body = own_get_num_tokens(vllm_sources, signature)
    cls = getattr(
        define(subclass_source(name, base, body), f"av_core_test_{name}", monkeypatch), name
    )
    vllm_plugin.install()
    assert vars(cls)["get_num_tokens"] is not vllm_plugin._get_num_tokens
    with pytest.raises(VllmCompatibilityError, match=re.escape(message)):
        cls(types.SimpleNamespace(), None, 1, 1 << 20)


@pytest.mark.vllm
def test_a_subclass_reading_the_budget_as_another_tuple_refuses_the_install(
    vllm_sources: dict[str, str],  # noqa: F811
    wheel: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM's compaction unpacks what av_core's get_num_tokens stores, and so does a subclass's
    own compaction: one reading 4 values refuses the install by name."""
    modules = load_vllm(vllm_sources, wheel, monkeypatch)
    define(DFLASH_SOURCE, DFLASH_MODULE, monkeypatch)
    source = subclass_source(
        "Reserving",
        "AdaptiveVerificationManager",
        "    def compact_batch(self, drafts, scheduled, cu_num_logits):\n"
        "        _, _, draft_budget, reserved = self._batch_budget\n",
    )
    define(source, "av_core_test_reserving", monkeypatch)
    refused_by_real(modules, "av_core_test_reserving.Reserving unpacks _batch_budget into 4 values")


@pytest.mark.vllm
def test_a_subclass_calling_super_on_the_base_is_accepted(
    vllm_sources: dict[str, str],  # noqa: F811
    wheel: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    modules = load_vllm(vllm_sources, wheel, monkeypatch)
    manager = modules[BUDGET_MODULE].AdaptiveVerificationManager
    wrapping = (
        "from vllm.v1.worker.gpu.spec_decode.adaptive_verification import "
        "AdaptiveVerificationManager\n\n\n"
        "class Logged(AdaptiveVerificationManager):\n"
        "    def get_num_tokens(self, num_tokens_per_req, draft_tokens):\n"
        "        return super().get_num_tokens(num_tokens_per_req, draft_tokens)\n"
    )
    logged_class = define(wrapping, "av_core_test_wrapping", monkeypatch).Logged
    with caplog.at_level(logging.INFO, logger="vllm.av_core"):
        vllm_plugin.install()
    assert "Logged.get_num_tokens overrides and calls super()" in logged(caplog)
    assert "__init__" not in vars(logged_class)  # not guarded
    vllm_plugin.uninstall()
    assert "__init_subclass__" not in vars(manager)


def test_the_owners_own_init_subclass_still_runs_under_the_guard(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The guard runs a patched class's own __init_subclass__ before its own check."""
    modules = build_fake_vllm()
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setenv("AV_CORE_VLLM", "1")
    manager = modules[BUDGET_MODULE].AdaptiveVerificationManager
    seen: list[str] = []

    def record(cls: type, **kwargs: Any) -> None:
        seen.append(cls.__name__)

    manager.__init_subclass__ = classmethod(record)  # type: ignore[assignment]
    vllm_plugin.install()
    try:
        type("Later", (manager,), {})
        assert seen == ["Later"]
    finally:
        vllm_plugin.uninstall()
    assert vars(manager)["__init_subclass__"].__func__ is record


# --- vllm#52559's own source, where a copy is given ----------------------------------------------

PR_SOURCE = "AV_CORE_VLLM_PR52559"


@pytest.fixture
def pr_dflash_source() -> str:
    """vllm#52559's ``dflash/adaptive_k.py`` (vllm-project/vllm
    b1171c804b96474eafd3e2f0354b8ec67bfa8ab7), read from the file ``AV_CORE_VLLM_PR52559``
    names; not part of any release, so not fetched here."""
    path = os.environ.get(PR_SOURCE, "")
    if not path:
        pytest.skip(f"{PR_SOURCE} names no copy of vllm#52559's dflash/adaptive_k.py")
    return Path(path).read_text()


@pytest.mark.vllm
def test_the_pull_requests_own_manager_is_refused_when_built(
    vllm_sources: dict[str, str],  # noqa: F811
    wheel: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    pr_dflash_source: str,
) -> None:
    load_vllm(vllm_sources, wheel, monkeypatch)
    dflash = define(pr_dflash_source, DFLASH_MODULE, monkeypatch).DFlashAdaptiveKManager
    vllm_plugin.install()
    with pytest.raises(VllmCompatibilityError) as error:
        dflash(types.SimpleNamespace(), None, 1, 1 << 20)
    for text in REFUSED:
        assert text in str(error.value), text


@pytest.mark.vllm
def test_the_reproduction_profiles_the_table_the_pull_request_does(
    vllm_sources: dict[str, str],  # noqa: F811
    wheel: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    pr_dflash_source: str,
) -> None:
    """Both managers' set_initial_cost_curves on the same samples, with vLLM's own
    build_cost_tables_from_curves: the same draft and verify tables, the same candidates."""
    load_vllm(vllm_sources, wheel, monkeypatch)
    theirs = define(pr_dflash_source, DFLASH_MODULE, monkeypatch)
    ours = define(DFLASH_SOURCE, "av_core_test_dflash_reproduction", monkeypatch)
    for k in range(1, 40):
        assert ours.k_candidates(k) == theirs.get_dflash_k_candidates(k), k
    monkeypatch.setattr(
        theirs,
        "get_tp_group",
        lambda: types.SimpleNamespace(broadcast_object=lambda value, src: value),
    )
    for k, max_reqs, captured in ((7, 8, {1, 2, 4, 8, 16, 32, 64}), (15, 6, {1, 2, 4, 16, 48})):
        samples = timing_samples(max_reqs, ours.k_candidates(k), seed=k)
        tables = []
        for cls in (theirs.DFlashAdaptiveKManager, ours.DFlashAdaptiveKManager):
            manager = cls.__new__(cls)
            manager.num_speculative_steps = k
            manager.req_states = types.SimpleNamespace(max_num_reqs=max_reqs)
            manager._capture_sizes = captured
            manager.candidates = ours.k_candidates(k)
            manager.policy = theirs.DFlashAdaptiveKPolicy(k, 0.2)
            manager._outcome_buffers, manager._selected_k_by_batch = [], {}
            manager._selection_uses_by_batch = {}
            manager.set_initial_cost_curves(samples)
            tables.append(manager.cost_tables)
        for mine, pulled in zip(tables[1], tables[0], strict=True):
            np.testing.assert_array_equal(mine, pulled)


# --- signatures without vLLM ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dotted", "signature", "message"),
    [
        (
            "OnlineAcceptanceEstimator.step",
            "(self, idx_mapping, num_sampled, num_rejected, skip_rows=None)",
            "new optional parameter skip_rows=None, which av_core's replacement",
        ),
        (
            "build_cost_tables_from_curves",
            "(draft_curve, verify_curve, max_num_reqs, max_batch_tokens, cudagraph_limit=1)",
            "parameter cudagraph_limit: default 0 is now 1",
        ),
        (
            "AdaptiveVerificationManager.get_num_tokens",
            "(self, num_tokens_per_req, drafts)",
            "parameter draft_tokens renamed to drafts",
        ),
    ],
)
def test_a_replaced_definition_changed_or_grown_beyond_its_replacement_is_refused(
    monkeypatch: pytest.MonkeyPatch, dotted: str, signature: str, message: str
) -> None:
    """Additive for vLLM, but av_core's replacement would not take it: a vLLM call passing it
    positionally would fail (vLLM's ``skip_rows`` here is positional, av_core's keyword-only)."""
    modules = build_fake_vllm(overrides={dotted: signature})
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    refused(modules, message)


def test_an_additive_change_the_replacement_takes_is_accepted_and_logged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Before, any difference from the expected text refused the install."""
    dotted = "OnlineAcceptanceEstimator.__init__"
    modules = build_fake_vllm(
        overrides={dotted: "(self, max_num_reqs, num_speculative_steps, device, *, staged=None)"}
    )
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    try:
        with caplog.at_level(logging.INFO, logger="vllm.av_core"):
            vllm_plugin.install()
        assert len(vllm_plugin.installed()) == 6
        logged = "\n".join(r.getMessage() for r in caplog.records)
        assert "new optional keyword-only parameter staged=None" in logged
    finally:
        vllm_plugin.uninstall()


def test_depth_control_takes_a_new_optional_argument_of_what_it_wraps(
    fake_vllm: dict[str, types.ModuleType],  # noqa: F811,
) -> None:
    """record_confidences(..., source=None): the wrapper passes it through (before, it took
    exactly vLLM 0.33.0's arguments and the check refused any other)."""
    seen: list[Any] = []

    class Manager(FakeManager):
        def record_confidences(  # type: ignore[override]
            self, confidence_probs: Any, input_batch: Any, source: Any = None
        ) -> None:
            seen.append(source)
            super().record_confidences(confidence_probs, input_batch)

    fake_vllm[BUDGET_MODULE].AdaptiveVerificationManager = Manager  # type: ignore[attr-defined]
    try:
        vllm_plugin.install_depth_control()
        manager = Manager(4)
        batch = types.SimpleNamespace(idx_mapping_np=np.arange(2), num_reqs=2)
        manager.record_confidences(np.ones((2, 4), np.float32), batch, source="head")
        assert seen == ["head"]
    finally:
        vllm_plugin.uninstall()


@pytest.mark.parametrize(
    ("body", "named"),
    [
        (
            "        for step in range(num_speculative_tokens or 1):\n"
            "            if not self.confidence_stop.should_continue():\n"
            "                break\n",
            "should_continue",
        ),
        # The branch's shape: propose begins the round, the decode loop stops it.
        (
            "        stop = self.confidence_stop\n"
            "        stop.begin_round(input_batch.idx_mapping_np)\n"
            "        self._multi_step_decode(input_batch, confidence_stop=stop)\n",
            "begin_round",
        ),
        (
            "        self._multi_step_decode(input_batch, confidence_stop=self.confidence_stop)\n",
            "self.confidence_stop",
        ),
    ],
)
def test_depth_control_refuses_a_speculator_that_stops_drafting_on_its_own(
    fake_vllm: dict[str, types.ModuleType],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    body: str,
    named: str,
) -> None:
    """A DraftConfidenceStop drafts fewer positions than the depth av_core chose, so the hook
    would record confidences for positions never drafted; a stop handed on to a helper (the
    branch's decode loop) counts too."""
    module_name, class_name = vllm_plugin.DEPTH_SPECULATORS[0]
    source = (
        "class Stopping:\n"
        "    def propose(self, input_batch, *, dummy_run=False, num_speculative_tokens=None):\n"
        + body
    )
    stopping = define(source, "av_core_test_stopping", monkeypatch)
    setattr(fake_vllm[module_name], class_name, stopping.Stopping)
    with pytest.raises(VllmCompatibilityError, match="stops drafting early on its own") as error:
        vllm_plugin.install_depth_control()
    assert named in str(error.value)
    assert vllm_plugin.installed() == []


@pytest.mark.parametrize(
    "parameters",
    [
        "input_batch, *, max_num_speculative_tokens=None",
        "input_batch, *, num_speculative_tokens=4",
        "input_batch, num_speculative_tokens=None, /",
        "batch, *, num_speculative_tokens=None",
    ],
)
def test_depth_control_refuses_a_propose_whose_depth_keyword_is_another(
    fake_vllm: dict[str, types.ModuleType],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    parameters: str,
) -> None:
    """The wrapper passes ``num_speculative_tokens`` by keyword: a parameter of another name
    (``max_num_speculative_tokens=None`` holds the text), another default or a positional-only
    one would fail or mean something else inside vLLM's step."""
    module_name, class_name = vllm_plugin.DEPTH_SPECULATORS[1]
    source = f"class Other:\n    def propose(self, {parameters}):\n        return None\n"
    other = define(source, "av_core_test_other", monkeypatch).Other
    setattr(fake_vllm[module_name], class_name, other)
    with pytest.raises(VllmCompatibilityError, match="expected \\(self, input_batch, ..., num_"):
        vllm_plugin.install_depth_control()
    assert vllm_plugin.installed() == []


def test_depth_control_wraps_a_subclass_keeping_the_contract_and_refuses_one_that_stops(
    fake_vllm: dict[str, types.ModuleType],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A subclass's own ``propose``: wrapped as the base's when it keeps the contract, refused
    when built when it stops drafting on its own; neither refuses the install."""
    module_name, class_name = vllm_plugin.DEPTH_SPECULATORS[0]
    module = sys.modules[module_name]
    source = (
        f"from {module_name} import {class_name}\n\n\n"
        f"class Plain({class_name}):\n"
        "    def propose(self, input_batch, *args, num_speculative_tokens=None, **kwargs):\n"
        "        self.depths_asked.append(num_speculative_tokens)\n\n\n"
        f"class Stopping({class_name}):\n"
        "    def propose(self, input_batch, *args, num_speculative_tokens=None, **kwargs):\n"
        "        while self.confidence_stop.should_continue():\n"
        "            pass\n"
    )
    defined = define(source, "av_core_test_speculators", monkeypatch)
    own = vars(defined.Plain)["propose"]
    assert getattr(module, class_name) is defined.Plain.__mro__[1]
    wrapped = vllm_plugin.install_depth_control()
    assert vars(defined.Plain)["propose"].__wrapped__ is own
    assert any(entry.owner is defined.Plain for entry in wrapped)
    with pytest.raises(VllmCompatibilityError, match="Stopping.propose .*should_continue"):
        defined.Stopping()
    defined.Plain()
    vllm_plugin.uninstall()
    assert vars(defined.Plain)["propose"] is own and "__init__" not in vars(defined.Stopping)
