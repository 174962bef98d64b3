"""How av_core's vLLM plugin patches vLLM and undoes it: each :class:`Replacement` it makes,
and what a subclass of a patched class gets (:func:`override_plan`): nothing when its own
definition calls ``super()`` into the patch, the same patch when it keeps the contract
(:class:`~av_core.vllm.interface.PatchTarget`), else a constructor that refuses it by name. A
refused subclass stays importable: only a server that builds one fails to start, so a vLLM that
ships such a subclass (vllm#52559's ``DFlashAdaptiveKManager``) still runs av_core for every
other configuration. While installed, subclasses defined later get the same, at their
definition."""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass
from typing import Any

from av_core.vllm.interface import (
    Override,
    PatchTarget,
    VllmCompatibilityError,
    calls_super,
    classify_override,
)

logger = logging.getLogger("vllm.av_core")

#: What tells a user how to run without av_core's patches.
DISABLE_HINT = (
    "Run it without av_core (AV_CORE_VLLM, AV_CORE_VLLM_DEPTH unset), or av_core without it"
)


@dataclass(frozen=True)
class Replacement:
    """One attribute swapped by :func:`install`."""

    owner: Any
    owner_name: str
    attribute: str
    original: Any
    replacement: Any
    #: A guard (refusing what av_core cannot patch), not a replacement.
    guard: bool = False

    def describe(self) -> str:
        function = getattr(self.replacement, "__func__", self.replacement)
        new = f"{function.__module__}.{function.__qualname__}"
        return f"{self.owner_name}.{self.attribute} -> {new}"


_installed: list[Replacement] = []

#: ``Replacement.original`` of an attribute the class did not define itself (restored by
#: deleting it).
_ABSENT: Any = object()

#: The targets av_core patches on each class, by attribute, for the subclasses defined later.
_guarded: dict[type, dict[str, PatchTarget]] = {}

#: Each class refused when constructed: (attribute, its refused definition, the message).
_refusals: dict[type, list[tuple[str, Any, str]]] = {}


def override_plan(found: list[Override]) -> list[Replacement]:
    """What each overriding subclass gets: nothing when it calls ``super()`` (the base's patch
    runs), the base's patch applied to its own method when that keeps the contract, else a
    constructor that raises :class:`VllmCompatibilityError` naming it and what differs (only
    a server that builds one fails to start; the class itself stays importable). Logs each."""
    plan: list[Replacement] = []
    refused = {id(method) for entries in _refusals.values() for _, method, _ in entries}
    refused |= {id(o.method) for o in found if not o.calls_super and o.problems}
    for override in found:
        target, attribute = override.target, override.target.attribute
        where = f"{override.name}.{attribute}"
        if override.calls_super:
            into = _super_into_refused(override.cls, attribute, refused)
            if into is None:
                logger.info("av_core: %s overrides and calls super()", where)
                continue
            override = Override(
                override.cls,
                override.name,
                target,
                False,
                (f"{where} calls super() into {into}, which av_core refuses",),
            )
        if not override.problems:
            logger.info("av_core: %s keeps the contract of %s", where, target.owner_name)
            plan.append(
                Replacement(
                    override.cls,
                    override.name,
                    attribute,
                    override.method,
                    target.patch(override.method),
                )
            )
        else:
            message = (
                f"{where} overrides {target.owner_name}.{attribute}, where av_core's patch "
                "would never run for it, and differs from what av_core patches: "
                f"{'; '.join(override.problems)}. {DISABLE_HINT}"
            )
            # Not a warning: nothing is wrong unless a server builds one, which then fails.
            logger.info("av_core: %s (constructing one raises)", message)
            plan += _refuse_construction(override.cls, override.name)
            _refusals[override.cls].append((attribute, override.method, message))
            refused.add(id(override.method))
    return plan


def _super_into_refused(cls: type, attribute: str, refused: set[int]) -> str | None:
    """The refused definition (by name) that ``cls``'s ``super()`` call reaches first, through
    any definitions that call ``super()`` in turn; ``None`` when it reaches none."""
    for parent in cls.__mro__[1:]:
        method = vars(parent).get(attribute)
        if method is None:
            continue
        if id(method) in refused:
            return f"{parent.__module__}.{parent.__qualname__}.{attribute}"
        if not calls_super(method, attribute):
            return None
    return None


def _refuse_construction(cls: type, name: str) -> list[Replacement]:
    """The ``__init__`` that refuses instances of ``cls`` whose ``attribute`` is still a
    refused definition (a further subclass with its own, accepted one constructs); one per
    class, whatever it refuses."""
    if cls in _refusals:
        return []
    _refusals[cls] = []
    original = vars(cls).get("__init__", _ABSENT)
    owner: Any = cls

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        for refused_attribute, refused, text in _refusals.get(cls, ()):
            if inspect.getattr_static(type(self), refused_attribute, None) is refused:
                raise VllmCompatibilityError(text)
        if original is _ABSENT:
            super(owner, self).__init__(*args, **kwargs)
        else:
            original(self, *args, **kwargs)

    if original is not _ABSENT:
        __init__.__wrapped__ = original  # type: ignore[attr-defined]
    return [Replacement(cls, name, "__init__", original, __init__, guard=True)]


def subclass_guard(targets: list[PatchTarget]) -> list[Replacement]:
    """While installed, a subclass of a target's owner defined later gets what
    :func:`_override_plan` gives one found at the install, at its definition. Returns the
    ``__init_subclass__`` replacements to install (one per owner)."""
    plan = []
    for target in targets:
        owner = target.owner
        fresh = owner not in _guarded
        _guarded.setdefault(owner, {})[target.attribute] = target
        if fresh:
            plan.append(_guard(owner, target.owner_name))
    return plan


def _guard(owner: type, owner_name: str) -> Replacement:
    base: Any = owner
    original = vars(owner).get("__init_subclass__", _ABSENT)

    def __init_subclass__(cls: Any, /, **kwargs: Any) -> None:  # noqa: N807
        if original is _ABSENT:
            super(base, cls).__init_subclass__(**kwargs)
        else:
            original.__get__(None, cls)(**kwargs)
        found = [
            classify_override(cls, target)
            for attribute, target in sorted(_guarded.get(owner, {}).items())
            if attribute in vars(cls)
        ]
        apply(override_plan(found))

    return Replacement(
        owner,
        owner_name,
        "__init_subclass__",
        original,
        classmethod(__init_subclass__),
        guard=True,
    )


def apply(plan: list[Replacement], verb: str = "replaced") -> None:
    for entry in plan:
        setattr(entry.owner, entry.attribute, entry.replacement)
        _installed.append(entry)
        if entry.guard:
            logger.info("av_core: guards %s.%s", entry.owner_name, entry.attribute)
        else:
            logger.info("av_core: %s %s", verb, entry.describe())


def restore() -> list[Replacement]:
    """Undoes every replacement and guard, newest first; returns them in that order."""
    undone = []
    while _installed:
        entry = _installed.pop()
        if entry.original is _ABSENT:
            delattr(entry.owner, entry.attribute)
        else:
            setattr(entry.owner, entry.attribute, entry.original)
        undone.append(entry)
    _guarded.clear()
    _refusals.clear()
    return undone


def installed() -> list[Replacement]:
    """The replacements in effect (without the guards against subclasses av_core cannot
    patch)."""
    return [entry for entry in _installed if not entry.guard]
