"""Pooled statistics across data-parallel ranks, over a ``torch.distributed`` process group.

Each data-parallel rank of a server sees its own share of the traffic, so an estimator per rank
learns from a fraction of the verdicts. :func:`pool_round` sums the open round of every rank's
estimator over a process group, so that the next ``refit()`` fits every rank on the pooled round.
The round's statistics are exact integers (the ``vllm`` update's fixed-point IRLS moments, or the
``map`` update's histograms), so the sum is exact: it does not depend on the order the ranks (or
their verdicts) come in, and when every rank starts from the same coefficients, every rank refits
to the same bits as one estimator fed all the verdicts. (Under ``map`` a rank's own fits within a
round use its own share only; the round's end, after pooling, is the same on every rank.)

    import torch.distributed as dist
    from av_core import AcceptanceEstimator
    from av_core.distributed import pool_round

    est = AcceptanceEstimator(4, refit_interval=None)   # manual: refits only when told
    ...                                                 # est.observe(...) every step
    pool_round(est, group)                              # on every rank, at the same step
    est.refit()                                         # same coefficients everywhere

It is a collective: every rank of ``group`` must call it the same number of times, in the same
order relative to the group's other collectives. A rank that served nothing since the last call
contributes zeros. Only the estimator's own refit may not run in between (``refit_interval=None``,
as above), or ranks would refit on their own rounds. ``av_core.vllm``'s drop-in estimator
pools before each of its refits when given ``process_group=``; ``AV_CORE_SHARE_STATS=dp`` wires it
to vLLM's data-parallel group (docs/vllm.md).

torch is needed only here (``pip install "av_core[torch]"``); the group may be gloo (a CPU
tensor is reduced) or NCCL (the tensor goes to the current CUDA device, a synchronising copy, once
per refit).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from av_core._native import AcceptanceEstimator, InvalidTypeError, InvalidValueError

__all__ = [
    "HISTOGRAM_COLUMNS",
    "LIMB_BITS",
    "NUM_LIMBS",
    "STAT_COLUMNS",
    "limbs_to_round",
    "pool_round",
    "round_columns",
    "round_limbs",
]

#: The ``vllm`` update's round: integer columns (one entry per position), in the order they
#: travel.
STAT_COLUMNS = ("a", "b", "c", "g0", "g1", "n")
#: The ``map`` update's round: histogram columns (K·B entries, position-major), all unsigned.
HISTOGRAM_COLUMNS = ("count", "accepted", "x_sum")
_UNSIGNED = frozenset({"n", *HISTOGRAM_COLUMNS})
#: Every statistic is sent as ``NUM_LIMBS`` limbs of ``LIMB_BITS`` bits (its value modulo
#: ``2**128``, the core's ``i128``), one int64 each: the sum of a limb over fewer than ``2**31``
#: ranks cannot overflow, so the all-reduce is an exact integer sum.
LIMB_BITS = 32
NUM_LIMBS = 4
_WIDTH = LIMB_BITS * NUM_LIMBS
_MODULUS = 1 << _WIDTH
_LIMB_MASK = (1 << LIMB_BITS) - 1


def round_columns(round_stats: Mapping[str, Any]) -> tuple[str, ...]:
    """The integer columns of a round (``state_dict()["round_stats"]``): :data:`STAT_COLUMNS`
    for the ``vllm`` update, :data:`HISTOGRAM_COLUMNS` for ``map``."""
    return HISTOGRAM_COLUMNS if "count" in round_stats else STAT_COLUMNS


def round_limbs(round_stats: Mapping[str, Any]) -> npt.NDArray[np.int64]:
    """The round's statistics (``state_dict()["round_stats"]``) as ``[columns, entries,
    NUM_LIMBS]`` int64 limbs (``[6, K, 4]`` for ``vllm``, ``[3, K·B, 4]`` for ``map``), least
    significant first, of each value modulo ``2**128``."""
    names = round_columns(round_stats)
    columns = [[int(v) for v in round_stats[name]] for name in names]
    k = len(columns[0])
    if any(len(column) != k for column in columns):
        raise InvalidValueError("round_stats columns must all have one entry per position (or bin)")
    out = np.empty((len(names), k, NUM_LIMBS), dtype=np.int64)
    for row, column in enumerate(columns):
        for position, value in enumerate(column):
            wrapped = value % _MODULUS
            for limb in range(NUM_LIMBS):
                out[row, position, limb] = (wrapped >> (limb * LIMB_BITS)) & _LIMB_MASK
    return out


def limbs_to_round(
    limbs: npt.ArrayLike, fraction_bits: int, columns: tuple[str, ...] = STAT_COLUMNS
) -> dict[str, Any]:
    """Inverse of :func:`round_limbs` after a sum: each value is ``sum(limb_i * 2**(32 i))``
    modulo ``2**128``, read as a signed 128-bit integer (counts and histogram columns as
    non-negative). ``columns``: the round's columns (:func:`round_columns`)."""
    array = np.asarray(limbs, dtype=np.int64)
    if array.ndim != 3 or array.shape[0] != len(columns) or array.shape[2] != NUM_LIMBS:
        raise InvalidValueError(
            f"limbs must have shape [{len(columns)}, K, {NUM_LIMBS}], got {array.shape}"
        )
    out: dict[str, Any] = {"fraction_bits": int(fraction_bits)}
    for row, name in enumerate(columns):
        values = []
        for position in range(array.shape[1]):
            total = sum(int(limb) << (i * LIMB_BITS) for i, limb in enumerate(array[row, position]))
            total %= _MODULUS
            if name not in _UNSIGNED and total >= _MODULUS // 2:
                total -= _MODULUS
            values.append(total)
        out[name] = values
    return out


