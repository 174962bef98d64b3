"""``predict`` where its wide variants are most likely to differ from the definition.

The AVX2 and AVX-512 variants evaluate the logistic with fused multiply-adds and keep the
baseline's float32 bits by a rounding check per lane (``rounds_alike`` in
``av_core/src/estimator/logistic.rs``): a block with a lane whose ``σ`` lies near a float32
rounding midpoint, in float32's subnormal range, or that is NaN is evaluated by the definition.
These tests feed exactly those lanes, at every place of a 64-lane block, an 8-lane group and the
scalar tail, and require every ``AV_CORE_SIMD`` level to give the baseline's bits; the baseline
itself is checked against an independent float64 logistic (within one float32 ulp, and equal
away from midpoints).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
from level_digests import level_digests

from av_core import AcceptanceEstimator

# z whose fused σ and the definition's σ round to different float32 values (the logistic's
# unit test walks z across the logits of float32 midpoints to find them): a variant without
# the rounding check gives another float32 at each.
HARD_Z = [
    0.11832756220898018,
    -0.34669952551797306,
    -0.15525990761260902,
    -0.35844692881868495,
    -0.1843073705482173,
    -1.154546072320278,
    0.9422662199123207,
    2.906344693141776,
    -1.1726572402595767,
    -0.3403125335791621,
    0.20847553394376667,
    1.7291208867280115,
]

SPECIAL_Z = [
    np.inf,
    -np.inf,
    np.nan,
    0.0,
    -0.0,
    5e-324,
    1e300,
    -1e300,
    100.0,
    -100.0,
    -87.3,
    -95.0,
    -103.9,
    17.3,
    36.7,
]


def midpoint_logits(rng: np.random.Generator, n: int) -> np.ndarray:
    """z whose σ lies at (or a few float64 ulps of z beside) a float32 rounding midpoint in
    [2^-125, 1): the logit of the midpoint, computed in float64, moved by -4..4 ulps."""
    exponent = rng.integers(-125, 0, n)
    mantissa = rng.integers(1 << 23, 1 << 24, n).astype(np.float64)
    ulp = np.ldexp(1.0, exponent - 24)
    midpoint = mantissa * ulp + ulp / 2  # exact in float64
    z = np.log(midpoint) - np.log1p(-midpoint)
    z = z + rng.integers(-4, 5, n) * np.spacing(z)
    return z[np.abs(z) <= 100.0]


def batches() -> list[np.ndarray]:
    """Feature matrices (z itself: slope 1, intercept 0, clamp 100) that put every hard and
    special z at every place of a block of 64 + a group of 8 + a tail of 5, plus shuffled pools
    of midpoint logits and of the subnormal band in shapes whose sizes are no multiple of 8."""
    rng = np.random.default_rng(20261202)
    out = []
    for z in HARD_Z + SPECIAL_Z:
        for place in range(77):
            x = np.full((77, 1), 0.25)
            x[place, 0] = z
            out.append(x)
    pool = np.concatenate([midpoint_logits(rng, 60_000), rng.uniform(-100, -80, 5_000)])
    rng.shuffle(pool)
    for k in (1, 3, 8, 13, 64):
        rows = len(pool) // k - 3
        out.append(pool[: rows * k].reshape(rows, k))
    return out


_LEVEL_WORKLOAD = """
import hashlib, sys
import numpy as np
from test_predict_rounding_levels import batches
from av_core import AcceptanceEstimator
digest = hashlib.sha256()
for x in batches():
    est = AcceptanceEstimator(x.shape[1], init_slope=1.0, init_intercept=0.0, max_log_odds=100.0)
    for features in (x, x.astype(np.float32), np.asfortranarray(x), x.astype(">f8")):
        try:
            digest.update(est.predict(features).tobytes())
        except ValueError as error:
            digest.update(str(error).encode())
print(digest.hexdigest())
"""


def test_every_level_gives_the_baselines_bits_near_midpoints() -> None:
    """Every SIMD level's probabilities equal the baseline's bit for bit on lanes next to
    float32 rounding midpoints, in the subnormal band and past the clamp (and the same refusal
    of non-finite features), at every place."""
    digests = level_digests(_LEVEL_WORKLOAD, Path(__file__).parent)
    assert len(set(digests.values())) == 1, digests
    assert len(digests["baseline"]) == len(hashlib.sha256().hexdigest())


def test_hard_lanes_match_the_float64_logistic_at_every_place() -> None:
    """This process's level (the widest the CPU has): each hard z at every place of a block,
    a group and the tail gives the same float32 as at place 0 of a one-element batch (the
    scalar path), within one ulp of the float64 logistic; the other lanes are σ(0.25)."""
    est = AcceptanceEstimator(1, init_slope=1.0, init_intercept=0.0, max_log_odds=100.0)
    background = est.predict(np.array([[0.25]]))[0, 0]
    assert background == np.float32(1 / (1 + np.exp(-0.25)))
    for z in HARD_Z:
        alone = est.predict(np.array([[z]]))[0, 0]
        exact = 1.0 / (1.0 + np.exp(-z))
        assert abs(float(alone) - exact) <= float(np.spacing(np.float32(exact))), z
        for n in (77, 72, 64, 13, 8, 5):
            for place in range(n):
                x = np.full((n, 1), 0.25)
                x[place, 0] = z
                p = est.predict(x)[:, 0]
                assert p[place].tobytes() == alone.tobytes(), (z, n, place)
                others = np.delete(p, place)
                assert (others == background).all(), (z, n, place)


def test_baseline_is_the_float64_logistic_rounded_once() -> None:
    """The definition against an independent float64 logistic: within one float32 ulp
    everywhere, clamped past ±100, and equal wherever the float64
    value is not within 2^-40 (relative) of a float32 rounding midpoint."""
    rng = np.random.default_rng(7)
    z = np.concatenate([midpoint_logits(rng, 20_000), rng.uniform(-100, 100, 20_000)])
    est = AcceptanceEstimator(1, init_slope=1.0, init_intercept=0.0, max_log_odds=100.0)
    got = est.predict(z[:, None])[:, 0]
    exact = 1.0 / (1.0 + np.exp(-z))
    rounded = exact.astype(np.float32)
    assert (np.abs(got.astype(np.float64) - exact) <= np.spacing(rounded).astype(np.float64)).all()
    # Distance from the nearest float32 midpoint, relative to the value.
    lower = rounded.astype(np.float64)
    neighbour = np.where(
        lower <= exact, np.nextafter(rounded, np.float32(2)), np.nextafter(rounded, np.float32(-1))
    ).astype(np.float64)
    midpoint = (lower + neighbour) / 2
    far = np.abs(exact - midpoint) > exact * 2.0**-40
    assert far.sum() > len(z) // 3
    np.testing.assert_array_equal(got[far], rounded[far])
    # Past the clamp (100): σ(±100), float32 1 and a float32 subnormal.
    clamped = est.predict(np.array([[1e300], [-1e300], [-100.0], [5e-324]]))[:, 0]
    assert clamped[0] == 1.0 and clamped[1] == np.float32(1 / (1 + np.exp(100.0))) == clamped[2]
    assert clamped[3] == np.float32(0.5)
    # Non-finite features are refused, naming the argument, at every place of a block.
    for bad in (np.nan, np.inf, -np.inf):
        for place in (0, 63, 64, 71, 76):
            x = np.full((77, 1), 0.25)
            x[place, 0] = bad
            with pytest.raises(ValueError, match="features"):
                est.predict(x)
