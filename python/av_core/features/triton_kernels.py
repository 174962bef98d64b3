"""The CUDA path: two Triton kernels that read the logits once (per-chunk statistics with a
running maximum per lane, then a per-row merge) and give the feature and the scaled statistics.

Without Triton (``triton`` is None), or once a kernel has failed to build, every caller takes
the torch path of :mod:`av_core.features.stats` instead.
"""

from __future__ import annotations

import functools
import warnings

import torch

try:
    import triton  # type: ignore[import-untyped]
    import triton.language as tl  # type: ignore[import-untyped]
except ImportError:  # pragma: no cover - triton ships with torch's CUDA wheels
    triton = None
from av_core.features.stats import PartialStats

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


def _disable_triton(error: Exception) -> None:
    """A kernel that fails to build (an unsupported GPU or Triton version) must not take a
    server down: warn once and use the torch path from then on."""
    global _triton_failed
    _triton_failed = True
    warnings.warn(
        f"av_core.features: Triton kernel unavailable ({error!r}); using torch operations",
        RuntimeWarning,
        stacklevel=4,
    )


def _triton_stats(
    logits: torch.Tensor,
    temperature: float | torch.Tensor,
    valid: torch.Tensor | None,
    max_log_odds: float,
) -> tuple[torch.Tensor, PartialStats] | None:
    """:func:`_stats_triton` where it applies (CUDA logits, Triton present and working), else
    None. A kernel that fails is disabled with a warning (at the caller's call site) and None
    sends the caller down the torch path."""
    if not _use_triton(logits):
        return None
    try:
        return _stats_triton(logits, temperature, valid, max_log_odds)
    except Exception as error:
        _disable_triton(error)
        return None
