"""Every environment variable av_core reads, declared once, and the one rule for a bad value.

Nothing else in the package reads ``os.environ``: each variable is a :class:`Setting` below
(its name, what it takes, its default), and code asks the setting. ``AV_CORE_SIMD`` is read by
the Rust core; it is declared here too, and checked through ``_native.check_environment``.

**What a value the variable does not take does** (docs/settings.md):

- *Checked where something starts.* The command line when it starts, the vLLM plugin and the
  SGLang installer before they patch anything call :func:`check` on every variable they, and
  what they install, will read: a value it does not take raises :class:`SettingError` naming the
  variable, the value and what it takes, and nothing starts (the command line prints it as its
  one error line, exit 2). A typo is never read as "off" or as the default.
- *Never raised while serving.* Code that runs inside a server (a drop-in estimator, the
  metrics, warm restarts) reads :meth:`Setting.get`: a value it does not take there, which only
  a process that skipped the check can meet (a drop-in built without the plugin), is one
  warning naming the variable and the value, and the default. It never raises.

Variables av_core reads but does not own are read as their owner reads them:
``SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND`` with SGLang's spellings, ``RANK`` and ``LOCAL_RANK``
as torch.distributed's non-negative integers, ``PROMETHEUS_MULTIPROC_DIR`` as a folder path.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, TypeVar

from av_core import _native

T = TypeVar("T")

#: What turns a switch on, and off (compared after ``strip().lower()``; unset is off).
ON = ("1", "true", "yes", "on")
OFF = ("", "0", "false", "no", "off")
#: How SGLang 0.5.23 reads its own boolean variables (``sglang.srt.environ.EnvBool``:
#: lower-cased, not stripped); anything else SGLang warns about and takes as off.
SGLANG_ON = ("true", "1", "yes", "y")
SGLANG_OFF = ("false", "0", "no", "n")

#: Loggers the lenient reads warn on: the engine's own, so that the warning shows in its log.
VLLM_LOG = "vllm.av_core"
SGLANG_LOG = "sglang.av_core"


class SettingError(_native.InvalidValueError):
    """An environment variable holds a value av_core does not take; the message names the
    variable, the value and what it takes. An :class:`av_core.InvalidValueError` (so an
    ``av_core.Error`` and a ``ValueError``)."""


_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


class Setting(Generic[T]):
    """One environment variable: ``parse`` turns its text into the value or raises
    ``ValueError`` saying what is wrong; unset is ``default``, as is a refused text read
    leniently (or ``fallback(text)`` when given)."""

    def __init__(
        self,
        name: str,
        default: T,
        takes: str,
        parse: Callable[[str], T],
        *,
        logger: str = "av_core",
        fallback: Callable[[str], T] | None = None,
        owner: str = "av_core",
    ) -> None:
        self.name, self.default, self.takes = name, default, takes
        self._parse, self._fallback = parse, fallback
        self.logger, self.owner = logger, owner

    def __repr__(self) -> str:
        return f"Setting({self.name!r})"

    def text(self) -> str | None:
        """The variable's text as the environment holds it; ``None`` when unset."""
        return os.environ.get(self.name)

    def is_set(self) -> bool:
        """Whether the variable holds anything but blanks."""
        text = self.text()
        return text is not None and text.strip() != ""

    def _read(self) -> tuple[T, str | None]:
        """The value and ``None``; or, for a text the variable does not take, what a lenient
        read gives (``fallback(text)`` or the default) and why the text is refused."""
        text = self.text()
        if text is None:
            return self.default, None
        try:
            return self._parse(text), None
        except ValueError as error:
            value = self._fallback(text) if self._fallback is not None else self.default
            return value, self._describe(text, error)

    def problem(self) -> str | None:
        """Why the current value is refused (naming the variable and the value), or ``None``."""
        return self._read()[1]

    def require(self) -> T:
        """The value; :class:`SettingError` naming the variable for a value it does not take."""
        value, problem = self._read()
        if problem is not None:
            raise SettingError(problem)
        return value

    def get(self) -> T:
        """The value; for a value it does not take, one warning (once per value) and the
        default. Never raises: for code that runs while serving."""
        value, problem = self._read()
        if problem is not None:
            key = (self.name, self.text() or "")
            with _warned_lock:
                first = key not in _warned
                _warned.add(key)
            if first:
                logging.getLogger(self.logger).warning(
                    "av_core: %s; using %s", problem, shown(value)
                )
        return value

    def _describe(self, text: str, error: ValueError) -> str:
        return f"{self.name}={text!r}: {error}"


