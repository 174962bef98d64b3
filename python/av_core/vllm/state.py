"""Warm restarts of the vLLM drop-in estimator: its state saved and restored across restarts.

``AV_CORE_STATE_DIR=/path`` makes the plugin (:mod:`av_core.vllm.plugin`) attach a
:class:`WarmStart` to every rank's estimator when vLLM builds it: the state saved by the last run
with the same :class:`StateKey` (target model, draft model, method, K, rank) is loaded, and the
state is saved again every ``AV_CORE_STATE_SAVE_EVERY`` refits (default 10) and at shutdown.
Without the plugin, ``WarmStart(directory, key).attach(estimator)`` does the same.

A state is the core's bytes (``AcceptanceEstimator.to_bytes``: versioned and checksummed, the
drop-in's schedule in its counters), written by the bindings' atomic writer (a temporary file in
the same directory, flushed to disk, then renamed over the old one) to
``<key>.avcore`` (:meth:`StateKey.filename`), next to the key it belongs to, ``<key>.key.json``.
Saves happen on a background thread: the serving thread only takes a host snapshot. A state
whose key or estimator configuration differs from the running one (another model, another K,
``AV_CORE_VLLM_EXACT`` switched, ...) is not loaded: a warning says which field differs, and the
estimator cold-starts. Each key has its own files, so when this key has none, the states saved
for the same target model and rank under another key (another draft model, method or K) are
named in that warning. A corrupt or truncated file (its checksum or its contents fail
validation), one that is not a regular file (a FIFO, a device, a directory) or that is longer
than any state is not loaded either, and not read past that bound: a warning, never an
exception into the server, never a wait. The JSON files of earlier releases
(``<key>.json``: key, state and a checksum in one document) still load.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import math
import os
import re
import stat
import threading
import time
import weakref
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from av_core import _settings as settings
from av_core._native import (
    AcceptanceEstimator,
    InvalidTypeError,
    InvalidValueError,
    write_atomically,
)

__all__ = [
    "DEFAULT_SAVE_EVERY",
    "ENV_SAVE_EVERY",
    "ENV_STATE_DIR",
    "FORMAT",
    "FORMAT_VERSION",
    "MAX_STATE_BYTES",
    "StateKey",
    "WarmStart",
]

logger = logging.getLogger("vllm.av_core")

ENV_STATE_DIR = settings.STATE_DIR.name
ENV_SAVE_EVERY = settings.STATE_SAVE_EVERY.name
#: Refits between saves.
DEFAULT_SAVE_EVERY = settings.DEFAULT_SAVE_EVERY
#: The format and version of the JSON files of earlier releases, which still load.
FORMAT = "av_core.vllm.warm_state"
FORMAT_VERSION = 1
#: The longest JSON file read (of an earlier release's state, or a key): far above any of
#: them, so that a foreign or damaged file cannot take the server's memory or time at
#: start-up. (A state's bytes are bounded by the core: ``AcceptanceEstimator.load``.)
MAX_STATE_BYTES = 16 << 20
#: The drop-in's ``state_dict`` format (:meth:`OnlineAcceptanceEstimator.state_dict`).
_DROP_IN = "av_core.vllm.OnlineAcceptanceEstimator"
#: The most other keys' state files read to explain a cold start (see :meth:`WarmStart.load`).
_MAX_NEIGHBOURS = 64


def _read_document(path: Path) -> Any:
    """The JSON document at ``path`` (a key, or an earlier release's state): a regular file of
    at most :data:`MAX_STATE_BYTES`, opened without blocking (a FIFO would wait for a writer
    forever). Raises ``FileNotFoundError`` for no file, ``ValueError`` for anything that is not
    such a document."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    descriptor = os.open(path, flags)
    with os.fdopen(descriptor, "rb") as handle:
        mode = os.fstat(handle.fileno()).st_mode
        if not stat.S_ISREG(mode):
            raise InvalidValueError("not a regular file (a directory, FIFO, socket or device)")
        data = handle.read(MAX_STATE_BYTES + 1)
    if len(data) > MAX_STATE_BYTES:
        raise InvalidValueError(f"longer than any saved state ({MAX_STATE_BYTES} bytes)")
    try:
        return json.loads(data.decode("utf-8"))
    except RecursionError:  # nesting no saved state has
        raise InvalidValueError("nested too deeply to be a saved state") from None


def _saved_at(saved: Any) -> str:
    """When a state was saved, for the log ("?" for anything but a plausible timestamp)."""
    if isinstance(saved, bool) or not isinstance(saved, int | float) or not math.isfinite(saved):
        return "?"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(saved))
    except (OverflowError, OSError, ValueError):
        return "?"


