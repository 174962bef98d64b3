"""The ``av-core`` command line (also ``python -m av_core``)."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from av_core import __version__
from av_core.evaluate import DEFAULT_REFIT_INTERVAL
from av_core.profile import DEFAULT_TOKENS
from av_core.simulate import DEFAULT_CONCURRENCY, GpuLikeCost

if TYPE_CHECKING:
    from av_core.simulate import CostModel, DepthControl
    from av_core.trace import DraftTrace


def _load_trace(path: str) -> DraftTrace:
    from av_core.trace import read_trace

    return read_trace(path)


def _write_plots(make: Callable[[Path], list[Path]], out: Path, enabled: bool) -> None:
    from av_core.plots import plots_available

    if not enabled:
        return
    if not plots_available():
        print("plots skipped: matplotlib is not installed (pip install 'av_core[plot]')")
        return
    for path in make(out):
        print(f"wrote {path}")


def _evaluate(args: argparse.Namespace) -> int:
    """Prequential feature comparison and per-workload fits on a labeled trace."""
    from av_core.evaluate import evaluate_trace

    evaluation = evaluate_trace(
        _load_trace(args.trace),
        refit_interval=args.refit_interval,
        batch_rounds=args.batch_rounds,
        memory=args.memory,
        groups_per_workload=args.groups_per_workload,
    )
    print(evaluation.to_text())
    out = Path(args.out)

    def make(directory: Path) -> list[Path]:
        from av_core.plots import evaluation_plots

        return evaluation_plots(evaluation, directory)

    _write_plots(make, out, not args.no_plots)
    return 0


def _cost_model(args: argparse.Namespace) -> CostModel:
    from av_core.simulate import GpuLikeCost, MeasuredCost

    spec = list(args.cost_model)
    if spec == ["gpu-like"]:
        return GpuLikeCost(
            verify_base_ms=args.verify_base_ms,
            verify_knee=args.verify_knee,
            verify_per_token_ms=args.verify_per_token_ms,
            draft_base_ms=args.draft_base_ms,
            draft_knee=args.draft_knee,
            draft_per_token_ms=args.draft_per_token_ms,
        )
    if len(spec) == 2 and spec[0] == "measured":
        return MeasuredCost.load(spec[1])
    raise SystemExit(
        f"--cost-model must be 'gpu-like' or 'measured FILE' (TRACE goes first), "
        f"got {' '.join(spec)!r}"
    )


def _depth_modes(text: str) -> tuple[DepthControl, ...]:
    """``"batch,per_request"`` → the depth-control policies to simulate (``none``: no extra)."""
    modes: list[DepthControl] = []
    for part in (p.strip() for p in text.split(",")):
        if part == "none":
            continue
        if part not in ("batch", "per_request"):
            raise SystemExit(
                f"av-core simulate: --depth-control takes batch, per_request or none, got {part!r}"
            )
        modes.append(part)  # type: ignore[arg-type]
    return tuple(modes)


def _trt_schedule(text: str | None) -> dict[int, int] | None:
    """``--trt-schedule 4:4,8:2,32:1`` → TensorRT-LLM's batch size → draft length schedule."""
    if text is None:
        return None
    from av_core.peers import parse_trt_schedule

    try:
        return parse_trt_schedule(text)
    except ValueError as error:
        raise SystemExit(f"av-core simulate: --trt-schedule: {error}") from None


def _simulate(args: argparse.Namespace) -> int:
    """Serving simulation: adaptive verification against fixed K at several concurrencies."""
    from av_core.simulate import parse_concurrency, simulate_trace

    simulation = simulate_trace(
        _load_trace(args.trace),
        cost=_cost_model(args),
        drafter=args.drafter,
        concurrency=parse_concurrency(args.concurrency),
        steps=args.steps,
        warmup_steps=args.warmup_steps,
        refit_interval=args.refit_interval,
        seed=args.seed,
        parallel_pass_tokens=args.parallel_pass_tokens,
        exploration=args.exploration,
        depth_control=_depth_modes(args.depth_control),
        memory=args.memory,
        peers=args.peers,
        trt_schedule=_trt_schedule(args.trt_schedule),
    )
    print(simulation.to_text())
    if args.markdown:
        from av_core.simulate import format_markdown, format_peers_markdown

        print()
        print(format_markdown(simulation))
        if args.peers:
            print()
            print(format_peers_markdown(simulation))

    def make(directory: Path) -> list[Path]:
        from av_core.plots import simulation_plots

        return simulation_plots(simulation, directory, f"_{args.drafter}")

    _write_plots(make, Path(args.out), not args.no_plots)
    return 0


