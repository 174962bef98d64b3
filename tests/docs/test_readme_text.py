"""The README's own words against what they describe: the number of questions it announces,
the refit interval it quotes against the estimator's and the replay's defaults, and the size of
the test install it asks a new user to run."""

from __future__ import annotations

import re
from pathlib import Path

from av_core._native import ESTIMATOR_DEFAULTS
from av_core.tools.evaluate import DEFAULT_REFIT_INTERVAL

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
WORDS = {"two": 2, "three": 3, "four": 4, "five": 5}


def test_the_questions_announced_are_the_questions_listed() -> None:
    match = re.search(r"answers (\w+) questions[^\n]*:\n\n((?:\d+\. .*\n(?: {3}.*\n)*)+)", README)
    assert match is not None
    listed = re.findall(r"^\d+\. ", match.group(2), flags=re.MULTILINE)
    assert WORDS[match.group(1)] == len(listed) == 3


def test_the_refit_intervals_quoted_are_the_defaults() -> None:
    text = " ".join(README.split())
    serving = re.findall(r"rounds of (\d+) (?:decode )?steps", text)
    assert serving and {int(n) for n in serving} == {ESTIMATOR_DEFAULTS["refit_interval"]}
    replay = re.findall(r"rounds are (\d+) observes", text)
    assert replay and {int(n) for n in replay} == {DEFAULT_REFIT_INTERVAL}
    assert not re.search(r"(?:recalibrated|refit) every \d+", text)


def test_the_test_install_says_what_it_downloads() -> None:
    quick_start = README[README.index("## Quick start") : README.index("## Use")]
    text = " ".join(quick_start.split())
    assert 'pip install ".[test]"' in text
    assert "6 GB" in text and "11 minutes" in text
    assert "--index-url https://download.pytorch.org/whl/cpu" in text