@dataclass(frozen=True)
class _Restored:
    """A state loaded: when it was saved (anything; :func:`_saved_at` reads it)."""

    saved_at: Any


@dataclass(frozen=True)
class StateKey:
    """What a saved state belongs to. ``rank`` names the worker (the plugin uses
    ``dp<data-parallel index>-rank<torch.distributed rank>``)."""

    target_model: str
    draft_model: str
    method: str
    num_speculative_steps: int
    rank: str

    def stem(self) -> str:
        """``<method>-k<K>-<rank>-<hash of the whole key>``: different models coexist in one
        directory."""
        digest = hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{self.method}-k{self.num_speculative_steps}")
        rank = re.sub(r"[^A-Za-z0-9_.-]+", "_", self.rank)
        return f"{slug}-{rank}-{digest[:16]}"

    def filename(self) -> str:
        """The state's file, ``<stem>.avcore``: the core's bytes."""
        return f"{self.stem()}.avcore"

    def key_filename(self) -> str:
        """The key's file, ``<stem>.key.json``."""
        return f"{self.stem()}.key.json"

    def legacy_filename(self) -> str:
        """The state file of earlier releases, ``<stem>.json``."""
        return f"{self.stem()}.json"


def _payload_digest(payload: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _save_every_from_env() -> int:
    value: int = settings.STATE_SAVE_EVERY.get()
    return value


class WarmStart:
    """Loads and saves one estimator's state under ``directory / key.filename()``."""

    def __init__(
        self, directory: str | os.PathLike[str], key: StateKey, *, save_every: int | None = None
    ) -> None:
        if not isinstance(key, StateKey):
            raise InvalidTypeError(f"key must be a StateKey, got {type(key).__name__}")
        if save_every is not None and (
            isinstance(save_every, bool) or not isinstance(save_every, int) or save_every < 1
        ):
            raise InvalidValueError(f"save_every must be an int >= 1, got {save_every!r}")
        self.directory = Path(directory)
        self.key = key
        self.path = self.directory / key.filename()
        self.key_path = self.directory / key.key_filename()
        self.legacy_path = self.directory / key.legacy_filename()
        self.save_every = _save_every_from_env() if save_every is None else save_every
        self._refits_since_save = 0
        self._pending: dict[str, Any] | None = None
        self._wake = threading.Condition()
        self._writer: threading.Thread | None = None
        self._closed = False

    # -- loading ---------------------------------------------------------------------------

    def load(self, estimator: Any) -> bool:
        """Restores the saved state into ``estimator`` if there is one for this key and the
        estimator's configuration; True when it did. Anything else (no file, another key or
        configuration, a corrupt file) leaves the estimator as it is, with a warning that says
        why (an info line when there is simply no file yet)."""
        if os.path.lexists(self.path):
            path, restore = self.path, self._restore
        elif os.path.lexists(self.legacy_path):
            path, restore = self.legacy_path, self._restore_legacy
        else:
            self._cold_start_without_file()
            return False
        try:
            outcome = restore(estimator)
        except Exception as error:  # noqa: BLE001 - a saved state must never stop serving
            outcome = f"invalid state ({type(error).__name__}: {error})"
        if isinstance(outcome, str):
            logger.warning(
                "av_core: saved estimator state %s not loaded: %s; cold start", path, outcome
            )
            return False
        logger.info(
            "av_core: estimator state restored from %s (saved %s, %d refits)",
            path,
            _saved_at(outcome.saved_at),
            estimator.num_refits,
        )
        return True

    def _restore(self, estimator: Any) -> str | _Restored:
        """Loads the state's bytes into ``estimator``; why not, if it did not."""
        try:
            native = AcceptanceEstimator.load(self.path)
            saved_at = self.path.stat().st_mtime
        except (OSError, ValueError, TypeError) as error:
            return f"unreadable ({type(error).__name__}: {error})"
        try:
            saved_key = _read_document(self.key_path)
        except FileNotFoundError:
            return f"no key next to it ({self.key_path.name})"
        except (OSError, ValueError) as error:
            return f"its key is unreadable ({type(error).__name__}: {error})"
        problem = self._check_key(saved_key)
        if problem is not None:
            return problem
        state = native.state_dict()
        problem = self._check_config(state["config"], estimator)
        if problem is not None:
            return problem
        # The drop-in runs the schedule: its step count is the saved state's (see _write); its
        # native estimator counts no steps of its own.
        steps, state["steps_since_refit"] = state["steps_since_refit"], 0
        estimator.load_state_dict(
            {
                "format": _DROP_IN,
                "estimator": state,
                "steps_since_refit": steps,
                "refits": native.num_refits,
            }
        )
        return _Restored(saved_at)

    def _restore_legacy(self, estimator: Any) -> str | _Restored:
        """Loads a JSON file of an earlier release into ``estimator``; why not, if it did
        not."""
        try:
            document = _read_document(self.legacy_path)
        except (OSError, ValueError) as error:  # UnicodeDecodeError is a ValueError
            return f"unreadable ({type(error).__name__}: {error})"
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            return f"not an {FORMAT} file"
        if document.get("version") != FORMAT_VERSION:
            version = document.get("version")
            return f"format version {version!r}, this av_core reads {FORMAT_VERSION}"
        payload = document.get("payload")
        if not isinstance(payload, dict) or document.get("sha256") != _payload_digest(payload):
            return "checksum mismatch (the file is corrupt or was edited)"
        state = payload.get("state")
        if not isinstance(state, dict) or not isinstance(state.get("estimator"), dict):
            return "no estimator state"
        if not isinstance(state["estimator"].get("config"), dict):
            return "no estimator configuration"
        problem = self._check_key(payload.get("key"))
        if problem is not None:
            return problem
        # The configuration as this build reads it (a field added since at its default).
        saved = AcceptanceEstimator.from_state_dict(state["estimator"])
        problem = self._check_config(saved.state_dict()["config"], estimator)
        if problem is not None:
            return problem
        estimator.load_state_dict(state)
        return _Restored(payload.get("saved_at"))

    def _check_key(self, saved_key: Any) -> str | None:
        """Why a state saved under ``saved_key`` is not this key's, or None."""
        if not isinstance(saved_key, dict):
            return "no key"
        for name, value in asdict(self.key).items():
            if saved_key.get(name) != value:
                return f"it is for {name} = {saved_key.get(name)!r}, this server has {value!r}"
        return None

    @staticmethod
    def _check_config(saved_config: Any, estimator: Any) -> str | None:
        """Why a state of an estimator configured as ``saved_config`` is not ``estimator``'s,
        or None."""
        config = estimator.state_dict(flush=False)["estimator"]["config"]
        # The native estimator's refit_interval is the drop-in's own: it loads any saved one
        # (2**40 before its manual refits) as its manual schedule, the same estimator.
        saved_config = {**saved_config, "refit_interval": config.get("refit_interval")}
        for name in sorted(set(config) | set(saved_config)):
            if saved_config.get(name) != config.get(name):
                return (
                    f"its estimator has {name} = {saved_config.get(name)!r}, this one "
                    f"{config.get(name)!r}"
                )
        return None

    def _cold_start_without_file(self) -> None:
        """No file for this key: an info line, or a warning naming what differs when the
        directory holds a state for the same target model and rank under another key (another
        draft model, method or K: a changed deployment, whose state is not loaded)."""
        mine = asdict(self.key)
        closest: tuple[int, str, Path] | None = None
        try:
            rank = re.sub(r"[^A-Za-z0-9_.-]+", "_", self.key.rank)
            candidates = sorted(self.directory.glob(f"*-{rank}-*.json"))[:_MAX_NEIGHBOURS]
        except OSError:
            candidates = []
        for path in candidates:
            try:
                document = _read_document(path)
                # A key, or an earlier release's state with its key inside.
                key = document if path.name.endswith(".key.json") else document["payload"]["key"]
            except (OSError, ValueError, TypeError, KeyError):
                continue
            if not isinstance(key, dict) or key.get("rank") != mine["rank"]:
                continue
            if key.get("target_model") != mine["target_model"]:
                continue  # another deployment sharing the directory
            differing = [name for name in mine if key.get(name) != mine[name]]
            if differing and (closest is None or len(differing) < closest[0]):
                text = ", ".join(
                    f"{name} = {key.get(name)!r} (this server: {mine[name]!r})"
                    for name in differing
                )
                if path.name.endswith(".key.json"):  # named by its state's file
                    path = path.with_name(path.name.removesuffix(".key.json") + ".avcore")
                closest = (len(differing), text, path)
        if closest is None:
            logger.info("av_core: no saved estimator state at %s; cold start", self.path)
            return
        logger.warning(
            "av_core: no saved estimator state for this key at %s; %s is for %s: not loaded; "
            "cold start",
            self.path,
            closest[2],
            closest[1],
        )

    # -- saving ----------------------------------------------------------------------------

    def snapshot(self, estimator: Any) -> dict[str, Any]:
        """What to save: a host snapshot of ``estimator``'s ``state_dict`` (no device access, no
        wait for verdicts still in flight)."""
        return estimator.state_dict(flush=False)  # type: ignore[no-any-return]

    def save(self, estimator: Any) -> None:
        """Saves now, on this thread (atomic replace)."""
        self._write(self.snapshot(estimator))

    def _write(self, snapshot: dict[str, Any]) -> None:
        """Writes ``snapshot`` (a drop-in ``state_dict``) as the core's bytes and the key next
        to it when it is not there yet. The drop-in's counters are the state's: its native
        estimator refits by hand on the drop-in's schedule, once per drop-in refit, and counts
        no steps of its own."""
        self.directory.mkdir(parents=True, exist_ok=True)
        key = json.dumps(asdict(self.key), sort_keys=True).encode()
        try:
            current: bytes | None = self.key_path.read_bytes()
        except OSError:
            current = None
        if current != key:
            write_atomically(self.key_path, key)
        state = {
            **snapshot["estimator"],
            "steps_since_refit": snapshot["steps_since_refit"],
            "num_refits": snapshot["refits"],
        }
        AcceptanceEstimator.from_state_dict(state).save(self.path)

    def attach(self, estimator: Any) -> bool:
        """:meth:`load`, then :meth:`save_from_now_on`. Returns what :meth:`load` returned."""
        restored = self.load(estimator)
        self.save_from_now_on(estimator)
        return restored

    def save_from_now_on(self, estimator: Any) -> None:
        """Saves ``estimator`` every ``save_every`` refits (in the background) and at
        interpreter exit."""
        self._refits_since_save = 0
        estimator.on_refit(self._refitted)
        atexit.register(self._save_at_exit, weakref.ref(estimator))

    def _refitted(self, estimator: Any) -> None:
        if self._closed:
            return
        self._refits_since_save += 1
        if self._refits_since_save < self.save_every:
            return
        self._refits_since_save = 0
        document = self.snapshot(estimator)
        with self._wake:
            self._pending = document  # the newest wins
            if self._writer is None:
                self._writer = threading.Thread(
                    target=self._write_loop, name="av_core-state", daemon=True
                )
                self._writer.start()
            self._wake.notify()

    def _write_loop(self) -> None:
        while True:
            with self._wake:
                while self._pending is None and not self._closed:
                    self._wake.wait()
                if self._pending is None:
                    return
                document, self._pending = self._pending, None
            try:
                self._write(document)
            except Exception as error:  # noqa: BLE001 - the writer must outlive a failed save
                logger.warning("av_core: could not save state to %s: %s", self.path, error)

    def close(self) -> None:
        """Writes any save still pending and stops the writer thread; later refits save
        nothing (the exit save still runs)."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        if self._writer is not None:
            self._writer.join(timeout=30)

    def _save_at_exit(self, reference: Any) -> None:
        self.close()
        estimator = reference()
        if estimator is None:
            return
        try:
            estimator.flush()
            self.save(estimator)
            logger.info("av_core: estimator state saved to %s", self.path)
        except Exception as error:  # noqa: BLE001 - exiting: report, never raise
            logger.warning("av_core: could not save estimator state to %s: %s", self.path, error)
