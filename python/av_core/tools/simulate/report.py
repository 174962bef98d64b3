"""The results of a simulation (:class:`Simulation`) and how they are shown: text, Markdown and JSON
tables, the peers' comparison.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from av_core._native import InvalidValueError
from av_core.tools.simulate.costs import DrafterKind
from av_core.tools.simulate.oracle import ORACLE
from av_core.tools.simulate.policies import PEER_POLICIES, PolicyResult
from av_core.tools.tables import Table, col, fixed, general, render


@dataclass(frozen=True)
class Simulation:
    """Results of every policy at every concurrency."""

    cost_description: str
    drafter: DrafterKind
    num_positions: int
    steps: int
    warmup_steps: int
    num_rounds: int
    results: dict[int, list[PolicyResult]]  # concurrency -> [K=0, ..., K=Kmax, AV, AV+D, ...]

    def best_fixed(self, concurrency: int, min_k: int = 1) -> PolicyResult:
        fixed = [
            r
            for r in self.results[concurrency]
            if r.policy.startswith("K=") and int(r.policy[2:]) >= min_k
        ]
        return max(fixed, key=lambda r: r.throughput)

    def adaptive(self, concurrency: int, policy: str = "AV") -> PolicyResult:
        return next(r for r in self.results[concurrency] if r.policy == policy)

    @property
    def adaptive_policies(self) -> list[str]:
        """The adaptive policies simulated, in column order (``AV`` first)."""
        first = next(iter(self.results.values()))
        return [r.policy for r in first if r.policy.startswith("AV")]

    def result(self, concurrency: int, policy: str) -> PolicyResult:
        """The result of ``policy`` (any name in the row) at ``concurrency``."""
        return next(r for r in self.results[concurrency] if r.policy == policy)

    @property
    def has_peers(self) -> bool:
        """Whether the peers' policies and the oracle were simulated (``peers=True``)."""
        first = next(iter(self.results.values()))
        return any(r.policy.startswith(ORACLE) for r in first)

    def to_text(self) -> str:
        text = format_simulation(self)
        return text + "\n\n" + format_peers(self) if self.has_peers else text

    def tables(self) -> list[Table]:
        """Every table of :meth:`to_text` (titled), for Markdown or JSON output."""
        return simulation_tables(self)


def simulation_preamble(simulation: Simulation) -> list[str]:
    """The lines above the tables: drafter, K, steps and the cost model."""
    s = simulation
    return [
        f"simulation: {s.drafter} drafter, K = {s.num_positions}, {s.steps} measured steps "
        f"after {s.warmup_steps} warm-up steps, rounds replayed from {s.num_rounds} trace rounds",
        f"cost model: {s.cost_description}",
    ]


def simulation_tables(simulation: Simulation) -> list[Table]:
    """The tables of :func:`format_simulation` (and of ``--markdown`` and ``--json``)."""
    s = simulation
    first = next(iter(s.results.values()))
    names = [r.policy for r in first]
    adaptive = s.adaptive_policies

    throughput = Table(
        "output tokens per ms (all requests)",
        [col("R"), *(col(n, general(4)) for n in names)],
    )
    for concurrency in s.results:
        throughput.add(concurrency, *(s.result(concurrency, n).throughput for n in names))
    throughput.notes.append(
        "K=k: every request drafts and verifies k drafts (K=0: no speculation). AV: adaptive "
        "verification; AV+D: with one drafting depth for the batch; AV+Dr: with a depth per "
        "request."
    )

    ratios = Table(
        "adaptive policies against the best fixed K",
        [
            col("R"),
            col("best K>=1", align="<"),
            col("best K>=0", align="<"),
            *(col(f"{a}/best", fixed(3)) for a in adaptive),
            *(col(f"{a}/max", fixed(3)) for a in adaptive),
        ],
    )
    for concurrency in s.results:
        best = s.best_fixed(concurrency)
        best_all = s.best_fixed(concurrency, min_k=0)
        ratios.add(
            concurrency,
            best.policy,
            best_all.policy,
            *(s.adaptive(concurrency, a).throughput / best.throughput for a in adaptive),
            *(s.adaptive(concurrency, a).throughput / best_all.throughput for a in adaptive),
        )
    ratios.notes.append(
        "X/best: X's throughput over the best fixed K >= 1 at that concurrency; X/max: over the "
        "best of every fixed K including K = 0 (no speculation)."
    )

    interactivity = Table(
        "per-request output tokens per ms (interactivity)",
        [col("R"), *(col(n, general(3)) for n in names)],
    )
    for concurrency in s.results:
        interactivity.add(concurrency, *(s.result(concurrency, n).per_request for n in names))

    work = Table(
        "drafting and verification of the adaptive policies",
        [
            col("R"),
            *(
                column
                for a in adaptive
                for column in (
                    col(f"{a} drafted/req", fixed(3)),
                    col(f"{a} verified/drafted", fixed(3)),
                )
            ),
        ],
    )
    for concurrency in s.results:
        cells: list[float] = []
        for a in adaptive:
            r = s.adaptive(concurrency, a)
            share = r.verified_drafts / r.drafted if r.drafted else math.nan
            cells += [r.drafted / (r.steps * concurrency), share]
        work.add(concurrency, *cells)
    work.notes.append(
        "drafted/req: drafts per request per step; verified/drafted: the share of drafted "
        "positions sent to verification (n/a: nothing drafted)."
    )
    tables = [throughput, ratios, interactivity, work]
    if s.has_peers:
        tables.append(peers_table(s))
    return tables