def _reduce(tensor: Any, group: Any, op: Any) -> Any:
    """All-reduce ``tensor`` (int64, host) over ``group``; back on the host."""
    import torch
    import torch.distributed as dist

    backend = str(dist.get_backend(group)).lower()
    on_device = "nccl" in backend
    work = tensor.to(torch.device("cuda", torch.cuda.current_device())) if on_device else tensor
    dist.all_reduce(work, op=op, group=group)
    return work.cpu() if on_device else work


def pool_round(estimator: AcceptanceEstimator, group: Any = None) -> dict[str, Any]:
    """Sums ``estimator``'s open round over the ranks of ``group`` (a ``torch.distributed``
    process group; ``None``: the default group) and leaves the pooled round open in it, so that
    the next ``estimator.refit()`` fits the pooled round. Returns the pooled round's statistics
    (as in ``state_dict()["round_stats"]``).

    A collective: every rank of ``group`` calls it at the same point (see the module doc). First
    the ranks check that they agree on the round's layout: positions, fixed-point format,
    histogram bins and so the size of what is summed (a rank that differs makes every rank raise
    ``ValueError`` naming the difference, and nothing is added anywhere);
    then one all-reduce of exact integers. Observations another thread adds during the call
    stay in this rank's round only.
    """
    if not isinstance(estimator, AcceptanceEstimator):
        raise InvalidTypeError(
            f"estimator must be an av_core.AcceptanceEstimator, got {type(estimator).__name__} "
            "(av_core.vllm.OnlineAcceptanceEstimator pools itself: pass process_group=)"
        )
    try:
        import torch
        import torch.distributed as dist
    except ImportError as error:  # pragma: no cover - exercised only without torch
        raise ImportError(
            "av_core.distributed needs PyTorch, an optional dependency: "
            'pip install "av_core[torch]"'
        ) from error
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("pool_round needs torch.distributed to be initialized")

    local: Mapping[str, Any] = estimator.state_dict()["round_stats"]
    columns = round_columns(local)
    bits, k = int(local["fraction_bits"]), estimator.num_positions
    bins = int(local.get("bins", 0))  # 0: the vllm update's moments
    limbs = round_limbs(local)
    # Everything that shapes the all-reduce below, compared as a whole: tensors of different
    # sizes in one gloo all-reduce abort the process instead of raising.
    layout = {
        "positions": k,
        "fraction bits": bits,
        "histogram bins": bins,
        "columns": limbs.shape[0],
        "entries": limbs.shape[1],
    }
    header = torch.tensor([v for value in layout.values() for v in (value, -value)])
    header = _reduce(header.to(torch.int64), group, dist.ReduceOp.MAX).tolist()
    ranges = {name: (-header[2 * i + 1], header[2 * i]) for i, name in enumerate(layout)}
    if any(low != high for low, high in ranges.values()):
        spans = ", ".join(f"{name} {low}..{high}" for name, (low, high) in ranges.items())
        mine = ", ".join(f"{value} {name}" for name, value in layout.items())
        raise InvalidValueError(
            f"estimator: the ranks of the group disagree on the round's layout ({spans}; this "
            f"rank has {mine}; histogram bins are 0 for the vllm update)"
        )
    summed = _reduce(torch.from_numpy(limbs), group, dist.ReduceOp.SUM)
    pooled = limbs_to_round(summed.numpy(), bits, columns)
    others: dict[str, Any] = {"fraction_bits": bits}
    if "bins" in local:
        others["bins"] = pooled["bins"] = bins
    for name in columns:
        pairs = zip(pooled[name], local[name], strict=True)
        others[name] = [int(total) - int(mine) for total, mine in pairs]
    estimator.add_round_stats(others)
    return pooled
