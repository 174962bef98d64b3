"""The drafter-side feature: log-odds of the drafter's most likely token, from raw logits.

For one row of drafter logits ``z`` and temperature ``T`` the drafter samples from
``q = softmax(z / T)`` (``T <= 0`` is greedy and leaves the logits unscaled, as vLLM does). The
feature is ``x = logit(q_max) = log q_max - log(1 - q_max)``, computed as

    x = -log( sum over every entry but one occurrence of the maximum m of exp((z - m) / T) )

so the mass ``1 - q_max`` is summed directly instead of being recovered as ``total - 1``, which in
float32 loses everything below ``2**-24`` and sends a confident row to the clamp. Ties at the
maximum keep the second occurrence in the sum, so two equal maxima give ``x = log(q / (1 - q))`` of
one of them. A row with a single finite entry gives ``+max_log_odds``; every value is clamped to
``[-max_log_odds, max_log_odds]``.

The feature reads the drafter's distribution, never the token drawn from it: a verification
decision that depended on the drawn token would bias the emitted distribution (DESIGN.md §4). The
``sampled_*`` functions below do read it, and exist for offline evaluation only.

torch is an optional dependency (``pip install "av_core[torch]"``); ``import av_core`` does not
import this module.
"""

from __future__ import annotations

import functools
import math
import numbers
import warnings
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from av_core import _native

try:
    import torch
except ImportError as error:  # pragma: no cover - exercised in a subprocess without torch
    raise ImportError(
        'av_core.features needs PyTorch, an optional dependency: pip install "av_core[torch]"'
    ) from error

try:
    import triton  # type: ignore[import-untyped]
    import triton.language as tl  # type: ignore[import-untyped]
except ImportError:  # pragma: no cover - triton ships with torch's CUDA wheels
    triton = None

__all__ = [
    "MAX_FEATURE_ENTRIES",
    "MAX_LOG_ODDS",
    "FeatureExtractor",
    "PartialStats",
    "as_numpy",
    "combine_partials",
    "draft_log_odds",
    "entropy",
    "partial_stats",
    "q_max",
    "sampled_gumbel",
    "sampled_log_odds",
    "to_host",
    "top2_margin",
]

# vLLM's clamp (`_MAX_LOG_ODDS` in acceptance_estimator.py): |x| beyond 40 means q_max within
# e**-40 of 0 or 1, which no drafter resolves and no acceptance rate distinguishes.
MAX_LOG_ODDS = 40.0

_LOG2E = 1.0 / math.log(2.0)
_LN2 = math.log(2.0)
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_FLOAT32_TINY = float(np.finfo(np.float32).tiny)
# exp2 below -126 leaves float32's normal range, where the CPU kernel takes a slow path; an entry
# that far below the row maximum adds at most 2**-126 per entry, far under the clamp at e**-40.
_EXP2_FLOOR = -126.0
_LOGIT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Row blocks are sized so that the float32 working copy of a block stays in the last-level cache
# on a CPU, and bounded on an accelerator: the only [rows, V] temporary is one block.
_CPU_BLOCK_BYTES = 4 << 20
_DEVICE_BLOCK_BYTES = 256 << 20
_TRUNCATED_BLOCK_BYTES = 32 << 20
#: The most feature slots a :class:`FeatureExtractor` holds, ``(max_num_reqs + 1) x
#: num_speculative_steps`` (256 MiB of float32): the bound the core's planner puts on its own
#: per-slot state, so that a size typed by mistake is refused before anything is allocated.
MAX_FEATURE_ENTRIES = 1 << 26
# CPU float32 and bfloat16 C-contiguous logits go to the fused Rust kernel
# (`_native.draft_log_odds_f32` / `_bf16`): one pass over memory instead of the torch path's
# several. Tests switch it off to compare the two.
_NATIVE_CPU = True


class PartialStats(NamedTuple):
    """Per-row statistics of one vocabulary shard, enough to rebuild the unsharded feature.

    ``max`` is the shard's largest scaled logit ``max(z / T)`` (``-inf`` for a shard with no finite
    entry or a padded row), ``argmax`` the shard-local column of the occurrence left out of
    ``complement``, and ``complement = sum over the shard except that occurrence of
    exp(z / T - max)``. Three numbers per row instead of ``V / shards`` logits.
    """

    max: torch.Tensor
    argmax: torch.Tensor
    complement: torch.Tensor


class _RowStats(NamedTuple):
    max: torch.Tensor  # raw (unscaled) row maximum, float32
    argmax: torch.Tensor  # column left out of complement, int64
    complement: torch.Tensor  # sum of exp2((z - max) * scale) over the other columns, float32
    excluded: torch.Tensor  # (z[argmax] - max) * scale, float32 (0 when argmax is the maximum)


# --------------------------------------------------------------------------------------------
# Argument checks


# torch's unsigned types wider than 8 bits have "limited support": min/max and comparisons are
# missing on CPU, so an argument of those dtypes is refused up front rather than failing inside.
_LIMITED_INTEGER_DTYPES = tuple(
    getattr(torch, name) for name in ("uint16", "uint32", "uint64") if hasattr(torch, name)
)


def _dense(value: torch.Tensor, name: str) -> torch.Tensor:
    """``value`` with torch's lazy negation and conjugation applied, and a strided layout.

    A tensor with the negative bit set (``x._neg_view()``, the imaginary part of a conjugated
    tensor) stores ``-x`` and negates on read; a dtype-converting ``copy_`` and a kernel that
    reads memory (numpy, Triton, the Rust kernel) would see ``-x``. Resolving costs a copy only
    when a bit is set.
    """
    if value.layout != torch.strided:
        raise TypeError(f"{name} must be a dense (strided) tensor, got layout {value.layout}")
    if value.is_neg() or value.is_conj():
        value = value.resolve_conj().resolve_neg()
    return value


def _check_logits(logits: object, name: str = "logits") -> torch.Tensor:
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(logits).__name__}")
    if logits.dtype not in _LOGIT_DTYPES:
        raise TypeError(f"{name} must be float32, bfloat16 or float16, got dtype {logits.dtype}")
    if logits.dim() != 2:
        raise ValueError(f"{name} must have shape [N, V], got shape {tuple(logits.shape)}")
    if logits.shape[1] == 0:
        raise ValueError(f"{name} must have at least one vocabulary column, got shape [N, 0]")
    return _dense(logits.detach(), name)


def _check_device(device: object) -> torch.device:
    if not isinstance(device, str | torch.device):
        raise TypeError(f"device must be a str or a torch.device, got {type(device).__name__}")
    try:
        return torch.device(device)
    except (RuntimeError, ValueError) as error:
        raise ValueError(f"device must name a torch device, got {device!r} ({error})") from None


