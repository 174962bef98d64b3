"""``av_core._engine_interface.compare_signatures``, the additive-or-changed verdict both
installers act on, held to Python's own call binding: a change is additive exactly when every
call the old signature accepts binds the same arguments to the same parameters under the new
one, with the same defaults for what it leaves out (checked by enumerating the calls of small
random signatures and binding them with :func:`inspect.Signature.bind`)."""

from __future__ import annotations

import inspect
import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from av_core._engine_interface import compare_signatures, parse_signature, signature_text

NAMES = ("a", "b", "c", "d", "e")
DEFAULTS = (None, "0", "1", "'x'")


@st.composite
def signatures(draw: Any) -> str:
    """A valid parameter list in signature_text's notation."""
    names = list(draw(st.permutations(NAMES)))[: draw(st.integers(0, 4))]
    positional = draw(st.integers(0, len(names)))
    parts: list[str] = []
    defaulted = False
    for name in names[:positional]:
        default = (
            draw(st.sampled_from(DEFAULTS))
            if not defaulted
            else draw(st.sampled_from(DEFAULTS[1:]))
        )
        defaulted = defaulted or default is not None
        parts.append(name if default is None else f"{name}={default}")
    if draw(st.booleans()):
        parts.append("*args")
    elif positional < len(names):
        parts.append("*")
    for name in names[positional:]:
        default = draw(st.sampled_from(DEFAULTS))
        parts.append(name if default is None else f"{name}={default}")
    if draw(st.booleans()):
        parts.append("**kw")
    return "(" + ", ".join(parts) + ")"


def function(text: str) -> Any:
    namespace: dict[str, Any] = {}
    exec(f"def f{text}:\n    pass\n", namespace)  # noqa: S102 - the test's own signatures
    return namespace["f"]


def calls(text: str) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """Every call of ``text``'s function, up to the order of keywords: each positional parameter
    passed positionally (as a prefix), by keyword or (when optional) left out, each keyword-only
    one passed or left out; plus one extra positional and one extra keyword where accepted.
    Each argument's value is its parameter's name, so where it lands shows where it went."""
    params = parse_signature(text)
    positional = [p for p in params if p.kind in ("positional_only", "positional_or_keyword")]
    keyword_only = [p for p in params if p.kind == "keyword_only"]
    star = any(p.kind == "var_positional" for p in params)
    starstar = any(p.kind == "var_keyword" for p in params)
    found = []
    for prefix in range(len(positional) + 1):
        rest = positional[prefix:]
        choices = [("keyword", "out") if p.default is not None else ("keyword",) for p in rest]
        choices += [
            ("keyword", "out") if p.default is not None else ("keyword",) for p in keyword_only
        ]
        for pick in itertools.product(*choices):
            if any(
                p.kind == "positional_only" and how == "keyword"
                for p, how in zip(rest, pick, strict=False)
            ):
                continue
            args = tuple(p.name for p in positional[:prefix])
            kwargs = {
                p.name: p.name
                for p, how in zip([*rest, *keyword_only], pick, strict=True)
                if how == "keyword"
            }
            for extra_args in ((), ("extra",)) if star and prefix == len(positional) else ((),):
                for extra_kw in ({}, {"zz": "zz"}) if starstar else ({},):
                    found.append((args + extra_args, {**kwargs, **extra_kw}))
    return found


def same_meaning(old: str, new: str) -> bool:
    """Whether every call of ``old`` binds under ``new`` to the same parameters, with the same
    defaults for the parameters it leaves out (the reference, from inspect's binding)."""
    before, after = inspect.signature(function(old)), inspect.signature(function(new))
    for args, kwargs in calls(old):
        try:
            bound_after = after.bind(*args, **kwargs)
        except TypeError:
            return False
        bound_before = before.bind(*args, **kwargs)
        old_names = set(before.parameters)
        kept = {
            name: value
            for name, value in filled(bound_after).items()
            if name in old_names or value != after.parameters[name].default
        }  # a new parameter left at its default is no change of meaning
        if filled(bound_before) != kept:
            return False
    return True


def filled(bound: inspect.BoundArguments) -> dict[str, Any]:
    """The arguments with defaults applied; an empty ``*args``/``**kwargs`` is no argument."""
    bound.apply_defaults()
    return {name: value for name, value in bound.arguments.items() if value not in ((), {})}


@settings(max_examples=400, deadline=None)
@given(signatures(), signatures())
def test_additive_means_every_old_call_keeps_its_meaning(old: str, new: str) -> None:
    verdict = compare_signatures(old, new)
    assert (verdict.kind in ("same", "additive")) == same_meaning(old, new), (old, new, verdict)
    assert (verdict.kind == "same") == (parse_signature(old) == parse_signature(new))
    if verdict.kind != "same":
        assert verdict.changes  # every difference is named


@settings(max_examples=200, deadline=None)
@given(signatures(), st.sampled_from(NAMES), st.sampled_from(DEFAULTS[1:]))
def test_a_new_optional_trailing_parameter_is_additive(old: str, name: str, default: str) -> None:
    if name in old or "*" in old:
        return
    new = old[:-1] + (", " if old != "()" else "") + f"{name}={default})"
    assert compare_signatures(old, new).kind == "additive"
    assert f"new optional parameter {name}={default}" in compare_signatures(old, new).describe()


@pytest.mark.parametrize(
    ("old", "new", "kind", "named"),
    [
        ("(self, x, y)", "(self, x, y, num_steps=None)", "additive", "num_steps=None"),
        ("(self, x, y)", "(self, x, z)", "changed", "y renamed to z"),
        ("(self, x, y=None)", "(self, x, y=0)", "changed", "default None is now 0"),
        ("(self, x, y)", "(self, x, y, z)", "changed", "new required parameter z"),
        ("(self, x, y)", "(self, x)", "changed", "y removed"),
        ("(self, x, y)", "(self, x, *, y)", "changed", "y moved (now keyword-only)"),
        ("(self, x)", "(self, x, **kw)", "additive", "now takes **kw"),
        ("(self, x)", "(self, x=1)", "additive", "x is now optional"),
    ],
)
def test_named_cases(old: str, new: str, kind: str, named: str) -> None:
    verdict = compare_signatures(old, new)
    assert verdict.kind == kind and named in verdict.describe()


def test_parse_signature_reads_what_signature_text_writes() -> None:
    def sample(a, /, b, c=1, *args, d, e="x", **kw):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN002, ANN003
        return None

    text = signature_text(sample)
    assert [p.name for p in parse_signature(text)] == ["a", "b", "c", "args", "d", "e", "kw"]
    assert [p.default for p in parse_signature(text)] == [None, None, "1", None, None, "'x'", None]
    with pytest.raises(ValueError, match="not a signature"):
        parse_signature("(a, b")
