"""Every layout of the logits gives the *bits* of its C-contiguous copy (issue #17, item 1).

The CPU float32/bfloat16 path sends C-contiguous logits to the fused Rust kernel; a transposed,
strided or sliced tensor used to take the torch path instead, which sums in another order and
gave features up to a few ulps (2.6e-6) away from the contiguous copy's. Now both go to the
kernel (the other layouts through contiguous blocks of rows), and the offline entropy sums in one
order for every layout. A property over shapes, dtypes, temperatures and layouts, compared for
exact equality (NaN equal to NaN); the feature itself is checked against a float64 reference so
that an exactly-equal-but-wrong answer cannot pass.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from av_core import features  # noqa: E402
from av_core.features import (  # noqa: E402
    draft_log_odds,
    entropy,
    q_max,
    top2_margin,
)


def layouts(values: torch.Tensor) -> dict[str, torch.Tensor]:
    """Tensors holding ``values`` ([N, V]) laid out differently in memory."""
    n, v = values.shape
    wide = torch.zeros(n, 3 * v + 1, dtype=values.dtype)
    wide[:, 1 : 3 * v + 1 : 3] = values
    tall = torch.zeros(2 * n, v, dtype=values.dtype)
    tall[::2] = values
    out = {
        "transposed": values.t().contiguous().t(),
        "column-strided": wide[:, 1 : 3 * v + 1 : 3],
        "row-strided": tall[::2],
        "negated transposed": (-values.t().contiguous())._neg_view().t(),
        "flipped twice": values.flip(0).flip(1).flip(0).flip(1),
    }
    for name, tensor in out.items():
        assert torch.equal(tensor.resolve_neg(), values), name
    return out


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.equal(torch.nan_to_num(a, nan=123.0), torch.nan_to_num(b, nan=123.0)))


def reference(z: torch.Tensor, temperature: np.ndarray) -> np.ndarray:
    """float64 logit(q_max): -log(sum over all but one maximum of exp((z - m) / T)), clamped."""
    rows = z.double().numpy()
    out = np.empty(rows.shape[0])
    for r, row in enumerate(rows):
        e = np.sort(np.exp((row - row.max()) / temperature[r]))
        complement = e[:-1].sum()
        out[r] = np.clip(-np.log(complement) if complement > 0 else np.inf, -40.0, 40.0)
    return out


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 6),
    v=st.sampled_from([1, 2, 7, 64, 300]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    seed=st.integers(0, 2**16),
    scale=st.sampled_from([0.5, 3.0, 12.0]),
)
def test_every_layout_gives_the_bits_of_the_contiguous_copy(
    n: int, v: int, dtype: torch.dtype, seed: int, scale: float
) -> None:
    generator = torch.Generator().manual_seed(seed)
    z = (torch.randn(n, v, generator=generator) * scale).to(dtype)
    temperature = torch.rand(n, generator=generator, dtype=torch.float64) + 0.5
    valid = torch.arange(n) % 2 == 0
    calls = {
        "draft_log_odds": lambda x: draft_log_odds(x, temperature),
        "row_valid": lambda x: draft_log_odds(x, temperature, row_valid=valid),
        "scalar temperature": lambda x: draft_log_odds(x, 0.7),
        "top_k": lambda x: draft_log_odds(x, temperature, top_k=2),
        "top_p": lambda x: draft_log_odds(x, temperature, top_p=0.8),
        "q_max": lambda x: q_max(x, temperature),
        "entropy": lambda x: entropy(x, temperature),
        "top2_margin": lambda x: top2_margin(x, temperature),
    }
    want = {name: call(z) for name, call in calls.items()}
    np.testing.assert_allclose(
        want["draft_log_odds"].double().numpy(),
        reference(z, temperature.numpy()),
        rtol=1e-4,
        atol=2e-4,
    )
    for layout, tensor in layouts(z).items():
        for name, call in calls.items():
            got = call(tensor)
            assert same_bits(got, want[name]), (name, layout, (got - want[name]).abs().max())


def test_strided_logits_are_copied_a_block_of_rows_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """More rows than one copy block: the blocks' rows give the whole tensor's bits."""
    monkeypatch.setattr(features.native, "_COPY_BLOCK_BYTES", 3 * 40 * 4)  # 3 rows of 40
    generator = torch.Generator().manual_seed(1)
    z = torch.randn(10, 40, generator=generator) * 5
    temperature = torch.rand(10, generator=generator) + 0.5
    valid = torch.tensor([True, False] * 5)
    for tensor in layouts(z).values():
        assert same_bits(draft_log_odds(tensor, temperature), draft_log_odds(z, temperature))
        got = draft_log_odds(tensor, temperature, row_valid=valid)
        assert same_bits(got, draft_log_odds(z, temperature, row_valid=valid))
        assert bool((got[~valid] == 0).all())
