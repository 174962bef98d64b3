"""A ``state_dict`` is read whole or refused: a key that no field of the format holds — at the
top level, in the configuration, the round's statistics, the memory or the reference — and the
other update's statistics (vLLM's ``n``, ``c`` in a map state, map's ``count`` in a vLLM one)
are refused by ``from_state_dict`` and ``add_round_stats``, naming the key's path, and nothing
changes. A hand-edited or corrupted state must not load as if the edit were not there."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest

from av_core import AcceptanceEstimator

#: The three shapes a state_dict has: format 1 (vLLM's update at the default map settings),
#: format 2 with vLLM's update (other map settings) and format 2 with the map update.
CONFIGS: dict[str, dict[str, Any]] = {
    "vllm_v1": {"update": "vllm", "memory": 0.8},
    "vllm_v2": {"update": "vllm", "bins": 16},
    "map": {"update": "map", "bins": 16},
}


def observed(name: str) -> AcceptanceEstimator:
    """An estimator of shape ``name`` with a refit behind it and an open round."""
    rng = np.random.default_rng(3)
    est = AcceptanceEstimator(3, refit_interval=4, **CONFIGS[name])
    for _ in range(6):
        x = rng.normal(1.0, 2.0, size=(8, 3)).astype(np.float32)
        admitted = rng.integers(0, 4, size=8)
        accepted = np.array([rng.integers(0, a + 1) for a in admitted])
        est.observe(x, admitted, accepted)
    assert est.num_refits > 0 and est.steps_since_refit > 0
    return est


def edited(state: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """A deep copy of ``state`` with ``value`` at ``path`` (added when absent)."""
    out = copy.deepcopy(state)
    target = out
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return out


def path_text(path: tuple[str, ...]) -> str:
    return "".join(f'\\["{key}"\\]' for key in path)


# (shape, path of the added key, value): keys no field of that shape holds.
UNKNOWN = [
    (name, path, value)
    for name in CONFIGS
    for path, value in [
        (("extra",), 1),
        (("config", "l3"), 1.0),
        (("round_stats", "extra"), [0, 0, 0]),
        (("memory_state", "extra"), 0.0),
    ]
] + [
    ("map", ("reference", "extra"), 0.5),
    # The other update's statistics.
    ("map", ("round_stats", "n"), [0, 0, 0]),
    ("map", ("round_stats", "c"), [0, 0, 0]),
    ("map", ("memory_state", "a"), 0.0),
    ("vllm_v1", ("round_stats", "count"), [0] * 48),
    ("vllm_v2", ("round_stats", "bins"), 16),
    ("vllm_v2", ("memory_state", "x_sum"), [0.0] * 48),
    ("vllm_v1", ("reference",), {"slope": 0.5, "intercepts": [-0.2] * 3}),
    ("vllm_v2", ("fitted_labels",), 0),
    # A key format 1 does not hold.
    ("vllm_v1", ("config", "bins"), 64),
]


@pytest.mark.parametrize(("name", "path", "value"), UNKNOWN)
def test_from_state_dict_refuses_a_key_no_field_holds_naming_its_path(
    name: str, path: tuple[str, ...], value: Any
) -> None:
    est = observed(name)
    state = est.state_dict()
    assert AcceptanceEstimator.from_state_dict(state).state_dict() == state  # valid as saved
    with pytest.raises(ValueError, match=rf"^state: {path_text(path)} .*not a field"):
        AcceptanceEstimator.from_state_dict(edited(state, path, value))
    for update in ("vllm", "map"):  # moving the state to an update reads it whole first
        with pytest.raises(ValueError, match=path_text(path)):
            AcceptanceEstimator.from_state_dict(edited(state, path, value), update=update)


@pytest.mark.parametrize(
    ("name", "key", "value"),
    [
        ("vllm_v1", "extra", [0, 0, 0]),
        ("vllm_v1", "count", [0] * 48),
        ("vllm_v1", "bins", 16),
        ("map", "extra", 0),
        ("map", "n", [0, 0, 0]),
        ("map", "g1", [0, 0, 0]),
    ],
)
def test_add_round_stats_refuses_a_key_no_field_holds_and_adds_nothing(
    name: str, key: str, value: Any
) -> None:
    est = observed(name)
    before = est.state_dict()
    round_stats = {**observed(name).state_dict()["round_stats"], key: value}
    with pytest.raises(ValueError, match=rf'^round_stats: \["{key}"\] .*not a field'):
        est.add_round_stats(round_stats)
    assert est.state_dict() == before
    del round_stats[key]
    est.add_round_stats(round_stats)  # the same round without the key is taken
    assert est.state_dict() != before
