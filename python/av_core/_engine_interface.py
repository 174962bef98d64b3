"""What the engine integrations (:mod:`av_core.vllm`, :mod:`av_core.sglang`) share to check an
engine's interfaces before patching anything: the text of a signature, the object behind a
dotted name, the installed engine's version, whether a changed signature is additive (every
call it allowed keeps its meaning) or changed (:func:`compare_signatures`), and the subclasses
that override a patched method. Nothing here imports an engine until asked."""

from __future__ import annotations

import ast
import importlib
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal

from av_core._native import InvalidValueError


def signature_text(function: Callable[..., Any]) -> str:
    """``(a, b=1, *, c=None)``: parameter names, kinds and defaults (as ``repr``), no
    annotations. The same text :mod:`ast` gives for the source (``ast.unparse`` of a constant
    default is its ``repr``), so live objects and released source compare as strings."""
    parts: list[str] = []
    star = False
    parameters = list(inspect.signature(function).parameters.values())
    for index, parameter in enumerate(parameters):
        kind = parameter.kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            parts.append(f"*{parameter.name}")
            star = True
        elif kind is inspect.Parameter.VAR_KEYWORD:
            parts.append(f"**{parameter.name}")
        else:
            if kind is inspect.Parameter.KEYWORD_ONLY and not star:
                parts.append("*")
                star = True
            text = parameter.name
            if parameter.default is not inspect.Parameter.empty:
                text += f"={parameter.default!r}"
            parts.append(text)
        is_last_positional_only = kind is inspect.Parameter.POSITIONAL_ONLY and (
            index + 1 == len(parameters)
            or parameters[index + 1].kind is not inspect.Parameter.POSITIONAL_ONLY
        )
        if is_last_positional_only:
            parts.append("/")
    return "(" + ", ".join(parts) + ")"


def resolve(module: ModuleType, dotted: str) -> Any:
    """The object ``module.<dotted>`` names, read without running descriptors (a static or class
    method as its function)."""
    value: Any = module
    for part in dotted.split("."):
        value = inspect.getattr_static(value, part)
    if isinstance(value, staticmethod | classmethod):
        value = value.__func__
    return value


def engine_version(package: str) -> str:
    """``package.__version__``, else ``package.version.__version__`` (as a string); ``unknown``
    when neither says (a source checkout without version metadata)."""
    version = getattr(sys.modules.get(package), "__version__", None)
    if version is None:
        try:
            module = importlib.import_module(f"{package}.version")
        except ImportError:
            return "unknown"
        version = getattr(module, "__version__", None)
    return "unknown" if version is None else str(version)


# --- what changed between two signatures ------------------------------------------------------

#: How a parameter can be passed (the names of :class:`inspect.Parameter` kinds, lower case).
ParameterKind = Literal[
    "positional_only", "positional_or_keyword", "var_positional", "keyword_only", "var_keyword"
]


@dataclass(frozen=True)
class Parameter:
    """One parameter of a signature written as :func:`signature_text` writes it; ``default`` is
    the default's text (``None`` for a required parameter)."""

    name: str
    kind: ParameterKind
    default: str | None = None


def parse_signature(text: str) -> tuple[Parameter, ...]:
    """The parameters of ``text`` (``(a, b=1, *, c=None)``, :func:`signature_text`'s notation);
    ``ValueError`` naming the text when it is not a parameter list."""
    try:
        tree = ast.parse(f"def _{text}:\n    pass\n")
        function = tree.body[0]
    except SyntaxError as error:
        raise InvalidValueError(f"not a signature: {text!r} ({error.msg})") from error
    if len(tree.body) != 1 or not isinstance(function, ast.FunctionDef):
        raise InvalidValueError(f"not a signature: {text!r}")
    arguments = function.args
    positional = [*arguments.posonlyargs, *arguments.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(arguments.defaults))
    defaults += arguments.defaults
    parameters: list[Parameter] = []
    for index, (arg, default) in enumerate(zip(positional, defaults, strict=True)):
        kind: ParameterKind = (
            "positional_only" if index < len(arguments.posonlyargs) else "positional_or_keyword"
        )
        parameters.append(Parameter(arg.arg, kind, _default_text(default)))
    if arguments.vararg is not None:
        parameters.append(Parameter(arguments.vararg.arg, "var_positional"))
    for arg, kw_default in zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True):
        parameters.append(Parameter(arg.arg, "keyword_only", _default_text(kw_default)))
    if arguments.kwarg is not None:
        parameters.append(Parameter(arguments.kwarg.arg, "var_keyword"))
    return tuple(parameters)


