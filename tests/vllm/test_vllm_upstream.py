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
- vllm#52559's ``DFlashAdaptiveKManager`` (reproduced in our own words, from its PR branch,
  vllm-project/vllm@b1171c804b96474eafd3e2f0354b8ec67bfa8ab7, 2026-08-17) overrides
  ``get_num_tokens``, where the base-class patch never runs: refused naming the subclass, also
  when the subclass is defined after the install; one that calls ``super()`` is accepted. Its
  verify table by batch size and K is refused by name where av_core would read it as flat.

Without vLLM: additive and changed signatures of what the plugin replaces and wraps, and a
``DraftConfidenceStop`` (vllm-project/vllm@41f9ab88bf8c4dd4f2d22f31d625006a9619b612) inside a
speculator's ``propose``, which drafting-depth control refuses.
"""

from __future__ import annotations

import ast
import logging
import re
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_vllm import build_fake_vllm, originals
from test_vllm_contract import (  # noqa: F401 - fixtures
    load_vllm,
    release,
    vllm_sources,
    wheel,
)
from test_vllm_depth import FakeManager, fake_vllm  # noqa: F401 - a fixture

from av_core.vllm import plugin as vllm_plugin
from av_core.vllm.plugin import BUDGET_MODULE, VllmCompatibilityError

DFLASH_MODULE = "vllm.v1.worker.gpu.spec_decode.dflash.adaptive_k"


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

DFLASH_SOURCE = '''\
"""Reproduction (av_core tests) of vllm#52559's DFlash adaptive-K manager's shape: a subclass of
AdaptiveVerificationManager that picks one K for the whole batch and prices verification with
a table by batch size and K."""

import numpy as np

from vllm.v1.worker.gpu.spec_decode.adaptive_verification import AdaptiveVerificationManager


class DFlashAdaptiveKManager(AdaptiveVerificationManager):
    def get_num_tokens(self, num_tokens_per_req, draft_tokens):
        draft_ms, verify_ms = self.cost_tables  # verify_ms: [batch + 1, K + 1]
        k = int(np.argmin(verify_ms[len(num_tokens_per_req)]))
        drafts = {r: min(len(draft_tokens.get(r, ())), k) for r in num_tokens_per_req}
        rest = {r: n - len(draft_tokens.get(r, ())) for r, n in num_tokens_per_req.items()}
        self._batch_budget = (drafts, rest, sum(drafts.values()))
        return sum(rest.values()) + sum(drafts.values())
'''


def define(source: str, name: str, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """``source`` executed as module ``name`` (with its source readable, as on disk)."""
    import linecache

    filename = f"<av_core test {name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    module = types.ModuleType(name)
    module.__file__ = filename
    monkeypatch.setitem(sys.modules, name, module)
    exec(compile(source, filename, "exec"), module.__dict__)  # noqa: S102
    return module


@pytest.mark.vllm
def test_a_manager_subclass_overriding_get_num_tokens_is_refused_by_name(
    vllm_sources: dict[str, str],  # noqa: F811
    wheel: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before, the base-class patch was installed and never ran for DFlash's manager."""
    modules = load_vllm(vllm_sources, wheel, monkeypatch)
    define(DFLASH_SOURCE, DFLASH_MODULE, monkeypatch)
    refused_by_real(modules, f"{DFLASH_MODULE}.DFlashAdaptiveKManager overrides get_num_tokens")


@pytest.mark.vllm
def test_a_subclass_calling_super_is_accepted_and_later_overrides_are_refused(
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
    define(wrapping, "av_core_test_wrapping", monkeypatch)
    try:
        with caplog.at_level(logging.INFO, logger="vllm.av_core"):
            vllm_plugin.install()
        assert any(
            "Logged.get_num_tokens overrides and calls super()" in r.getMessage()
            for r in caplog.records
        )
        # Defined after the install, an override is refused at its definition.
        with pytest.raises(VllmCompatibilityError, match="DFlashAdaptiveKManager overrides"):
            define(DFLASH_SOURCE, DFLASH_MODULE, monkeypatch)
        vllm_plugin.uninstall()
        assert "__init_subclass__" not in vars(manager)
        define(DFLASH_SOURCE, DFLASH_MODULE, monkeypatch)  # nothing guards once uninstalled
    finally:
        vllm_plugin.uninstall()


def test_a_verify_table_by_batch_and_k_is_refused_by_name_where_av_core_reads_it() -> None:
    """vllm#52559 keeps verify costs as a [batch + 1, K + 1] table; av_core's budget and depth
    hook read a token-indexed one. Before, the table was indexed as if flat."""
    k = 3
    verify = np.full((9, k + 1), np.inf)
    verify[:, 0], verify[:, 1], verify[:, 3] = 2.0, 3.0, 5.0
    manager = types.SimpleNamespace(cost_tables=(np.linspace(0.0, 1.0, 9), verify))
    with pytest.raises(VllmCompatibilityError, match=r"shapes \[\(9,\), \(9, 4\)\]"):
        vllm_plugin._get_num_tokens(manager, {"a": 4}, {"a": [1, 2, 3]})
    with pytest.raises(VllmCompatibilityError, match="batch size and K"):
        vllm_plugin._depth_hook(manager, k)
    assert vllm_plugin._DepthState.hook is None


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


def test_depth_control_refuses_a_speculator_that_stops_drafting_on_its_own(
    fake_vllm: dict[str, types.ModuleType],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A DraftConfidenceStop inside ``propose`` drafts fewer positions than the depth av_core
    chose; before, the hook recorded confidences for positions never drafted."""
    module_name, class_name = vllm_plugin.DEPTH_SPECULATORS[0]
    source = (
        "class Stopping:\n"
        "    def propose(self, input_batch, *, dummy_run=False, num_speculative_tokens=None):\n"
        "        for step in range(num_speculative_tokens or 1):\n"
        "            if not self.confidence_stop.should_continue():\n"
        "                break\n"
    )
    stopping = define(source, "av_core_test_stopping", monkeypatch)
    setattr(fake_vllm[module_name], class_name, stopping.Stopping)
    with pytest.raises(VllmCompatibilityError, match="stops drafting early on its own"):
        vllm_plugin.install_depth_control()
    assert vllm_plugin.installed() == []