def format_simulation(simulation: Simulation) -> str:
    """Throughput (tokens/ms) and per-request tokens/ms per policy and concurrency, each
    adaptive policy against the best fixed K >= 1 and against the best of everything fixed
    (no speculation included), and what the adaptive policies drafted and verified; each table
    titled, columns two spaces apart."""
    tables = [t for t in simulation_tables(simulation) if t.title != PEERS_TITLE]
    return render(tables, "text", simulation_preamble(simulation))


def simulation_to_dict(simulation: Simulation) -> dict[str, object]:
    """Everything ``av-core simulate --json`` prints: settings, raw results and the tables."""
    s = simulation
    return {
        "drafter": s.drafter,
        "num_positions": s.num_positions,
        "steps": s.steps,
        "warmup_steps": s.warmup_steps,
        "num_rounds": s.num_rounds,
        "cost_model": s.cost_description,
        "results": [
            {
                "concurrency": concurrency,
                "policy": r.policy,
                "throughput_tokens_per_ms": r.throughput,
                "per_request_tokens_per_ms": r.per_request,
                "tokens": r.tokens,
                "time_ms": r.time_ms,
                "drafted": r.drafted,
                "verified_drafts": r.verified_drafts,
                "steps": r.steps,
            }
            for concurrency, row in s.results.items()
            for r in row
        ],
        "tables": [t.to_dict() for t in simulation_tables(s)],
    }


def _oracle(simulation: Simulation, concurrency: int) -> PolicyResult:
    return next(r for r in simulation.results[concurrency] if r.policy.startswith(ORACLE))


def _av_core(simulation: Simulation) -> str:
    """The av_core policy the peers are compared with: AV+D when simulated, else AV."""
    return "AV+D" if "AV+D" in simulation.adaptive_policies else "AV"


@dataclass(frozen=True)
class PeerRow:
    """One concurrency of the peers' comparison: throughputs relative to the best fixed K
    (no speculation included)."""

    concurrency: int
    best_fixed: PolicyResult
    relative: dict[str, float]  # policy -> throughput / best fixed K (K = 0 included)
    av_core: str
    oracle: str

    @property
    def av_core_of_oracle(self) -> float:
        return self.relative[self.av_core] / self.relative[self.oracle]

    @property
    def av_core_of_best_other(self) -> float:
        """av_core against the best of the peers' policies and fixed K (the oracle, and av_core's
        own policies, excluded)."""
        others = [v for k, v in self.relative.items() if k not in (self.av_core, self.oracle)]
        return self.relative[self.av_core] / max([1.0, *others])


