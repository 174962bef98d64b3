"""Serving simulation: adaptive verification against fixed draft lengths (``av-core simulate``).

R concurrent requests each replay a stream of drafting rounds taken from a labeled trace. Every
decode step, each request brings one round (K drafts with their features and, from the trace,
the number of leading drafts the target accepts under full verification). A policy decides how
many drafts of each request are verified; a request then emits ``min(accepted under full
verification, verified) + 1`` tokens (the accepted drafts plus the target's correction or bonus
token), and the step costs ``draft + verify`` milliseconds from cost tables.

Policies: fixed K = k (every request drafts and verifies ``min(k, K)`` drafts; k = 0 is no
speculation); adaptive verification (AV): the online estimator predicts, the
:class:`~av_core.VerificationPlanner` sizes the budget from the previous step's confidences and
assigns it with the current ones, and the estimator observes the verdicts of what was admitted,
so trimming shapes the labels it learns from, as in serving; and AV with drafting-depth control
(``AV+D``: one depth for the batch, ``AV+Dr``: a depth per request), where the planner first
decides how far to draft (``choose_draft_depth``, from the remembered confidences) and only the
drafted positions are paid for and planned. With ``peers``, the other engines' policies on the
same rounds and costs (SGLang's EMA tiers, TensorRT-LLM's ``draft_len_schedule``, vLLM's adaptive
verification; :mod:`av_core.tools.peers`) and the hindsight oracle every policy is bounded by
(:func:`simulate_oracle`). The model is documented in ``docs/simulate.md``.

:func:`simulate_run` replays one finite run instead (R requests with a token budget, the policy
objects of :mod:`av_core.llama_cpp.policies`, each step priced by its shape): the prediction
``av-core bench-engine`` sets beside each measured run.

One module per concern: :mod:`~av_core.tools.simulate.costs` (cost models),
:mod:`~av_core.tools.simulate.policies` (round streams and the policies),
:mod:`~av_core.tools.simulate.oracle` (the hindsight bound), :mod:`~av_core.tools.simulate.replay`
(:func:`simulate_trace`) and :mod:`~av_core.tools.simulate.report` (tables and formats).
"""

from av_core.tools.simulate.costs import (
    MAX_COST_MS,
    CostModel,
    DrafterKind,
    GpuLikeCost,
    MeasuredCost,
    PassTokens,
    cost_tables_for,
    draft_cost_ms,
    step_draft_cost_ms,
)
from av_core.tools.simulate.oracle import (
    ORACLE,
    simulate_oracle,
)
from av_core.tools.simulate.policies import (
    ADAPTIVE_POLICIES,
    MAX_STREAM_ENTRIES,
    PEER_POLICIES,
    AdaptiveTrace,
    DepthControl,
    PolicyResult,
    RoundStreams,
    round_streams,
    simulate_adaptive,
    simulate_fixed,
    simulate_sglang_ema,
    simulate_trt_schedule,
)
from av_core.tools.simulate.replay import (
    DEFAULT_CONCURRENCY,
    parse_concurrency,
    simulate_trace,
)
from av_core.tools.simulate.report import (
    PEERS_TITLE,
    PeerRow,
    Simulation,
    format_markdown,
    format_peers,
    format_peers_markdown,
    format_simulation,
    peer_rows,
    peers_table,
    simulation_preamble,
    simulation_tables,
    simulation_to_dict,
)
from av_core.tools.simulate.run import RunReplay, StepShape, simulate_run

__all__ = [
    "ADAPTIVE_POLICIES",
    "ORACLE",
    "PEER_POLICIES",
    "PEERS_TITLE",
    "PeerRow",
    "DEFAULT_CONCURRENCY",
    "MAX_COST_MS",
    "MAX_STREAM_ENTRIES",
    "DepthControl",
    "AdaptiveTrace",
    "CostModel",
    "DrafterKind",
    "PassTokens",
    "GpuLikeCost",
    "MeasuredCost",
    "PolicyResult",
    "RoundStreams",
    "RunReplay",
    "Simulation",
    "StepShape",
    "cost_tables_for",
    "draft_cost_ms",
    "format_markdown",
    "format_peers",
    "format_peers_markdown",
    "format_simulation",
    "parse_concurrency",
    "peer_rows",
    "peers_table",
    "round_streams",
    "simulate_adaptive",
    "simulate_fixed",
    "simulate_oracle",
    "simulate_run",
    "simulate_sglang_ema",
    "simulate_trace",
    "simulate_trt_schedule",
    "simulation_preamble",
    "simulation_tables",
    "simulation_to_dict",
    "step_draft_cost_ms",
]