def _profile(args: argparse.Namespace) -> int:
    """Measures forward times of a target (and a drafter) into a cost file."""
    from av_core.profile import (
        format_points,
        measure_forward_ms,
        model_drafting_forward,
        model_forward,
        write_cost_file,
    )
    from av_core.simulate import parse_concurrency

    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    tokens = parse_concurrency(args.tokens)
    verify = measure_forward_ms(
        model_forward(args.target, device=args.device, context=args.context),
        tokens,
        repeats=args.repeats,
    )
    print(format_points("target", verify))
    draft = None
    draft_depth = None
    if args.drafter is not None:
        draft = measure_forward_ms(
            model_forward(args.drafter, device=args.device, context=args.context),
            tokens,
            repeats=args.repeats,
        )
        print(format_points("drafter", draft))
        depths = parse_concurrency(args.draft_depths) if args.draft_depths else []
        if depths:
            draft_depth = measure_forward_ms(
                model_drafting_forward(args.drafter, device=args.device, context=args.context),
                depths,
                repeats=args.repeats,
            )
            print(format_points("drafting by depth", draft_depth))
    write_cost_file(
        args.output,
        verify,
        draft,
        draft_depth,
        target=str(args.target),
        drafter=None if args.drafter is None else str(args.drafter),
        device=args.device,
        context=args.context,
        repeats=args.repeats,
    )
    print(f"wrote {args.output}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    """Evaluate and simulate on the trace shipped with the package; plots in ./av_core_demo/."""
    from av_core.evaluate import ONLINE, RAW, evaluate_trace
    from av_core.simulate import simulate_trace
    from av_core.trace import load_shipped_trace

    try:
        trace = load_shipped_trace() if args.trace is None else _load_trace(args.trace)
    except FileNotFoundError as error:
        raise SystemExit(f"av-core demo: the shipped trace is missing ({error})") from None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print("== av-core evaluate (prequential replay of the online estimator) ==")
    evaluation = evaluate_trace(trace)
    print(evaluation.to_text())
    (out / "evaluate.txt").write_text(evaluation.to_text() + "\n")
    simulations = {}
    for drafter in ("parallel", "autoregressive"):
        print(f"\n== av-core simulate --drafter {drafter} (gpu-like cost model) ==")
        simulation = simulate_trace(trace, drafter=drafter, steps=args.steps)
        simulations[drafter] = simulation
        print(simulation.to_text())
        (out / f"simulate_{drafter}.txt").write_text(simulation.to_text() + "\n")

    def make(directory: Path) -> list[Path]:
        from av_core.plots import evaluation_plots, simulation_plots

        paths = evaluation_plots(evaluation, directory)
        for drafter, simulation in simulations.items():
            paths += simulation_plots(simulation, directory, f"_{drafter}")
        return paths

    print()
    _write_plots(make, out, True)
    online = evaluation.feature(ONLINE).report.overall
    raw = evaluation.feature(RAW).report.overall
    print()
    print(
        f"estimator: online logit(q_max) ECE {online.ece:.4f} vs raw q_max {raw.ece:.4f}, "
        f"log-loss {online.log_loss:.4f} vs {raw.log_loss:.4f} "
        f"({evaluation.num_labeled} labeled drafts, scored at draft time)"
    )
    for drafter, simulation in simulations.items():
        ratios = {
            c: simulation.adaptive(c).throughput / simulation.best_fixed(c).throughput
            for c in simulation.results
        }
        worst = min(ratios, key=lambda c: ratios[c])
        best = max(ratios, key=lambda c: ratios[c])
        depth = {
            c: simulation.adaptive(c, "AV+D").throughput
            / simulation.best_fixed(c, min_k=0).throughput
            for c in simulation.results
        }
        lowest = min(depth, key=lambda c: depth[c])
        print(
            f"simulated, {drafter} drafter (gpu-like cost model, not measured): AV vs best "
            f"fixed K>=1 from {ratios[worst] - 1:+.1%} (R={worst}) to "
            f"{ratios[best] - 1:+.1%} (R={best}); with drafting-depth control, worst case "
            f"{depth[lowest] - 1:+.1%} (R={lowest}) against the best fixed K including none"
            + (f"; plots and tables in {out}/" if drafter == "autoregressive" else "")
        )
    return 0


def _collect(args: argparse.Namespace) -> int:
    """Collects a real trace (imports torch and transformers only when asked to)."""
    from av_core.collect import CollectConfig, collect

    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    config = CollectConfig(
        num_drafts=args.k,
        temperature=args.temperature,
        top_p=args.top_p,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
    )
    summary = collect(
        args.target,
        args.drafter,
        args.prompts,
        args.output,
        config,
        device=args.device,
        progress=not args.no_progress,
        max_prompts=args.max_prompts,
    )
    rate = summary.accepted_added / summary.labeled_added if summary.labeled_added else math.nan
    print(
        f"{summary.output}: {summary.prompts_done} prompts collected, "
        f"{summary.prompts_skipped} already present; {summary.rows_added} rows, "
        f"{summary.labeled_added} labeled drafts, acceptance rate {rate:.3f}"
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="av-core",
        description="Adaptive verification for speculative decoding: estimator and planner.",
    )
    parser.add_argument("--version", action="version", version=f"av_core {__version__}")
    commands = parser.add_subparsers(dest="command")
    demo = commands.add_parser(
        "demo",
        help="evaluate and simulate on the real trace shipped with av_core",
        description="Runs evaluate and simulate (parallel and autoregressive drafters, gpu-like "
        "cost model) on the trace shipped inside the package; writes tables and plots to "
        "./av_core_demo/ and ends with a three-line summary.",
    )
    demo.add_argument("--trace", default=None, help=argparse.SUPPRESS)
    demo.add_argument("--out", default="av_core_demo", help=argparse.SUPPRESS)
    demo.add_argument("--steps", type=int, default=1000, help=argparse.SUPPRESS)
    demo.set_defaults(handler=_demo)

    evaluate = commands.add_parser(
        "evaluate",
        help="prequential evaluation of the online estimator and the candidate features",
        description="Replays the online estimator over TRACE in decode order, scoring every "
        "draft with the prediction made at draft time; compares features; fits each workload "
        "(docs/evaluate.md).",
    )
    evaluate.add_argument("trace", help="labeled trace (.csv, .csv.gz, .parquet)")
    evaluate.add_argument(
        "--refit-interval",
        type=int,
        default=DEFAULT_REFIT_INTERVAL,
        help=f"observes between refits (default {DEFAULT_REFIT_INTERVAL})",
    )
    evaluate.add_argument(
        "--batch-rounds",
        type=int,
        default=1,
        help="consecutive drafting rounds per observe, i.e. requests per decode step (default 1)",
    )
    evaluate.add_argument(
        "--memory",
        type=float,
        default=None,
        help="estimator memory across rounds, gamma in [0, 1) (default: the estimator's; 0 is "
        "vLLM's memoryless update)",
    )
    evaluate.add_argument(
        "--groups-per-workload",
        type=int,
        default=4,
        help="prompt groups per workload for the intercept/entropy correlation (default 4)",
    )
    evaluate.add_argument("--out", default="av_core_evaluate", help="folder for the PNG plots")
    evaluate.add_argument("--no-plots", action="store_true", help="tables only")
    evaluate.set_defaults(handler=_evaluate)

    gpu = GpuLikeCost()
    simulate = commands.add_parser(
        "simulate",
        help="serving simulation: adaptive verification against fixed K",
        description="Replays TRACE's drafting rounds for R concurrent requests and compares "
        "adaptive verification with fixed K = 0..K at every concurrency (docs/simulate.md). "
        "The gpu-like cost model: ms(t) = base + max(0, t - knee) * per_token.",
    )
    simulate.add_argument("trace", help="labeled trace (.csv, .csv.gz, .parquet)")
    simulate.add_argument(
        "--cost-model",
        nargs="+",
        default=["gpu-like"],
        metavar="MODEL",
        help="'gpu-like' (default) or 'measured FILE' (a file from av-core profile)",
    )
    simulate.add_argument(
        "--concurrency",
        default=",".join(str(c) for c in DEFAULT_CONCURRENCY),
        help="comma-separated request counts, or LOW-HIGH for powers of two (default 1..512)",
    )
    simulate.add_argument(
        "--drafter",
        choices=("parallel", "autoregressive"),
        default="parallel",
        help="how drafting is charged (default parallel)",
    )
    simulate.add_argument(
        "--parallel-pass-tokens",
        choices=("requests", "drafts"),
        default="requests",
        help="a parallel pass is charged at R tokens (default) or at the R*K drafted tokens",
    )
    simulate.add_argument("--steps", type=int, default=1000, help="measured decode steps")
    simulate.add_argument("--warmup-steps", type=int, default=200, help="unmeasured warm-up")
    simulate.add_argument(
        "--refit-interval", type=int, default=100, help="estimator refit interval"
    )
    simulate.add_argument("--seed", type=int, default=0)
    simulate.add_argument(
        "--exploration",
        type=float,
        default=None,
        help="planner exploration floor (default: the planner's own default)",
    )
    simulate.add_argument(
        "--memory",
        type=float,
        default=None,
        help="estimator memory across rounds, gamma in [0, 1) (default: the estimator's)",
    )
    simulate.add_argument(
        "--depth-control",
        default="batch,per_request",
        help="drafting-depth policies to add beside AV: comma-separated batch, per_request, or "
        "none (default batch,per_request)",
    )
    for name, value in (
        ("verify-base-ms", gpu.verify_base_ms),
        ("verify-knee", gpu.verify_knee),
        ("verify-per-token-ms", gpu.verify_per_token_ms),
        ("draft-base-ms", gpu.draft_base_ms),
        ("draft-knee", gpu.draft_knee),
        ("draft-per-token-ms", gpu.draft_per_token_ms),
    ):
        simulate.add_argument(
            f"--{name}", type=type(value), default=value, help=f"gpu-like (default {value})"
        )
    simulate.add_argument("--out", default="av_core_simulate", help="folder for the PNG plot")
    simulate.add_argument("--no-plots", action="store_true", help="tables only")
    simulate.add_argument(
        "--markdown", action="store_true", help="also print the summary as a Markdown table"
    )
    simulate.add_argument(
        "--peers",
        action="store_true",
        help="also run the other engines' policies (SGLang's EMA tiers, TensorRT-LLM's "
        "draft_len_schedule, vLLM's adaptive verification) and the hindsight oracle",
    )
    simulate.add_argument(
        "--trt-schedule",
        default=None,
        metavar="BATCH:LEN,...",
        help="with --peers: TensorRT-LLM's draft_len_schedule, batch-size threshold : draft "
        "length (default 4:4,8:2,32:1; larger batches do not speculate)",
    )
    simulate.set_defaults(handler=_simulate)

    profile = commands.add_parser(
        "profile",
        help="measure a model's forward time at a grid of token counts into a cost file",
        description="Times a target (and optionally a drafter) appending t tokens to a KV cache "
        "of --context tokens; writes JSON for 'av-core simulate --cost-model measured FILE' "
        "(needs av_core[collect]).",
    )
    profile.add_argument("--target", required=True, help="target model directory or .gguf file")
    profile.add_argument("--drafter", default=None, help="drafter model directory or .gguf file")
    profile.add_argument("--output", required=True, help="cost file to write (.json)")
    profile.add_argument(
        "--tokens",
        default=",".join(str(t) for t in DEFAULT_TOKENS),
        help="comma-separated token counts, or LOW-HIGH for powers of two",
    )
    profile.add_argument("--context", type=int, default=128, help="tokens already in the cache")
    profile.add_argument(
        "--draft-depths",
        default="1,2,3,4",
        help="with --drafter: drafting depths to time (d sequential one-token drafter passes), "
        "the draft-cost-by-depth profile; empty to skip (default 1,2,3,4)",
    )
    profile.add_argument("--repeats", type=int, default=5, help="timed runs per size (median)")
    profile.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    profile.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    profile.set_defaults(handler=_profile)

    collect = commands.add_parser(
        "collect",
        help="collect a labeled draft trace by speculative sampling with two causal LMs",
        description="Real speculative sampling between a target and a drafter that share a "
        "tokenizer (model directories or GGUF files; needs av_core[collect]). Full "
        "verification: every draft up to the first rejection is labeled. Resumable: prompts "
        "already in the output are skipped.",
    )
    collect.add_argument("--target", required=True, help="target model directory or .gguf file")
    collect.add_argument("--drafter", required=True, help="drafter model directory or .gguf file")
    collect.add_argument("--prompts", required=True, help="JSONL prompts file (docs/collect.md)")
    collect.add_argument("--output", required=True, help="trace to append to (.csv or .csv.gz)")
    collect.add_argument("--k", type=int, default=4, help="drafts per step (default 4)")
    collect.add_argument("--temperature", type=float, default=1.0)
    collect.add_argument("--top-p", type=float, default=1.0)
    collect.add_argument("--max-new-tokens", type=int, default=128)
    collect.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    collect.add_argument("--seed", type=int, default=0)
    collect.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    collect.add_argument("--max-prompts", type=int, default=None, help="stop after N prompts")
    collect.add_argument("--no-progress", action="store_true", help="no progress line")
    collect.set_defaults(handler=_collect)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    result: int = args.handler(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
