"""Reading the environment variables that switch av_core's behaviour: one spelling of on and off
for all of them, and anything else refused naming the variable and its value (a typo must not
quietly leave a switch off, or on)."""

from __future__ import annotations

import os

#: What turns a switch on, and off (compared after ``strip().lower()``; unset is off).
ON = ("1", "true", "yes", "on")
OFF = ("", "0", "false", "no", "off")


def env_flag(name: str) -> bool:
    """Whether the switch ``name`` is on; ``ValueError`` naming it and its value when that is
    neither on (``1``, ``true``, ``yes``, ``on``) nor off (unset, empty, ``0``, ``false``, ``no``,
    ``off``), in any case and with surrounding spaces."""
    text = os.environ.get(name, "")
    value = text.strip().lower()
    if value in ON:
        return True
    if value in OFF:
        return False
    raise ValueError(
        f"{name}={text!r}: expected 1, true, yes or on to switch it on, or 0, false, no, off or "
        "empty to leave it off"
    )


def env_text(name: str) -> str | None:
    """The value of ``name`` without surrounding spaces; ``None`` when unset or empty."""
    value = os.environ.get(name, "").strip()
    return value or None