def _default_text(node: ast.expr | None) -> str | None:
    return None if node is None else ast.unparse(node)


@dataclass(frozen=True)
class SignatureChange:
    """How a signature differs from the one an integration was written against.

    ``kind``: ``"same"``; ``"additive"`` when every call the old signature accepted still means
    the same (new parameters are optional and come after the old positional ones or are
    keyword-only, a required parameter became optional, ``*args``/``**kwargs`` appeared);
    ``"changed"`` otherwise (a parameter removed, renamed, moved, of another kind, newly
    required, or with another default). ``changes`` names each difference."""

    kind: Literal["same", "additive", "changed"]
    changes: tuple[str, ...] = ()

    def describe(self) -> str:
        return "; ".join(self.changes) if self.changes else "no change"


def compare_signatures(expected: str, found: str) -> SignatureChange:
    """What changed from ``expected`` to ``found`` (both in :func:`signature_text`'s notation)."""
    old, new = parse_signature(expected), parse_signature(found)
    if old == new:
        return SignatureChange("same")
    changed: list[str] = []
    added: list[str] = []
    old_positional = [p for p in old if p.kind in _POSITIONAL]
    new_positional = [p for p in new if p.kind in _POSITIONAL]
    new_by_name = {p.name: p for p in new}
    old_names = {p.name for p in old}
    for index, before in enumerate(old_positional):
        after = new_positional[index] if index < len(new_positional) else None
        if after is None or after.name != before.name:
            moved = new_by_name.get(before.name)
            if moved is None and after is not None and after.name not in old_names:
                changed.append(f"parameter {before.name} renamed to {after.name}")
            elif moved is None:
                changed.append(f"parameter {before.name} removed")
            else:
                changed.append(f"parameter {before.name} moved ({_where(moved, new)})")
            continue
        changed += _parameter_changes(before, after, added)
    old_star = next((p.name for p in old if p.kind == "var_positional"), None)
    for extra in new_positional[len(old_positional) :]:
        if extra.name in old_names and not old_star:
            continue  # reported where it used to be
        if extra.default is None:
            changed.append(f"new required parameter {extra.name}")
        elif old_star:
            changed.append(
                f"new positional parameter {extra.name}={extra.default} takes what *{old_star} took"
            )
        else:
            added.append(f"new optional parameter {extra.name}={extra.default}")
    for before in (p for p in old if p.kind not in _POSITIONAL):
        after = new_by_name.get(before.name)
        if after is None:
            star = "*" if before.kind == "var_positional" else "**"
            what = f"{star}{before.name}" if before.kind in _VARIADIC else before.name
            changed.append(f"parameter {what} removed")
        elif (
            before.kind == "keyword_only"
            and after.kind == "positional_or_keyword"
            and new_positional.index(after) >= len(old_positional)
        ):
            added.append(f"parameter {before.name} can now also be passed positionally")
            changed += _parameter_changes(before, after, added, kinds=False)
        elif after.kind != before.kind:
            changed.append(f"parameter {before.name} moved ({_where(after, new)})")
        else:
            changed += _parameter_changes(before, after, added)
    for extra in (p for p in new if p.kind not in _POSITIONAL and p.name not in old_names):
        if extra.kind in _VARIADIC:
            star = "*" if extra.kind == "var_positional" else "**"
            added.append(f"now takes {star}{extra.name}")
        elif extra.default is None:
            changed.append(f"new required keyword-only parameter {extra.name}")
        else:
            added.append(f"new optional keyword-only parameter {extra.name}={extra.default}")
    if changed:
        return SignatureChange("changed", tuple(changed + added))
    return SignatureChange("additive", tuple(added))


_POSITIONAL = ("positional_only", "positional_or_keyword")
_VARIADIC = ("var_positional", "var_keyword")


def _where(parameter: Parameter, signature: tuple[Parameter, ...]) -> str:
    if parameter.kind == "keyword_only":
        return "now keyword-only"
    if parameter.kind in _VARIADIC:
        return "now variadic"
    index = [p.name for p in signature if p.kind in _POSITIONAL].index(parameter.name)
    return f"now positional parameter {index + 1}"


