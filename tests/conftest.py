import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

# Make the independent references in tests/ importable as `reference`, and the engine
# reproductions in tests/sglang/ as `sglang_main_reproduction`.
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent / "sglang"))


def ticks_during(call: Callable[[], object], calls: int, stop_early: bool = False) -> int:
    """How often a spinning thread ran while `call` ran `calls` times (fewer with `stop_early`,
    once the spinner ran: on a loaded machine a few released calls may pass before it is
    scheduled). With a switch interval longer than the test, the main thread never hands the GIL
    over on its own, so the spinner runs only while a call has released it."""
    ticks = [0]
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0)  # gives the GIL back at once

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    worker = threading.Thread(target=spin)
    try:
        worker.start()
        before = ticks[0]
        for _ in range(calls):
            call()
            if stop_early and ticks[0] > before:
                break
        return ticks[0] - before
    finally:
        stop.set()
        sys.setswitchinterval(interval)
        worker.join()


@pytest.fixture
def gil_ticks() -> Callable[[Callable[[], object], int, bool], int]:
    """[`ticks_during`]: how often another thread ran while a call repeated (the GIL tests)."""
    return ticks_during