def peer_rows(simulation: Simulation) -> list[PeerRow]:
    """The comparison of ``format_peers``, per concurrency (needs ``peers=True``)."""
    if not simulation.has_peers:
        raise InvalidValueError("simulation has no peers' policies: run simulate_trace(peers=True)")
    av_core = _av_core(simulation)
    rows = []
    for concurrency in simulation.results:
        best = simulation.best_fixed(concurrency, min_k=0)
        oracle = _oracle(simulation, concurrency)
        names = [*PEER_POLICIES, av_core, oracle.policy]
        relative = {
            name: simulation.result(concurrency, name).throughput / best.throughput
            for name in names
        }
        rows.append(PeerRow(concurrency, best, relative, av_core, oracle.policy))
    return rows


PEERS_TITLE = "peers: throughput over the best fixed K (K = 0 included), same rounds and costs"


def peers_table(simulation: Simulation) -> Table:
    """The table of :func:`format_peers`."""
    rows = peer_rows(simulation)
    names = list(rows[0].relative)
    table = Table(
        PEERS_TITLE,
        [
            col("R"),
            col("best fixed", align="<"),
            *(col(n, fixed(3)) for n in names),
            col(f"{rows[0].av_core}/oracle", fixed(3)),
            col(f"{rows[0].av_core}/other", fixed(3)),
        ],
    )
    for row in rows:
        table.add(
            row.concurrency,
            f"{row.best_fixed.throughput:.4g} ({row.best_fixed.policy})",
            *(row.relative[n] for n in names),
            row.av_core_of_oracle,
            row.av_core_of_best_other,
        )
    table.notes.append(
        "SGL-EMA: SGLang's EMA tiers (default configuration, steps above K clipped to K); TRT: "
        "TensorRT-LLM's draft_len_schedule; vLLM-AV: adaptive verification with vLLM's "
        "memoryless update and no exploration floor; oracle: the hindsight bound (verifies only "
        "accepted drafts, the best number per step). X/other: against the best policy but the "
        "oracle, fixed K included."
    )
    return table


def format_peers(simulation: Simulation) -> str:
    """The peers' policies, av_core's and the oracle, each over the best fixed K (no
    speculation included), av_core's fraction of the oracle and av_core over the best other."""
    return peers_table(simulation).to_text()


def format_peers_markdown(simulation: Simulation, label: str = "") -> str:
    """:func:`format_peers` as Markdown rows (``label`` fills a leading column when given)."""
    rows = peer_rows(simulation)
    av_core = rows[0].av_core
    lead = ["trace / drafter"] if label else []
    head = [
        *lead,
        "R",
        "best fixed K (tok/ms)",
        "SGLang-EMA",
        "TRT schedule",
        "vLLM AV",
        f"av_core ({av_core})",
        "oracle",
        "av_core / oracle",
        "av_core / best other",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [
            *([label] if label else []),
            str(row.concurrency),
            f"{row.best_fixed.throughput:.4g} ({row.best_fixed.policy})",
            *(f"{row.relative[name]:.3f}" for name in (*PEER_POLICIES, av_core, row.oracle)),
            f"{row.av_core_of_oracle:.3f}",
            f"{row.av_core_of_best_other:.3f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_markdown(simulation: Simulation) -> str:
    """A Markdown table per concurrency: no speculation, the best fixed K >= 1, each adaptive
    policy, and each against the best fixed K (K = 0 included), in tokens per ms."""
    s = simulation
    adaptive = s.adaptive_policies
    head = (
        "| R | K=0 | best fixed K≥1 | "
        + " | ".join(adaptive)
        + " | "
        + " | ".join(f"{a} / best fixed (K=0 incl.)" for a in adaptive)
        + " |"
    )
    lines = [head, "|" + "---|" * (3 + 2 * len(adaptive))]
    for concurrency, row in s.results.items():
        best = s.best_fixed(concurrency)
        best_all = s.best_fixed(concurrency, min_k=0)
        cells = [
            str(concurrency),
            f"{row[0].throughput:.4g}",
            f"{best.throughput:.4g} ({best.policy})",
            *(f"{s.adaptive(concurrency, a).throughput:.4g}" for a in adaptive),
            *(
                f"{s.adaptive(concurrency, a).throughput / best_all.throughput:.3f}"
                for a in adaptive
            ),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