def _check_integer_tensor(value: object, name: str) -> torch.Tensor:
    """An integer tensor argument (int8..int64 or uint8), dense, negation resolved."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be an integer torch.Tensor, got {type(value).__name__}")
    if value.dtype.is_floating_point or value.dtype == torch.bool or value.is_complex():
        raise TypeError(f"{name} must be an integer tensor, got dtype {value.dtype}")
    if value.dtype in _LIMITED_INTEGER_DTYPES:
        raise TypeError(
            f"{name} must be int8, int16, int32, int64 or uint8, got dtype {value.dtype} "
            "(which torch supports only in part)"
        )
    return _dense(value.detach(), name)


#: The clamp of every feature is float32, so ``max_log_odds`` must be a positive normal float32:
#: the same bound on every dtype and path (the Rust kernel takes it as float32 too).
_MAX_LOG_ODDS_RANGE = (_FLOAT32_TINY, _FLOAT32_MAX)


def _check_max_log_odds(max_log_odds: float) -> float:
    if isinstance(max_log_odds, bool) or not isinstance(max_log_odds, numbers.Real):
        raise TypeError(f"max_log_odds must be a number, got {type(max_log_odds).__name__}")
    try:
        value = float(max_log_odds)
    except OverflowError:
        value = math.inf
    low, high = _MAX_LOG_ODDS_RANGE
    if not (math.isfinite(value) and value > 0.0):
        raise ValueError(f"max_log_odds must be finite and positive, got {max_log_odds!r}")
    if not low <= value <= high:
        raise ValueError(
            f"max_log_odds must lie in float32's normal range [{low:.4g}, {high:.4g}] (the "
            f"features are float32), got {max_log_odds!r}"
        )
    return value


def _per_row(value: object, n: int, name: str, device: torch.device) -> torch.Tensor:
    """A per-row tensor argument as a 1-D tensor of length n on device (a 0-d one is broadcast)."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a number or a torch.Tensor, got {type(value).__name__}")
    if value.dtype == torch.bool or value.is_complex():
        raise TypeError(f"{name} must be a real-valued tensor, got dtype {value.dtype}")
    if value.dtype in _LIMITED_INTEGER_DTYPES:
        raise TypeError(
            f"{name} must not have dtype {value.dtype} (torch supports it only in part)"
        )
    value = _dense(value.detach(), name)
    if value.dim() == 0:
        return value.to(device).expand(n)
    if value.dim() != 1 or value.shape[0] != n:
        raise ValueError(
            f"{name} must be a scalar or have shape [{n}] (one per row), got shape "
            f"{tuple(value.shape)}"
        )
    return value.to(device)


def _first_bad_row(bad: torch.Tensor, valid: torch.Tensor | None) -> int | None:
    """The first row flagged in ``bad`` among the valid ones (host tensors only), else None."""
    if valid is not None:
        bad = bad & valid
    rows = torch.nonzero(bad)
    return int(rows[0, 0]) if rows.numel() else None


def _real(value: numbers.Real, name: str) -> float:
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"{name} must be finite, got {value!r}") from None


def _check_temperature(
    temperature: float | torch.Tensor | None, n: int, device: torch.device
) -> float | torch.Tensor:
    """A validated temperature: a float with greedy (<= 0) and None read as 1, or a per-row
    tensor on device, left as given (greedy rows are resolved where it is used; a NaN or
    ``+inf`` row gives a NaN feature, see :func:`draft_log_odds`)."""
    if temperature is None:
        return 1.0
    if isinstance(temperature, bool):
        raise TypeError("temperature must be a number or a torch.Tensor, got bool")
    if isinstance(temperature, numbers.Real):
        value = _real(temperature, "temperature")
        if not math.isfinite(value):
            raise ValueError(f"temperature must be finite, got {temperature!r}")
        return value if value > 0.0 else 1.0
    return _per_row(temperature, n, "temperature", device)


def _temperature_rows(
    temperature: float | torch.Tensor, n: int, device: torch.device
) -> torch.Tensor:
    """Per-row float64 temperature: greedy rows (T <= 0) at 1, NaN and +inf as NaN."""
    if isinstance(temperature, float):
        return torch.full((n,), temperature, dtype=torch.float64, device=device)
    t = temperature.to(torch.float64)
    t = torch.where(t <= 0.0, torch.ones_like(t), t)
    return torch.where(t == math.inf, torch.full_like(t, math.nan), t)


def _exp2_scale(temperature: torch.Tensor) -> torch.Tensor:
    """log2(e) / T as float32, so that exp((z - m) / T) = exp2((z - m) * scale).

    Clamped to float32's largest finite value: a temperature under ~4e-39 then behaves like that
    one instead of producing 0 * inf = NaN at the maximum.
    """
    return (_LOG2E / temperature).clamp(max=_FLOAT32_MAX).to(torch.float32)


def _check_row_valid(row_valid: object, n: int, device: torch.device) -> torch.Tensor | None:
    if row_valid is None:
        return None
    if not isinstance(row_valid, torch.Tensor):
        raise TypeError(
            f"row_valid must be a bool torch.Tensor or None, got {type(row_valid).__name__}"
        )
    if row_valid.dtype != torch.bool:
        raise TypeError(f"row_valid must have dtype torch.bool, got {row_valid.dtype}")
    if row_valid.shape != (n,):
        raise ValueError(f"row_valid must have shape [{n}], got shape {tuple(row_valid.shape)}")
    # Contiguous: the Triton kernels and the Rust kernel index it as a flat array.
    return _dense(row_valid.detach(), "row_valid").to(device).contiguous()


def _check_tokens(tokens: object, n: int, vocab: int, device: torch.device) -> torch.Tensor:
    tokens = _check_integer_tensor(tokens, "tokens")
    if tokens.shape != (n,):
        raise ValueError(f"tokens must have shape [{n}], got shape {tuple(tokens.shape)}")
    tokens = _snapshot(tokens)
    if n:
        low, high = int(tokens.min()), int(tokens.max())
        if low < 0 or high >= vocab:
            bad = low if low < 0 else high
            raise ValueError(f"tokens must lie in [0, {vocab}), got {bad}")
    return tokens.to(device=device, dtype=torch.int64)


def _snapshot(value: torch.Tensor) -> torch.Tensor:
    """A private copy of a host tensor that is checked and then used: what was validated must be
    what is used, even if another thread writes the caller's tensor in between (a device tensor
    is not read on the host, so it is used as given)."""
    return value.clone() if value.device.type == "cpu" else value


# --------------------------------------------------------------------------------------------
# Row statistics: max, the left-out column, and the sum over every other column


def _segmentation(vocab: int) -> tuple[int, int]:
    """(segment length, number of full segments): the divisor of vocab nearest 2048 in
    [1024, 4096], else 2048 with a shorter tail segment.

    Per-segment maxima locate the row maximum to one segment at no extra cost over a plain
    row maximum; finding its column with torch.argmax over the row costs several times more.
    """
    if vocab <= 4096:
        return vocab, 1
    divisors = [d for d in range(1024, 4097) if vocab % d == 0]
    length = min(divisors, key=lambda d: abs(d - 2048)) if divisors else 2048
    return length, vocab // length