class _CoreSetting(Setting[None]):
    """A variable the Rust core reads itself (``AV_CORE_SIMD``): checked by the core, whose
    message names it; the core runs its baseline kernels on a value it does not take."""

    def __init__(self, name: str, takes: str) -> None:
        super().__init__(name, None, takes, self._check)

    @staticmethod
    def _check(text: str) -> None:
        _native.check_environment()

    def _describe(self, text: str, error: ValueError) -> str:
        return str(error)


def shown(value: object) -> str:
    """A value as a warning shows it: on/off for a switch, ``unset`` for none."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return "unset" if value is None else str(value)


def switch(name: str, *, default: bool = False, logger: str = "av_core") -> Setting[bool]:
    """On for 1, true, yes or on; off for 0, false, no, off or empty (any case, surrounding
    blanks ignored); unset is ``default``."""

    def parse(text: str) -> bool:
        value = text.strip().lower()
        if value in ON:
            return True
        if value in OFF:
            return default if value == "" else False
        raise _native.InvalidValueError(
            "expected 1, true, yes or on to switch it on, or 0, false, no, off or empty to "
            "leave it off"
        )

    takes = "1, true, yes, on / 0, false, no, off, empty"
    return Setting(name, default, takes, parse, logger=logger)


def choice(
    name: str,
    values: tuple[str, ...],
    *,
    default: str,
    aliases: Mapping[str, str] | None = None,
    logger: str = "av_core",
) -> Setting[str]:
    """One of ``values`` (any case, blanks ignored; ``aliases`` map other spellings to one);
    empty or unset is ``default``."""
    spellings = {"": default, **(aliases or {}), **{v: v for v in values}}

    def parse(text: str) -> str:
        value = text.strip().lower()
        if value in spellings:
            return spellings[value]
        extra = sorted(set(spellings) - set(values) - {""})
        also = f" (also {', '.join(extra)})" if extra else ""
        raise _native.InvalidValueError(f"expected {' or '.join(values)}{also}")

    takes = " | ".join(values) + (
        " (aliases: " + ", ".join(sorted(set(aliases or {}) - {""})) + ")" if aliases else ""
    )
    return Setting(name, default, takes, parse, logger=logger)


def drafter(name: str, *, logger: str) -> Setting[str]:
    """How the drafter's cost grows with depth: ``autoregressive`` (the default) or
    ``parallel``."""
    return choice(name, ("autoregressive", "parallel"), default="autoregressive", logger=logger)


def _bounded(
    convert: Callable[[str], Any], inside: Callable[[Any], bool], what: str, default: Any
) -> Callable[[str], Any]:
    """A parser: blank is ``default``; else ``convert`` of the stripped text, refused as ``not
    {what}`` when it does not convert or is not ``inside``."""

    def parse(text: str) -> Any:
        stripped = text.strip()
        if stripped == "":
            return default
        try:
            value = convert(stripped)
        except ValueError:
            raise _native.InvalidValueError(f"not {what}") from None
        if not inside(value):
            raise _native.InvalidValueError(f"not {what}")
        return value

    return parse


def integer(
    name: str,
    *,
    default: Any,
    low: int,
    high: int | None = None,
    what: str = "",
    logger: str = "av_core",
    owner: str = "av_core",
) -> Setting[Any]:
    """An integer in ``[low, high]`` (blanks ignored); empty or unset is ``default``."""
    what = what or (f"an integer >= {low}" if high is None else f"an integer in {low}..{high}")
    parse = _bounded(int, lambda v: v >= low and (high is None or v <= high), what, default)
    return Setting(name, default, what, parse, logger=logger, owner=owner)


def number(
    name: str, *, default: float, low: float, high: float, logger: str = "av_core"
) -> Setting[float]:
    """A finite number in ``[low, high]``; read leniently, a number outside is the nearest bound
    (anything else the default)."""
    what = f"a number in [{low:g}, {high:g}]"
    parse = _bounded(float, lambda v: math.isfinite(v) and low <= v <= high, what, default)

    def nearest(text: str) -> float:
        try:
            value = float(text.strip())
        except ValueError:
            return default
        if math.isnan(value):
            return default
        return min(max(value, low), high)

    return Setting(name, default, what, parse, logger=logger, fallback=nearest)


def text(
    name: str, *, default: str | None = None, logger: str = "av_core", owner: str = "av_core"
) -> Setting[str | None]:
    """Any text, blanks around it ignored; empty or unset is ``default``."""

    def parse(value: str) -> str | None:
        return value.strip() or default

    return Setting(name, default, "any text (a path, a host)", parse, logger=logger, owner=owner)


def sglang_flag(name: str) -> Setting[bool]:
    """One of SGLang's boolean variables, read as SGLang reads it (:data:`SGLANG_ON`,
    :data:`SGLANG_OFF`, lower-cased, not stripped); unset is off. SGLang itself takes any other
    value as off with a warning; av_core refuses it, so that the policy charges what SGLang
    runs."""

    def parse(text: str) -> bool:
        if text.lower() in SGLANG_OFF:
            return False
        if text.lower() in SGLANG_ON:
            return True
        raise _native.InvalidValueError(
            "SGLang reads true, 1, yes or y as on and false, 0, no or n as off (anything else "
            "it takes as off, with a warning)"
        )

    takes = "SGLang's: true, 1, yes, y / false, 0, no, n"
    return Setting(name, False, takes, parse, logger=SGLANG_LOG, owner="SGLang")


#: Defaults and bounds of the metrics' variables.
METRICS_DEFAULT_WINDOW = 10_000
#: The window is allocated up front (9 bytes a draft): a size typed by mistake must not take
#: the server's memory.
METRICS_MAX_WINDOW = 1_000_000
METRICS_DEFAULT_INTERVAL_S = 1.0
#: Below, the fold thread would spin; above, its wait cannot be represented.
METRICS_MIN_INTERVAL_S, METRICS_MAX_INTERVAL_S = 0.01, 86_400.0
#: Refits between two saves of a warm-restart state.
DEFAULT_SAVE_EVERY = 10

# -- the command line -------------------------------------------------------------------------
DEBUG = switch("AV_CORE_DEBUG")
#: llama.cpp's own log output, silenced by ``av_core.llama_cpp`` unless this is on.
LLAMA_LOG = switch("AV_CORE_LLAMA_LOG")
SIMD = _CoreSetting("AV_CORE_SIMD", "baseline | avx2 | avx512, or empty (the widest the CPU has)")

# -- the vLLM plugin and drop-ins -------------------------------------------------------------
VLLM = switch("AV_CORE_VLLM", logger=VLLM_LOG)
VLLM_ANY_VERSION = switch("AV_CORE_VLLM_ANY_VERSION", logger=VLLM_LOG)
VLLM_EXACT = switch("AV_CORE_VLLM_EXACT", logger=VLLM_LOG)
VLLM_ESTIMATOR = choice("AV_CORE_VLLM_ESTIMATOR", ("vllm", "map"), default="vllm", logger=VLLM_LOG)
VLLM_DEPTH = choice(
    "AV_CORE_VLLM_DEPTH",
    ("off", "batch", "per_request"),
    default="off",
    aliases={**dict.fromkeys(ON, "batch"), **dict.fromkeys(OFF, "off")},
    logger=VLLM_LOG,
)
VLLM_DRAFTER = drafter("AV_CORE_VLLM_DRAFTER", logger=VLLM_LOG)
SHARE_STATS = choice(
    "AV_CORE_SHARE_STATS",
    ("off", "dp"),
    default="off",
    aliases={**dict.fromkeys(OFF, "off"), "none": "off"},
    logger=VLLM_LOG,
)
STATE_DIR = text("AV_CORE_STATE_DIR", logger=VLLM_LOG)
STATE_SAVE_EVERY = integer(
    "AV_CORE_STATE_SAVE_EVERY",
    default=DEFAULT_SAVE_EVERY,
    low=1,
    what="a positive integer",
    logger=VLLM_LOG,
)
METRICS = switch("AV_CORE_METRICS", default=True, logger=VLLM_LOG)
METRICS_PORT = integer(
    "AV_CORE_METRICS_PORT",
    default=None,
    low=1,
    high=65535,
    what="a TCP port (1..65535)",
    logger=VLLM_LOG,
)
METRICS_HOST = text("AV_CORE_METRICS_HOST", default="127.0.0.1", logger=VLLM_LOG)
METRICS_WINDOW = integer(
    "AV_CORE_METRICS_WINDOW",
    default=METRICS_DEFAULT_WINDOW,
    low=1,
    high=METRICS_MAX_WINDOW,
    logger=VLLM_LOG,
)
METRICS_INTERVAL = number(
    "AV_CORE_METRICS_INTERVAL",
    default=METRICS_DEFAULT_INTERVAL_S,
    low=METRICS_MIN_INTERVAL_S,
    high=METRICS_MAX_INTERVAL_S,
    logger=VLLM_LOG,
)
PROMETHEUS_MULTIPROC_DIR = text(
    "PROMETHEUS_MULTIPROC_DIR", logger=VLLM_LOG, owner="prometheus_client (vLLM sets it)"
)
LOCAL_RANK = integer(
    "LOCAL_RANK",
    default=None,
    low=0,
    what="a rank (an integer >= 0)",
    logger=VLLM_LOG,
    owner="torch.distributed",
)
RANK = integer(
    "RANK",
    default=None,
    low=0,
    what="a rank (an integer >= 0)",
    logger=VLLM_LOG,
    owner="torch.distributed",
)

# -- the SGLang installer ---------------------------------------------------------------------
SGLANG = switch("AV_CORE_SGLANG", logger=SGLANG_LOG)
SGLANG_ANY_VERSION = switch("AV_CORE_SGLANG_ANY_VERSION", logger=SGLANG_LOG)
SGLANG_COSTS = text("AV_CORE_SGLANG_COSTS", logger=SGLANG_LOG)
#: Price steps from SGLang's own start-up profiling (SGLang main); on by itself without tables.
SGLANG_PROFILE = switch("AV_CORE_SGLANG_PROFILE", logger=SGLANG_LOG)
SGLANG_DRAFTER = drafter("AV_CORE_SGLANG_DRAFTER", logger=SGLANG_LOG)
SGLANG_MAX_BATCH = integer(
    "AV_CORE_SGLANG_MAX_BATCH", default=1024, low=1, what="an integer >= 1", logger=SGLANG_LOG
)
SGLANG_SKIP_ZERO_STEP_EXTEND = sglang_flag("SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND")

#: What each entry point checks before it starts: the command line, the metrics (with the
#: ranks they report under), the vLLM plugin (everything its drop-ins will read) and the
#: SGLang installer.
CLI_SETTINGS = (DEBUG, LLAMA_LOG, SIMD)
METRICS_SETTINGS = (
    METRICS,
    METRICS_PORT,
    METRICS_HOST,
    METRICS_WINDOW,
    METRICS_INTERVAL,
    PROMETHEUS_MULTIPROC_DIR,
    LOCAL_RANK,
    RANK,
)
VLLM_SETTINGS = (
    VLLM,
    VLLM_ANY_VERSION,
    VLLM_EXACT,
    VLLM_ESTIMATOR,
    VLLM_DEPTH,
    VLLM_DRAFTER,
    SHARE_STATS,
    STATE_DIR,
    STATE_SAVE_EVERY,
    *METRICS_SETTINGS,
    SIMD,
)
SGLANG_SETTINGS = (
    SGLANG,
    SGLANG_ANY_VERSION,
    SGLANG_COSTS,
    SGLANG_PROFILE,
    SGLANG_DRAFTER,
    SGLANG_MAX_BATCH,
    SGLANG_SKIP_ZERO_STEP_EXTEND,
    SIMD,
)
#: Every variable av_core reads, once each.
SETTINGS: tuple[Setting[Any], ...] = tuple(
    dict.fromkeys((*CLI_SETTINGS, *VLLM_SETTINGS, *SGLANG_SETTINGS))
)


def check(settings: Iterable[Setting[Any]]) -> None:
    """Raises one :class:`SettingError` naming every variable of ``settings`` whose value is
    refused (what each takes in the message), before anything is started."""
    problems = [problem for setting in settings if (problem := setting.problem()) is not None]
    if problems:
        raise SettingError("; ".join(problems))


def named(name: str) -> Setting[Any]:
    """The declared setting of the variable ``name`` (``KeyError`` for one av_core does not
    read)."""
    for setting in SETTINGS:
        if setting.name == name:
            return setting
    raise KeyError(name)


__all__ = [
    "OFF",
    "ON",
    "SETTINGS",
    "SGLANG_OFF",
    "SGLANG_ON",
    "Setting",
    "SettingError",
    "check",
    "named",
]