def _parameter_changes(
    before: Parameter, after: Parameter, added: list[str], *, kinds: bool = True
) -> list[str]:
    """The changes of one parameter kept under its name and place (what only widens the calls
    it takes, optional now or no longer positional-only, goes to ``added``)."""
    changes = []
    if kinds and before.kind != after.kind:
        if (before.kind, after.kind) == ("positional_only", "positional_or_keyword"):
            added.append(f"parameter {before.name} can now also be passed by keyword")
        else:
            changes.append(f"parameter {before.name} is now {after.kind.replace('_', '-')}")
    if before.default != after.default:
        if before.default is None:
            added.append(f"parameter {before.name} is now optional (default {after.default})")
        elif after.default is None:
            changes.append(f"parameter {before.name} is now required (was {before.default})")
        else:
            changes.append(
                f"parameter {before.name}: default {before.default} is now {after.default}"
            )
    return changes


def accepts(interface: str, implementation: str) -> SignatureChange:
    """Whether a function with signature ``implementation`` takes every call that ``interface``
    allows, with the same meaning: :func:`compare_signatures` from the interface to the
    implementation must be ``same`` or ``additive`` (a ``changed`` result names what the
    implementation lacks)."""
    return compare_signatures(interface, implementation)


def overriding_subclasses(owner: type, attribute: str) -> list[type]:
    """The classes below ``owner`` (every generation, as far as they exist now) that define
    ``attribute`` themselves: a patch of ``owner.attribute`` never runs for their instances."""
    found: list[type] = []
    seen: set[int] = set()
    pending: list[type] = list(type.__subclasses__(owner))
    while pending:
        cls = pending.pop()
        if id(cls) in seen:
            continue
        seen.add(id(cls))
        if attribute in vars(cls):
            found.append(cls)
        pending.extend(type.__subclasses__(cls))
    return sorted(found, key=lambda cls: f"{cls.__module__}.{cls.__qualname__}")


def release_numbers(version: str) -> tuple[int, ...]:
    """The leading numeric components of ``version`` (``0.5.24.dev0`` → ``(0, 5, 24)``,
    ``0.33.0rc1`` → ``(0, 33, 0)``); empty when it starts with none."""
    numbers: list[int] = []
    for part in version.strip().split("."):
        digits = ""
        for char in part:
            if not char.isdigit():
                break
            digits += char
        if not digits:
            break
        numbers.append(int(digits))
        if len(digits) < len(part):
            break
    return tuple(numbers)


def older_than(version: str, reference: str) -> bool:
    """Whether ``version`` is numerically below ``reference``; a version without a number (a
    source tree that does not say) is not: the interface checks decide for it."""
    numbers = release_numbers(version)
    return bool(numbers) and numbers < release_numbers(reference)


@dataclass(frozen=True)
class InterfaceReport:
    """What an installer's interface check found: ``problems`` (each refuses the install) and
    ``accepted`` (additive changes taken as they are, which the installer logs)."""

    problems: list[str]
    accepted: list[str]


def record_signature(
    report: InterfaceReport,
    where: str,
    known: str | list[str],
    found: str,
    *,
    newest: str = "the newest known revision",
    taken_by: str | None = None,
) -> None:
    """Classifies the signature ``found`` of ``where`` against the ``known`` ones (oldest
    first; the last is ``newest``): one of them, or an additive change of the newest, is
    accepted; anything else is a problem naming what changed. A definition av_core replaces
    has ``taken_by``, its replacement's signature: an additive change must be one the
    replacement takes too."""
    versions = [known] if isinstance(known, str) else list(known)
    if found in versions:
        change = compare_signatures(versions[0], found)
        if change.kind != "same":
            report.accepted.append(f"{where}{found}: as on {newest}, {change.describe()}")
        return
    change = compare_signatures(versions[-1], found)
    if change.kind == "changed":
        report.problems.append(
            f"{where}{found} differs from the expected {versions[-1]}: {change.describe()}"
        )
    elif taken_by is not None and compare_signatures(found, taken_by).kind == "changed":
        report.problems.append(
            f"{where}{found}: {change.describe()}, which av_core's replacement {taken_by} "
            "does not take"
        )
    else:
        report.accepted.append(f"{where}{found}: {change.describe()}")


def check_signature(
    report: InterfaceReport,
    modules: Any,
    module_name: str,
    dotted: str,
    known: str | list[str],
    *,
    newest: str = "the newest known revision",
    taken_by: str | None = None,
) -> None:
    """:func:`record_signature` of ``modules[module_name].<dotted>``; a definition that is not
    there, or not inspectable, is a problem."""
    where = f"{module_name}.{dotted}"
    try:
        found = signature_text(resolve(modules[module_name], dotted))
    except (AttributeError, KeyError, TypeError, ValueError) as error:
        report.problems.append(f"{where}: not found or not inspectable ({error})")
        return
    record_signature(report, where, known, found, newest=newest, taken_by=taken_by)