def _block_rows(vocab: int, budget: int) -> int:
    return max(1, budget // (4 * vocab))


def _stats_torch(
    logits: torch.Tensor,
    scale: torch.Tensor,
    rows: torch.Tensor | None,
    exclude: torch.Tensor | None,
) -> _RowStats:
    """Row statistics with plain torch operations, one cache-sized block of rows at a time.

    Per block: per-segment maxima (the only pass over the logits in memory), then
    ``exp2((z - m) * scale)`` on a float32 working copy and per-segment sums. Afterwards one
    segment per row is re-read to leave out exactly one column: the first occurrence of the
    maximum, or ``exclude``. The other segments' sums are exact sums of positive terms, so the
    complement keeps full relative precision however small it is.
    """
    device = logits.device
    vocab = logits.shape[1]
    n = logits.shape[0] if rows is None else rows.numel()
    seg_len, n_full = _segmentation(vocab)
    split = seg_len * n_full
    n_seg = n_full + (1 if split < vocab else 0)
    seg_max = torch.empty(n, n_seg, dtype=torch.float32, device=device)
    seg_sum = torch.empty(n, n_seg, dtype=torch.float32, device=device)
    budget = _CPU_BLOCK_BYTES if device.type == "cpu" else _DEVICE_BLOCK_BYTES
    block = min(_block_rows(vocab, budget), max(n, 1))
    work_buffer = torch.empty(block, vocab, dtype=torch.float32, device=device)
    for start in range(0, n, block):
        stop = min(start + block, n)
        b = stop - start
        work = work_buffer[:b]
        if rows is None:
            src = logits[start:stop]
        elif logits.dtype == torch.float32:
            src = torch.index_select(logits, 0, rows[start:stop], out=work)
        else:
            src = logits.index_select(0, rows[start:stop])
        if src.dtype != torch.float32 or src.stride(-1) != 1:
            work.copy_(src)
            src = work
        seg_max[start:stop, :n_full] = src[:, :split].view(b, n_full, seg_len).amax(dim=2)
        if n_seg > n_full:
            seg_max[start:stop, n_full] = src[:, split:].amax(dim=1)
        row_max = seg_max[start:stop].amax(dim=1, keepdim=True)
        torch.sub(src, row_max, out=work)
        work.mul_(scale[start:stop, None]).clamp_(min=_EXP2_FLOOR).exp2_()
        seg_sum[start:stop, :n_full] = work[:, :split].view(b, n_full, seg_len).sum(dim=2)
        if n_seg > n_full:
            seg_sum[start:stop, n_full] = work[:, split:].sum(dim=1)
    del work_buffer

    row_max = seg_max.amax(dim=1)
    if exclude is None:
        seg_star = seg_max.argmax(dim=1)
    else:
        seg_star = torch.div(exclude, seg_len, rounding_mode="floor")
    values = _segment_values(logits, rows, seg_star, seg_len, n_full).to(torch.float32)
    exponent = (values - row_max[:, None]).mul_(scale[:, None])
    local = exponent.argmax(dim=1) if exclude is None else exclude - seg_star * seg_len
    excluded = exponent.gather(1, local[:, None]).squeeze(1)
    terms = exponent.clamp_(min=_EXP2_FLOOR).exp2_().scatter_(1, local[:, None], 0.0)
    seg_sum.scatter_(1, seg_star[:, None], terms.sum(dim=1, keepdim=True))
    return _RowStats(row_max, seg_star * seg_len + local, seg_sum.sum(dim=1), excluded)


def _segment_values(
    logits: torch.Tensor,
    rows: torch.Tensor | None,
    seg_star: torch.Tensor,
    seg_len: int,
    n_full: int,
) -> torch.Tensor:
    """``[n, seg_len]`` logits of segment ``seg_star`` of each row, -inf past the vocabulary."""
    vocab = logits.shape[1]
    split = seg_len * n_full
    row_ids = torch.arange(logits.shape[0], device=logits.device) if rows is None else rows
    if logits.stride(-1) != 1:
        cols = (seg_star[:, None] * seg_len + torch.arange(seg_len, device=logits.device)).clamp(
            max=vocab - 1
        )
        values = logits[row_ids[:, None], cols]
    else:
        segments = logits[:, :split].view(logits.shape[0], n_full, seg_len)
        values = segments[row_ids, seg_star.clamp(max=n_full - 1)]
    if split < vocab:
        tail = torch.full_like(values, -math.inf)
        tail[:, : vocab - split] = logits[row_ids, split:]
        values = torch.where((seg_star == n_full)[:, None], tail, values)
    return values


if triton is not None:

    @triton.jit  # type: ignore[untyped-decorator]
    def _exp2_scale_of(temp_ptr, temp_stride, temp_value, row, TEMP_TENSOR: tl.constexpr):  # type: ignore[no-untyped-def]
        """log2(e) / T for one row, with the same conventions as _temperature_rows and
        _exp2_scale: T <= 0 is 1, +inf and NaN give NaN, the result is capped at FLT_MAX."""
        if TEMP_TENSOR:
            t = tl.load(temp_ptr + row * temp_stride).to(tl.float32)
        else:
            t = temp_value
        t = tl.where(t <= 0.0, 1.0, t)
        s = 1.4426950408889634 / t
        s = tl.where(s > 3.4028234663852886e38, 3.4028234663852886e38, s)
        return tl.where(t == float("inf"), float("nan"), s)

    @triton.jit
    def _lane_update(z, cols, m, c, a, s):  # type: ignore[no-untyped-def]
        """Fold one tile into the lanes' (max, sum over the other entries, column of the max)."""
        larger = z > m
        gap = tl.where(larger, m - z, z - m)
        weight = tl.where(z == float("-inf"), 0.0, tl.exp2(gap * s))
        c = tl.where(larger, (c + 1.0) * weight, c + weight)
        a = tl.where(larger, cols, a)
        m = tl.where(larger, z, m)
        return m, c, a

    @triton.jit  # type: ignore[untyped-decorator]
    def _chunk_stats_kernel(  # type: ignore[no-untyped-def]
        logits_ptr,
        row_stride,
        temp_ptr,
        temp_stride,
        temp_value,
        valid_ptr,
        chunk_max_ptr,
        chunk_comp_ptr,
        chunk_arg_ptr,
        vocab_size,
        chunk_size,
        n_chunks,
        TEMP_TENSOR: tl.constexpr,
        HAS_VALID: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        """One (row, vocabulary chunk): a single pass with a running maximum per lane.

        Lane state (m, c, a): the lane's maximum, the sum of exp2((z - m) * s) over its other
        entries, and the column of m. A larger entry z moves the old maximum into the sum,
        c <- (c + 1) * exp2((m - z) * s); any other entry adds exp2((z - m) * s). The sum never
        subtracts, so it keeps its relative precision however close q_max is to 1. Full tiles
        load without a mask so the loads vectorise; only the row's last tile is masked.
        """
        row = tl.program_id(0).to(tl.int64)
        chunk = tl.program_id(1)
        if HAS_VALID:
            if tl.load(valid_ptr + row) == 0:
                return
        s = _exp2_scale_of(temp_ptr, temp_stride, temp_value, row, TEMP_TENSOR)
        lane = tl.arange(0, BLOCK)
        m = tl.full([BLOCK], float("-inf"), tl.float32)
        c = tl.zeros([BLOCK], dtype=tl.float32)
        a = tl.zeros([BLOCK], dtype=tl.int32)
        start = chunk * chunk_size
        stop = tl.minimum(start + chunk_size, vocab_size)
        full_stop = start + (stop - start) // BLOCK * BLOCK
        base = logits_ptr + row * row_stride
        for offset in range(start, full_stop, BLOCK):
            cols = offset + lane
            z = tl.load(base + cols).to(tl.float32)
            m, c, a = _lane_update(z, cols, m, c, a, s)
        if full_stop < stop:
            cols = full_stop + lane
            z = tl.load(base + cols, mask=cols < stop, other=float("-inf")).to(tl.float32)
            m, c, a = _lane_update(z, cols, m, c, a, s)
        top = tl.max(m, axis=0)
        first = tl.min(tl.where(m == top, a, 2147483647), axis=0)
        keep = (a == first) & (m == top)
        scaled = tl.where(m == float("-inf"), 0.0, tl.exp2((m - top) * s))
        comp = tl.sum(tl.where(keep, c, (c + 1.0) * scaled), axis=0)
        out = row * n_chunks + chunk
        tl.store(chunk_max_ptr + out, top)
        tl.store(chunk_comp_ptr + out, comp)
        tl.store(chunk_arg_ptr + out, first)

    @triton.jit  # type: ignore[untyped-decorator]
    def _combine_chunks_kernel(  # type: ignore[no-untyped-def]
        chunk_max_ptr,
        chunk_comp_ptr,
        chunk_arg_ptr,
        n_chunks,
        temp_ptr,
        temp_stride,
        temp_value,
        valid_ptr,
        feature_ptr,
        max_ptr,
        arg_ptr,
        comp_ptr,
        max_log_odds,
        TEMP_TENSOR: tl.constexpr,
        HAS_VALID: tl.constexpr,
        CHUNKS: tl.constexpr,
    ):
        """Merge a row's chunk statistics: the chunk holding the first maximum contributes its
        complement, every other chunk all of its mass, exp2((m_b - m) * s) * (1 + c_b)."""
        row = tl.program_id(0).to(tl.int64)
        if HAS_VALID:
            if tl.load(valid_ptr + row) == 0:
                tl.store(feature_ptr + row, 0.0)
                tl.store(max_ptr + row, float("-inf"))
                tl.store(arg_ptr + row, 0)
                tl.store(comp_ptr + row, 0.0)
                return
        s = _exp2_scale_of(temp_ptr, temp_stride, temp_value, row, TEMP_TENSOR)
        k = tl.arange(0, CHUNKS)
        inside = k < n_chunks
        mb = tl.load(chunk_max_ptr + row * n_chunks + k, mask=inside, other=float("-inf"))
        cb = tl.load(chunk_comp_ptr + row * n_chunks + k, mask=inside, other=0.0)
        ab = tl.load(chunk_arg_ptr + row * n_chunks + k, mask=inside, other=0)
        top = tl.max(mb, axis=0)
        first = tl.min(tl.where(mb == top, k, CHUNKS), axis=0)
        scaled = tl.where(mb == float("-inf"), 0.0, tl.exp2((mb - top) * s))
        comp = tl.sum(tl.where(k == first, cb, (cb + 1.0) * scaled), axis=0)
        arg = tl.sum(tl.where(k == first, ab, 0), axis=0)
        x = tl.minimum(tl.maximum(-tl.log(comp), -max_log_odds), max_log_odds)
        defined = (top > float("-inf")) & (top < float("inf")) & (comp == comp)
        tl.store(feature_ptr + row, tl.where(defined, x, float("nan")))
        tl.store(max_ptr + row, top * (s * 0.6931471805599453))
        tl.store(arg_ptr + row, arg.to(tl.int64))
        tl.store(comp_ptr + row, comp)


# Elements per loop iteration of one program: 4 KiB of logits, so that 4 warps keep enough
# bytes in flight per multiprocessor whatever the dtype.
_TRITON_TILE_BYTES = 4096
_triton_failed = False


@functools.cache
def _multiprocessor_count(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).multi_processor_count)
    return 4


def _stats_triton(
    logits: torch.Tensor,
    temperature: float | torch.Tensor,
    valid: torch.Tensor | None,
    max_log_odds: float,
) -> tuple[torch.Tensor, PartialStats]:
    """Feature and scaled statistics of every row with two Triton kernels that read the logits
    once: per-(row, chunk) statistics, then a per-row merge. Padded rows do no work, and no
    other kernel runs (the temperature is resolved inside), so the call is two launches."""
    assert triton is not None
    n, vocab = logits.shape
    device = logits.device
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    block = _TRITON_TILE_BYTES // logits.element_size()
    target_programs = 4 * _multiprocessor_count(device)
    n_chunks = max(1, min(triton.cdiv(vocab, block), triton.cdiv(target_programs, n)))
    chunk_size = triton.cdiv(triton.cdiv(vocab, n_chunks), block) * block
    n_chunks = triton.cdiv(vocab, chunk_size)
    chunk_max = torch.empty(n, n_chunks, dtype=torch.float32, device=device)
    chunk_comp = torch.empty_like(chunk_max)
    chunk_arg = torch.empty(n, n_chunks, dtype=torch.int32, device=device)
    feature = torch.empty(n, dtype=torch.float32, device=device)
    row_max = torch.empty(n, dtype=torch.float32, device=device)
    row_arg = torch.empty(n, dtype=torch.int64, device=device)
    row_comp = torch.empty(n, dtype=torch.float32, device=device)
    temp_tensor = isinstance(temperature, torch.Tensor)
    if isinstance(temperature, torch.Tensor):
        temp_ptr, temp_stride, temp_value = temperature, temperature.stride(0), 1.0
    else:
        temp_ptr, temp_stride, temp_value = feature, 0, temperature
    valid_ptr = valid.view(torch.uint8) if valid is not None else feature
    _chunk_stats_kernel[(n, n_chunks)](
        logits,
        logits.stride(0),
        temp_ptr,
        temp_stride,
        temp_value,
        valid_ptr,
        chunk_max,
        chunk_comp,
        chunk_arg,
        vocab,
        chunk_size,
        n_chunks,
        TEMP_TENSOR=temp_tensor,
        HAS_VALID=valid is not None,
        BLOCK=block,
        num_warps=4,
    )
    _combine_chunks_kernel[(n,)](
        chunk_max,
        chunk_comp,
        chunk_arg,
        n_chunks,
        temp_ptr,
        temp_stride,
        temp_value,
        valid_ptr,
        feature,
        row_max,
        row_arg,
        row_comp,
        max_log_odds,
        TEMP_TENSOR=temp_tensor,
        HAS_VALID=valid is not None,
        CHUNKS=triton.next_power_of_2(n_chunks),
        num_warps=1,
    )
    return feature, PartialStats(row_max, row_arg, row_comp)


def _use_triton(logits: torch.Tensor) -> bool:
    return triton is not None and logits.is_cuda and not _triton_failed


def _use_native(logits: torch.Tensor) -> bool:
    return (
        _NATIVE_CPU
        and logits.device.type == "cpu"
        and logits.dtype in (torch.float32, torch.bfloat16)
        and logits.is_contiguous()
        and not logits.is_neg()
    )


def _native_log_odds(
    logits: torch.Tensor,
    temp: float | torch.Tensor,
    valid: torch.Tensor | None,
    max_log_odds: float,
) -> torch.Tensor:
    """The fused Rust kernel on CPU float32 or bfloat16 logits, read in place (``Tensor.numpy``
    is a view; bfloat16 goes through an int16 view of the same memory).

    The kernel takes ``1 / T`` per row: greedy rows are 1 and NaN stays NaN (as in
    _temperature_rows); it is kept within float32's positive normal range, so a temperature
    under ~3e-39 acts like that one and one above ~8e37 like that one.
    """
    n = logits.shape[0]
    inverse = (1.0 / _temperature_rows(temp, n, logits.device)).clamp(
        min=_FLOAT32_TINY, max=_FLOAT32_MAX
    )
    valid_np = None if valid is None else valid.contiguous().numpy()
    inverse_np = inverse.to(torch.float32).numpy()
    if logits.dtype == torch.bfloat16:
        # numpy has no bfloat16: the kernel reads the bit patterns through an int16 view.
        bits = logits.detach().view(torch.int16).numpy()
        out = _native.draft_log_odds_bf16(bits, inverse_np, max_log_odds, valid_np)
    else:
        values = logits.detach().numpy()
        out = _native.draft_log_odds_f32(values, inverse_np, max_log_odds, valid_np)
    return torch.from_numpy(out)


def _log_odds_from_stats(stats: _RowStats, max_log_odds: float) -> torch.Tensor:
    """x = excluded * ln 2 - ln(complement), clamped; NaN where the row maximum is not finite
    (a NaN or +inf logit, or no finite entry), since such a row has no distribution."""
    x = stats.excluded * _LN2 - torch.log(stats.complement)
    x = x.clamp(min=-max_log_odds, max=max_log_odds)
    return torch.where(torch.isfinite(stats.max), x, torch.full_like(x, math.nan))


def _valid_rows(row_valid: torch.Tensor | None) -> torch.Tensor | None:
    if row_valid is None:
        return None
    return torch.nonzero(row_valid).squeeze(1)


def _scatter_rows(
    values: torch.Tensor, rows: torch.Tensor | None, n: int, fill: float
) -> torch.Tensor:
    if rows is None:
        return values
    out = torch.full((n,), fill, dtype=values.dtype, device=values.device)
    out[rows] = values
    return out


def _stats_for_rows(
    logits: torch.Tensor,
    temperature: float | torch.Tensor,
    rows: torch.Tensor | None,
    exclude: torch.Tensor | None = None,
) -> _RowStats:
    t = _temperature_rows(temperature, logits.shape[0], logits.device)
    return _stats_torch(logits, _exp2_scale(t if rows is None else t[rows]), rows, exclude)


# --------------------------------------------------------------------------------------------
# Top-k / top-p


def _truncation_args(
    top_k: int | torch.Tensor | None,
    top_p: float | torch.Tensor | None,
    n: int,
    vocab: int,
    device: torch.device,
    valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Per-row k (vocab where off) and p (1 where off), or None when the argument is absent.

    Host tensors are checked like the scalars on the rows that ``valid`` keeps (a padded row's
    value is never used): a top-k below -1, a top-p that is NaN or <= 0 raise. Device tensors are
    not checked (it would synchronise); see :func:`draft_log_odds` for what such entries do.
    """
    k_rows = p_rows = None
    if top_k is not None:
        if isinstance(top_k, bool):
            raise TypeError("top_k must be an int or an integer torch.Tensor, got bool")
        if isinstance(top_k, numbers.Integral):
            top_k = int(top_k)
            if top_k < -1:
                raise ValueError(f"top_k must be >= 1, or 0 or -1 for no top-k, got {top_k}")
            # Anything above the vocabulary is no top-k: the same row, and it fits int64.
            k_rows = torch.full((n,), min(top_k, vocab), dtype=torch.int64, device=device)
        else:
            if isinstance(top_k, torch.Tensor):
                top_k = _check_integer_tensor(top_k, "top_k")
            k_rows = _snapshot(_per_row(top_k, n, "top_k", device).to(torch.int64))
            if k_rows.device.type == "cpu":
                row = _first_bad_row(k_rows < -1, valid)
                if row is not None:
                    raise ValueError(
                        f"top_k[{row}] must be >= 1, or 0 or -1 for no top-k, got "
                        f"{int(k_rows[row])}"
                    )
        k_rows = torch.where((k_rows <= 0) | (k_rows > vocab), vocab, k_rows)
    if top_p is not None:
        if isinstance(top_p, bool):
            raise TypeError("top_p must be a float or a torch.Tensor, got bool")
        if isinstance(top_p, numbers.Real):
            value = _real(top_p, "top_p")
            if not 0.0 < value <= 1.0:
                raise ValueError(f"top_p must lie in (0, 1], got {top_p!r}")
            p_rows = torch.full((n,), value, dtype=torch.float64, device=device)
        else:
            p_rows = _snapshot(_per_row(top_p, n, "top_p", device).to(torch.float64))
            if p_rows.device.type == "cpu":
                row = _first_bad_row(~(p_rows > 0.0), valid)
                if row is not None:
                    raise ValueError(
                        f"top_p[{row}] must lie in (0, 1] (>= 1 is no top-p), got "
                        f"{float(p_rows[row])!r}"
                    )
            p_rows = torch.where(p_rows >= 1.0, torch.ones_like(p_rows), p_rows)
    return k_rows, p_rows


def _truncated_complement(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    rows: torch.Tensor,
    k_rows: torch.Tensor | None,
    p_rows: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(row max, complement) after top-k then top-p, for the given rows.

    The row's scaled logits are sorted in descending order; top-k keeps the first k, and top-p,
    on the renormalised top-k distribution, keeps position j while the mass before it is below
    p (vLLM's rule: the smallest prefix holding at least p, and never fewer than one token).
    Position 0 is one occurrence of the maximum; the complement is the kept mass after it. The
    cumulative mass used for the cut is float64 so the cut does not move with summation order.
    """
    vocab = logits.shape[1]
    device = logits.device
    n = rows.numel()
    row_max = torch.empty(n, dtype=torch.float32, device=device)
    complement = torch.empty(n, dtype=torch.float32, device=device)
    positions = torch.arange(vocab, device=device)
    block = max(1, _TRUNCATED_BLOCK_BYTES // (32 * vocab))
    for start in range(0, n, block):
        index = rows[start : start + block]
        z = logits.index_select(0, index).to(torch.float32)
        top = z.amax(dim=1, keepdim=True)
        y = (z - top).div_(temperature[index].to(torch.float32)[:, None])
        k = k_rows[start : start + block] if k_rows is not None else None
        k_max = int(k.max()) if k is not None else vocab
        if p_rows is None and k_max < vocab:
            ordered = torch.topk(y, k_max, dim=1, sorted=True).values
        else:
            ordered = torch.sort(y, dim=1, descending=True).values
        terms = ordered.exp_()
        width = terms.shape[1]
        keep = torch.ones_like(terms, dtype=torch.bool)
        if k is not None:
            keep &= positions[:width] < k[:, None]
        if p_rows is not None:
            p = p_rows[start : start + block]
            kept = torch.where(keep, terms, 0.0).to(torch.float64)
            total = kept.sum(dim=1, keepdim=True)
            before = kept.cumsum(dim=1) - kept
            keep &= before < p[:, None] * total
        keep[:, 0] = False
        complement[start : start + block] = torch.where(keep, terms, 0.0).sum(dim=1)
        row_max[start : start + block] = top.squeeze(1)
    return row_max, complement


# --------------------------------------------------------------------------------------------
# The feature


def draft_log_odds(
    logits: torch.Tensor,
    temperature: float | torch.Tensor | None = None,
    *,
    top_k: int | torch.Tensor | None = None,
    top_p: float | torch.Tensor | None = None,
    max_log_odds: float = MAX_LOG_ODDS,
    row_valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """``logit(q_max)`` of each row of drafter logits: float32 ``[N]`` on the logits' device.

    ``x = -log(sum over every entry but one occurrence of the maximum m of exp((z - m) / T))``,
    exact as ``q_max -> 1`` because ``1 - q_max`` is summed, never formed as ``total - 1``.

    Args:
        logits: ``[N, V]`` float32, bfloat16 or float16 (computed in float32), any strides; a
            lazily negated view (``x._neg_view()``) is read as the values it stands for.
        temperature: scalar or ``[N]`` tensor; ``<= 0`` is greedy and leaves the logits
            unscaled (vLLM's convention). ``None`` means 1. A scalar must be finite; a tensor
            row that is NaN or ``+inf`` gives a NaN feature (see below) instead of failing the
            whole batch.
        top_k: optional int or ``[N]`` tensor applied to q before taking q_max; ``<= 0`` or
            ``>= V`` disables it for a row, below -1 raises. Off by default, as in vLLM's
            estimator.
        top_p: optional float in (0, 1] or ``[N]`` tensor, applied after top-k on the
            renormalised distribution; ``>= 1`` disables it for a row; NaN or ``<= 0`` raises.
        max_log_odds: the symmetric clamp, 40 by default: a positive normal float32 (about
            1.2e-38 to 3.4e38), whatever the logits' dtype.
        row_valid: optional bool ``[N]``; rows marked False (padding) are not computed and give 0.

    Per-row ``top_k``/``top_p`` tensors are checked entry by entry only on the host, and only on
    rows ``row_valid`` keeps. On an accelerator the entries are not checked (that would wait for
    the device): there a ``top_k`` below -1 acts as no top-k, and a ``top_p`` that is NaN or
    ``<= 0`` keeps only the most likely token, so the row gives ``+max_log_odds``.

    A row with one finite entry gives ``+max_log_odds``. A valid row whose maximum is not finite
    (a NaN or ``+inf`` logit, or no finite entry), or whose temperature is NaN or ``+inf``, gives
    NaN, which the estimator rejects rather than learning from.
    """
    logits = _check_logits(logits)
    max_log_odds = _check_max_log_odds(max_log_odds)
    n, vocab = logits.shape
    device = logits.device
    temp = _check_temperature(temperature, n, device)
    valid = _check_row_valid(row_valid, n, device)
    k_rows, p_rows = _truncation_args(top_k, top_p, n, vocab, device, valid)
    if n == 0:
        return torch.empty(0, dtype=torch.float32, device=device)
    with torch.no_grad():
        if k_rows is None and p_rows is None:
            return _draft_log_odds_untruncated(logits, temp, valid, max_log_odds)
        truncated = torch.zeros(n, dtype=torch.bool, device=device)
        if k_rows is not None:
            truncated |= k_rows < vocab
        if p_rows is not None:
            truncated |= p_rows < 1.0
        plain = ~truncated if valid is None else valid & ~truncated
        out = _draft_log_odds_untruncated(logits, temp, plain, max_log_odds)
        rows = torch.nonzero(truncated if valid is None else truncated & valid).squeeze(1)
        if rows.numel():
            k_sel = k_rows[rows] if k_rows is not None else None
            p_sel = p_rows[rows] if p_rows is not None else None
            t_rows = _temperature_rows(temp, n, device)
            row_max, complement = _truncated_complement(logits, t_rows, rows, k_sel, p_sel)
            x = (-torch.log(complement)).clamp(min=-max_log_odds, max=max_log_odds)
            out[rows] = torch.where(torch.isfinite(row_max), x, torch.full_like(x, math.nan))
        return out


def _draft_log_odds_untruncated(
    logits: torch.Tensor,
    temp: float | torch.Tensor,
    valid: torch.Tensor | None,
    max_log_odds: float,
) -> torch.Tensor:
    n = logits.shape[0]
    if _use_native(logits):
        return _native_log_odds(logits, temp, valid, max_log_odds)
    if _use_triton(logits):
        try:
            feature, _ = _stats_triton(logits, temp, valid, max_log_odds)
            return feature
        except Exception as error:
            _disable_triton(error)
    rows = _valid_rows(valid)
    if rows is not None and rows.numel() == 0:
        return torch.zeros(n, dtype=torch.float32, device=logits.device)
    stats = _stats_for_rows(logits, temp, rows)
    return _scatter_rows(_log_odds_from_stats(stats, max_log_odds), rows, n, 0.0)


# --------------------------------------------------------------------------------------------
# Vocabulary-parallel drafters


def partial_stats(
    logits_shard: torch.Tensor,
    temperature: float | torch.Tensor | None = None,
    *,
    row_valid: torch.Tensor | None = None,
) -> PartialStats:
    """Per-row ``(max, argmax, complement)`` of one vocabulary shard of the drafter's logits.

    A tensor-parallel drafter all-gathers these three numbers per row instead of its logits and
    calls :func:`combine_partials`, which gives the same feature as :func:`draft_log_odds` on the
    unsharded row. Padded rows, and shards with no finite entry in a row, give the empty partial
    ``(-inf, 0, 0)``, which combines as no mass.
    """
    logits_shard = _check_logits(logits_shard, "logits_shard")
    n = logits_shard.shape[0]
    device = logits_shard.device
    temp = _check_temperature(temperature, n, device)
    valid = _check_row_valid(row_valid, n, device)
    if n == 0:
        empty = torch.empty(0, dtype=torch.float32, device=device)
        return PartialStats(empty, torch.empty(0, dtype=torch.int64, device=device), empty)
    with torch.no_grad():
        if _use_triton(logits_shard):
            try:
                _, stats = _stats_triton(logits_shard, temp, valid, MAX_LOG_ODDS)
                return stats
            except Exception as error:
                _disable_triton(error)
        rows = _valid_rows(valid)
        if rows is not None and rows.numel() == 0:
            return PartialStats(
                torch.full((n,), -math.inf, device=device),
                torch.zeros(n, dtype=torch.int64, device=device),
                torch.zeros(n, device=device),
            )
        raw = _stats_for_rows(logits_shard, temp, rows)
        t = _temperature_rows(temp, n, device)
        t = t if rows is None else t[rows]
        scaled_max = (raw.max.to(torch.float64) / t).to(torch.float32)
        empty = raw.max == -math.inf
        return PartialStats(
            _scatter_rows(scaled_max, rows, n, -math.inf),
            _scatter_rows(raw.argmax.masked_fill(empty, 0), rows, n, 0),
            _scatter_rows(raw.complement.masked_fill(empty, 0.0), rows, n, 0.0),
        )


def _disable_triton(error: Exception) -> None:
    """A kernel that fails to build (an unsupported GPU or Triton version) must not take a
    server down: warn once and use the torch path from then on."""
    global _triton_failed
    _triton_failed = True
    warnings.warn(
        f"av_core.features: Triton kernel unavailable ({error!r}); using torch operations",
        RuntimeWarning,
        stacklevel=3,
    )


def combine_partials(
    partials: Sequence[PartialStats],
    *,
    max_log_odds: float = MAX_LOG_ODDS,
    row_valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """The feature of the unsharded rows from every shard's :class:`PartialStats`.

    With ``M = max_s max_s`` and ``s*`` the first shard attaining it,
    ``complement = c_{s*} + sum over s != s* of exp(max_s - M) * (1 + c_s)``: the shard holding
    the left-out maximum contributes its complement, every other shard all of its mass (a tie in
    another shard counts, as in the unsharded row). ``x = -log(complement)``, clamped; NaN where
    ``M`` is not finite; 0 for rows marked False in ``row_valid``.
    """
    max_log_odds = _check_max_log_odds(max_log_odds)
    if isinstance(partials, PartialStats) or not isinstance(partials, Sequence):
        raise TypeError("partials must be a sequence of PartialStats, one per shard")
    if len(partials) == 0:
        raise ValueError("partials must hold at least one shard, got 0")
    for i, part in enumerate(partials):
        if not isinstance(part, PartialStats):
            raise TypeError(f"partials[{i}] must be a PartialStats, got {type(part).__name__}")
    fields: dict[str, list[torch.Tensor]] = {"max": [], "complement": []}
    n = device = None
    for i, part in enumerate(partials):
        for field, values in fields.items():
            value = getattr(part, field)
            where = f"partials[{i}].{field}"
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"{where} must be a torch.Tensor, got {type(value).__name__}")
            if not value.dtype.is_floating_point:
                raise TypeError(f"{where} must be a float tensor, got dtype {value.dtype}")
            if value.dim() != 1:
                raise ValueError(f"{where} must be 1-D, got shape {tuple(value.shape)}")
            if n is None:
                n, device = value.shape[0], value.device
            if value.shape[0] != n:
                raise ValueError(f"{where} must have shape [{n}], got {tuple(value.shape)}")
            if value.device != device:
                raise ValueError(f"{where} must be on {device}, got {value.device}")
            values.append(_dense(value.detach(), where).to(torch.float32))
    assert n is not None
    with torch.no_grad():
        maxima = torch.stack(fields["max"])
        comps = torch.stack(fields["complement"])
        top = maxima.amax(dim=0)
        first = maxima.argmax(dim=0)
        shards = torch.arange(len(partials), device=maxima.device)[:, None]
        gap = torch.where(maxima == -math.inf, -math.inf, maxima - top)
        mass = torch.exp(gap) * (1.0 + comps)
        complement = torch.where(shards == first, comps, mass).sum(dim=0)
        x = (-torch.log(complement)).clamp(min=-max_log_odds, max=max_log_odds)
        x = torch.where(torch.isfinite(top), x, torch.full_like(x, math.nan))
        valid = _check_row_valid(row_valid, n, x.device)
        if valid is not None:
            x = torch.where(valid, x, torch.zeros_like(x))
        return x


# --------------------------------------------------------------------------------------------
# Offline evaluation only


def q_max(logits: torch.Tensor, temperature: float | torch.Tensor | None = None) -> torch.Tensor:
    """Raw ``q_max = 1 / (1 + complement)`` in float32, for offline comparison.

    It saturates at exactly 1 once the complement falls below ``2**-24``, which is the loss of
    resolution :func:`draft_log_odds` exists to avoid; do not feed it to the estimator.
    """
    logits = _check_logits(logits)
    temp = _check_temperature(temperature, logits.shape[0], logits.device)
    if logits.shape[0] == 0:
        return torch.empty(0, dtype=torch.float32, device=logits.device)
    with torch.no_grad():
        stats = _stats_for_rows(logits, temp, None)
        q = 1.0 / (1.0 + stats.complement)
        return torch.where(torch.isfinite(stats.max), q, torch.full_like(q, math.nan))


def sampled_log_odds(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    temperature: float | torch.Tensor | None = None,
    *,
    max_log_odds: float = MAX_LOG_ODDS,
) -> torch.Tensor:
    """``logit(q(token))`` of the drawn token, clamped. OFFLINE EVALUATION ONLY: LOSSY.

    It reads the sampled token, so gating verification on it biases the emitted distribution
    (with p = (.5, .5), q = (.2, .8) and "verify only if q(x) >= .5" the output is (.4, .6);
    DESIGN.md §4). Computed as ``(z_t - m) / T - log(sum over j != t of exp((z_j - m) / T))``.
    """
    logits = _check_logits(logits)
    max_log_odds = _check_max_log_odds(max_log_odds)
    n, vocab = logits.shape
    tokens = _check_tokens(tokens, n, vocab, logits.device)
    temp = _check_temperature(temperature, n, logits.device)
    if n == 0:
        return torch.empty(0, dtype=torch.float32, device=logits.device)
    with torch.no_grad():
        return _log_odds_from_stats(_stats_for_rows(logits, temp, None, tokens), max_log_odds)


def sampled_gumbel(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    temperature: float | torch.Tensor | None = None,
    *,
    max_log_odds: float = MAX_LOG_ODDS,
) -> torch.Tensor:
    """``-log(-log q(token))`` of the drawn token, clamped. OFFLINE EVALUATION ONLY: LOSSY.

    Reads the sampled token, with the same bias as :func:`sampled_log_odds`. ``-log q`` is
    ``log1p(complement)`` when the token is a maximum (exact as q -> 1) and
    ``log(exp(d) + complement) - d`` with ``d = (z_t - m) / T < 0`` otherwise.
    """
    logits = _check_logits(logits)
    max_log_odds = _check_max_log_odds(max_log_odds)
    n, vocab = logits.shape
    tokens = _check_tokens(tokens, n, vocab, logits.device)
    temp = _check_temperature(temperature, n, logits.device)
    if n == 0:
        return torch.empty(0, dtype=torch.float32, device=logits.device)
    with torch.no_grad():
        stats = _stats_for_rows(logits, temp, None, tokens)
        d = stats.excluded * _LN2
        neg_log_q = torch.where(
            d == 0.0,
            torch.log1p(stats.complement),
            torch.log(torch.exp(d) + stats.complement) - d,
        )
        g = (-torch.log(neg_log_q)).clamp(min=-max_log_odds, max=max_log_odds)
        return torch.where(torch.isfinite(stats.max), g, torch.full_like(g, math.nan))


def top2_margin(
    logits: torch.Tensor, temperature: float | torch.Tensor | None = None
) -> torch.Tensor:
    """``(z_(1) - z_(2)) / T``, the gap between the two largest scaled logits, float32.

    An alternative confidence signal for offline comparison. It ignores every entry below the
    second, so it cannot tell a two-way split from a long tail. ``+inf`` when a row has fewer than
    two finite entries; 0 with a tie at the maximum.
    """
    logits = _check_logits(logits)
    n, vocab = logits.shape
    temp = _temperature_rows(_check_temperature(temperature, n, logits.device), n, logits.device)
    if vocab < 2:
        return torch.full((n,), math.inf, dtype=torch.float32, device=logits.device)
    out = torch.empty(n, dtype=torch.float32, device=logits.device)
    block = _block_rows(vocab, _CPU_BLOCK_BYTES)
    with torch.no_grad():
        for start in range(0, n, block):
            top2 = torch.topk(logits[start : start + block], 2, dim=1).values.to(torch.float64)
            gap = (top2[:, 0] - top2[:, 1]) / temp[start : start + block]
            gap = torch.where(top2[:, 1] == -math.inf, math.inf, gap)
            out[start : start + block] = gap.to(torch.float32)
    return out


def entropy(logits: torch.Tensor, temperature: float | torch.Tensor | None = None) -> torch.Tensor:
    """Shannon entropy of q in nats, float32: ``log S - sum_j e_j y_j / S`` with
    ``y = (z - m) / T``, ``e = exp(y)``, ``S = sum e``. For offline comparison of features."""
    logits = _check_logits(logits)
    n, vocab = logits.shape
    temp = _check_temperature(temperature, n, logits.device)
    temp = _temperature_rows(temp, n, logits.device).to(torch.float32)
    out = torch.empty(n, dtype=torch.float32, device=logits.device)
    block = _block_rows(vocab, _CPU_BLOCK_BYTES)
    with torch.no_grad():
        for start in range(0, n, block):
            z = logits[start : start + block].to(torch.float32)
            y = (z - z.amax(dim=1, keepdim=True)).div_(temp[start : start + block, None])
            e = torch.exp(y)
            total = e.sum(dim=1)
            weighted = torch.where(e > 0.0, e * y, 0.0).sum(dim=1)
            out[start : start + block] = torch.log(total) - weighted / total
    return out


# --------------------------------------------------------------------------------------------
# Hand-over to the host


def to_host(features: torch.Tensor, out: torch.Tensor | None = None) -> np.ndarray:
    """A numpy view of ``features`` on the host, for the Rust core to read without a copy.

    A CPU tensor passes through as a view (``out`` is then ignored). An accelerator tensor is
    copied into ``out`` (a CPU tensor of the same dtype and trailing shape, with at least as many
    rows; allocated pinned when None) with a non-blocking copy and one event wait, so a pinned
    ``out`` reused across steps costs one DMA and no allocation. The view aliases ``out``: it is
    overwritten by the next call that reuses the buffer.
    """
    if not isinstance(features, torch.Tensor):
        raise TypeError(f"features must be a torch.Tensor, got {type(features).__name__}")
    features = _dense(features.detach(), "features")
    if features.device.type == "cpu":
        return _numpy_view(features, "features")
    if out is None:
        host = torch.empty(
            features.shape,
            dtype=features.dtype,
            pin_memory=features.device.type == "cuda",
        )
    else:
        host = _check_host_buffer(out, features)
    if features.device.type == "cuda":
        host.copy_(features, non_blocking=True)
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record(torch.cuda.current_stream(features.device))
        event.synchronize()
    else:
        host.copy_(features)
    return _numpy_view(host, "features")


def _check_host_buffer(out: object, features: torch.Tensor) -> torch.Tensor:
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor or None, got {type(out).__name__}")
    if out.device.type != "cpu":
        raise ValueError(f"out must be a host (CPU) tensor, got device {out.device}")
    if out.dtype != features.dtype:
        raise TypeError(f"out must have dtype {features.dtype}, got {out.dtype}")
    if not out.is_contiguous():
        raise ValueError("out must be contiguous")
    if out.is_neg() or out.is_conj() or out.layout != torch.strided:
        raise ValueError("out must be a plain dense tensor, not a negated or conjugated view")
    if features.dim() == 0:
        if out.dim() != 0:
            raise ValueError(f"out must have shape [], got {tuple(out.shape)}")
        return out
    if out.dim() != features.dim() or out.shape[1:] != features.shape[1:]:
        trailing = "".join(f", {size}" for size in features.shape[1:])
        raise ValueError(
            f"out must have shape [>= {features.shape[0]}{trailing}], got {tuple(out.shape)}"
        )
    if out.shape[0] < features.shape[0]:
        raise ValueError(
            f"out must have at least {features.shape[0]} rows, got shape {tuple(out.shape)}"
        )
    return out[: features.shape[0]]


def _numpy_view(tensor: torch.Tensor, name: str) -> np.ndarray:
    try:
        return tensor.resolve_conj().resolve_neg().numpy()
    except TypeError as error:
        raise TypeError(
            f"{name} has dtype {tensor.dtype}, which numpy cannot hold; convert it first"
        ) from error


def as_numpy(x: Any, argument_name: str) -> np.ndarray:
    """``x`` as a numpy array, without a copy where possible.

    numpy arrays pass through; CPU tensors become views; accelerator tensors go through
    :func:`to_host`. Anything else raises TypeError naming ``argument_name``.
    """
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, torch.Tensor):
        return to_host(x) if x.device.type != "cpu" else _numpy_view(x.detach(), argument_name)
    raise TypeError(
        f"{argument_name} must be a numpy array or a torch tensor, got {type(x).__name__}"
    )


# --------------------------------------------------------------------------------------------
# Persistent per-request slots


class FeatureExtractor:
    """Owns the feature buffer of a serving engine: ``features[slot, step]`` for a fixed
    ``max_num_reqs x num_speculative_steps``, in vLLM's persistent layout (slot = request-state
    index, column = draft position), plus a pinned host buffer for the hand-over.

    :meth:`write` turns one draft step's logits into features and scatters them into their slots.
    Padded rows (request index -1) are not computed and write nothing; they are routed to a spare
    row so the scatter needs no host synchronisation.
    """

    def __init__(
        self,
        max_num_reqs: int,
        num_speculative_steps: int,
        device: torch.device | str = "cpu",
        *,
        max_log_odds: float = MAX_LOG_ODDS,
    ) -> None:
        for name, value in (
            ("max_num_reqs", max_num_reqs),
            ("num_speculative_steps", num_speculative_steps),
        ):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        # Checked before anything is allocated: the slots (and a host copy) would otherwise ask
        # for whatever the product is, and fail only after trying.
        entries = (int(max_num_reqs) + 1) * int(num_speculative_steps)
        if entries > MAX_FEATURE_ENTRIES:
            raise ValueError(
                f"max_num_reqs x num_speculative_steps must stay within {MAX_FEATURE_ENTRIES} "
                f"feature slots (MAX_FEATURE_ENTRIES), got {max_num_reqs} x "
                f"{num_speculative_steps}"
            )
        self.max_num_reqs = int(max_num_reqs)
        self.num_speculative_steps = int(num_speculative_steps)
        self.device = _check_device(device)
        self.max_log_odds = _check_max_log_odds(max_log_odds)
        try:
            self._slots = torch.zeros(
                self.max_num_reqs + 1,
                self.num_speculative_steps,
                dtype=torch.float32,
                device=self.device,
            )
        except (RuntimeError, AssertionError) as error:  # an absent or exhausted device
            raise ValueError(
                f"device: cannot hold the features on {self.device} ({error})"
            ) from None
        self.features = self._slots[: self.max_num_reqs]
        self._host: torch.Tensor | None = None
        if self.device.type != "cpu":
            self._host = torch.empty(
                self.max_num_reqs,
                self.num_speculative_steps,
                dtype=torch.float32,
                pin_memory=self.device.type == "cuda",
            )

    def _slot_index(self, idx_mapping: object, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(slot per row with padding sent to the spare row, validity per row)."""
        idx_mapping = _check_integer_tensor(idx_mapping, "idx_mapping")
        if idx_mapping.shape != (n,):
            raise ValueError(
                f"idx_mapping must have shape [{n}] (one per logits row), got "
                f"{tuple(idx_mapping.shape)}"
            )
        idx_mapping = _snapshot(idx_mapping)
        if idx_mapping.device.type == "cpu" and n:
            low, high = int(idx_mapping.min()), int(idx_mapping.max())
            if low < -1 or high >= self.max_num_reqs:
                bad = low if low < -1 else high
                raise ValueError(
                    f"idx_mapping entries must lie in [-1, {self.max_num_reqs}), got {bad}"
                )
        idx = idx_mapping.to(device=self.device, dtype=torch.int64)
        valid = (idx >= 0) & (idx < self.max_num_reqs)
        return torch.where(valid, idx, self.max_num_reqs), valid

    def _by_slot(self, value: Any, name: str, slot: torch.Tensor) -> Any:
        """A per-slot sampling parameter gathered per row (a number or 0-d tensor as is)."""
        if value is None or not isinstance(value, torch.Tensor) or value.dim() == 0:
            return value
        if value.shape != (self.max_num_reqs,):
            raise ValueError(
                f"{name} must be a scalar or have shape [{self.max_num_reqs}] (one per request "
                f"slot), got {tuple(value.shape)}"
            )
        value = _dense(value.detach(), name).to(self.device)
        padded = torch.cat([value, value[:1]])
        return padded[slot]

    def _step_index(self, draft_step: object, n: int) -> torch.Tensor:
        k = self.num_speculative_steps
        if isinstance(draft_step, bool):
            raise TypeError("draft_step must be an int or an integer torch.Tensor, got bool")
        if isinstance(draft_step, numbers.Integral):
            draft_step = int(draft_step)
            if not 0 <= draft_step < k:
                raise ValueError(f"draft_step must lie in [0, {k}), got {draft_step}")
            return torch.full((n,), draft_step, dtype=torch.int64, device=self.device)
        if not isinstance(draft_step, torch.Tensor):
            raise TypeError(
                f"draft_step must be an int or an integer torch.Tensor, got "
                f"{type(draft_step).__name__}"
            )
        draft_step = _snapshot(_check_integer_tensor(draft_step, "draft_step"))
        if draft_step.device.type == "cpu" and draft_step.numel():
            low, high = int(draft_step.min()), int(draft_step.max())
            if low < 0 or high >= k:
                raise ValueError(
                    f"draft_step entries must lie in [0, {k}), got {low if low < 0 else high}"
                )
        return _per_row(draft_step, n, "draft_step", self.device).to(torch.int64)

    def write(
        self,
        logits: torch.Tensor,
        idx_mapping: torch.Tensor,
        draft_step: int | torch.Tensor,
        temperature: float | torch.Tensor | None = None,
        *,
        top_k: int | torch.Tensor | None = None,
        top_p: float | torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Compute one draft step's features and store them in ``features[slot, step]``.

        Args:
            logits: ``[N, V]`` drafter logits, one row per (request, draft position).
            idx_mapping: ``[N]`` request-state index per row, -1 for padding. On the host,
                entries outside ``[-1, max_num_reqs)`` raise; on a device they count as padding
                (checking them would synchronise).
            draft_step: the draft position of every row (int or 0-d tensor), or ``[N]`` per row;
                like ``idx_mapping``, a device entry outside ``[0, K)`` counts as padding.
            temperature, top_k, top_p: scalars, or ``[max_num_reqs]`` tensors indexed by
                request-state index (vLLM keeps sampling parameters in that layout); host
                tensors are checked on the slots this call uses (:func:`draft_log_odds`).

        Returns the ``[N]`` features in row order (0 on padded rows). A call that raises has
        written nothing.
        """
        logits = _check_logits(logits)
        n = logits.shape[0]
        slot, valid = self._slot_index(idx_mapping, n)
        step = self._step_index(draft_step, n)
        # A device step outside [0, K) (not checked: it would synchronise) counts as padding, as
        # an out-of-range request index does: not computed, written to the spare row.
        in_range = (step >= 0) & (step < self.num_speculative_steps)
        valid = valid & in_range
        slot = torch.where(valid, slot, self.max_num_reqs)
        step = step.clamp(0, self.num_speculative_steps - 1)
        x = draft_log_odds(
            logits.to(self.device),
            self._by_slot(temperature, "temperature", slot),
            top_k=self._by_slot(top_k, "top_k", slot),
            top_p=self._by_slot(top_p, "top_p", slot),
            max_log_odds=self.max_log_odds,
            row_valid=valid,
        )
        self._slots.index_put_((slot, step), x)
        return x

    def gather(self, idx_mapping: torch.Tensor) -> torch.Tensor:
        """``[R, K]`` features of the given request slots in batch order (zeros for -1)."""
        slot, valid = self._slot_index(idx_mapping, _length(idx_mapping, "idx_mapping"))
        rows = self._slots[slot]
        return torch.where(valid[:, None], rows, torch.zeros_like(rows))

    def to_host(self, idx_mapping: torch.Tensor | None = None) -> np.ndarray:
        """The features (all slots, or :meth:`gather` of ``idx_mapping``) as a host numpy array,
        staged through the extractor's pinned buffer: valid until the next call."""
        values = self.features if idx_mapping is None else self.gather(idx_mapping)
        return to_host(values, out=self._host)


def _length(value: object, name: str) -> int:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be an integer torch.Tensor, got {type(value).__name__}")
    if value.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(value.shape)}")
    return int(value.shape[0])
