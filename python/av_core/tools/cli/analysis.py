"""The commands that analyse a trace: ``demo``, ``evaluate`` and ``simulate`` (each one's options,
``add_COMMAND``, beside what it runs).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from av_core._native import ESTIMATOR_DEFAULTS
from av_core.tools import argtypes as types
from av_core.tools.cli.common import (
    DEFAULT_TRACE,
    EXIT_OK,
    AddCommand,
    CommandError,
    _add_trace_argument,
    _Console,
    _console,
    _emit_tables,
    _Job,
    _output_options,
    _plots_ready,
    _prepare_out,
    _style,
    _write_plots,
    about,
    load_trace,
    reading,
    trace_arg,
    write_text_file,
)
from av_core.tools.evaluate import DEFAULT_REFIT_INTERVAL
from av_core.tools.simulate import DEFAULT_CONCURRENCY, MAX_COST_MS, GpuLikeCost

if TYPE_CHECKING:
    from av_core.tools.simulate import CostModel, DepthControl

#: The warm-up steps of the demo's simulations (``simulate_trace``'s default).
DEMO_WARMUP_STEPS = 200
#: The drafters the demo simulates, in the order it prints them.
DEMO_DRAFTERS: tuple[Literal["parallel", "autoregressive"], ...] = ("parallel", "autoregressive")
#: Largest ``--concurrency`` value (the simulator holds [steps, R] round indices).
MAX_CONCURRENCY = 65536


def _evaluate(args: argparse.Namespace) -> int:
    """Prequential feature comparison and per-workload fits on a labeled trace."""
    from av_core.tools.evaluate import (
        evaluate_trace,
        evaluation_preamble,
        evaluation_tables,
        evaluation_to_dict,
    )
    from av_core.tools.plots import EVALUATION_PLOTS

    console = _console(args)
    plots = _plots_ready(args, console, EVALUATION_PLOTS)
    trace = load_trace(args.trace)
    with _Job(console, "evaluate", "replay") as job, about(args.trace.label):
        evaluation = evaluate_trace(
            trace,
            refit_interval=args.refit_interval,
            batch_rounds=args.batch_rounds,
            memory=args.memory,
            update=args.update,
            groups_per_workload=args.groups_per_workload,
            progress=job,
        )
    observes = -(-evaluation.num_rounds // args.batch_rounds)
    _warn_without_refits(
        console,
        int(evaluation.trajectory.rounds.shape[0]),
        observes >= args.refit_interval,
        f"--refit-interval {args.refit_interval} x --batch-rounds {args.batch_rounds} rounds "
        f"reaches past the trace's {evaluation.num_rounds} drafting rounds",
        "--refit-interval or --batch-rounds",
    )
    document = {"command": "evaluate", "trace": args.trace.text, **evaluation_to_dict(evaluation)}
    _emit_tables(
        console,
        _style(args),
        evaluation_preamble(evaluation),
        evaluation_tables(evaluation),
        document,
    )
    if plots:
        from av_core.tools.plots import evaluation_plots

        _write_plots(lambda d: evaluation_plots(evaluation, d), Path(args.out), console)
    return EXIT_OK


def _check_simulation_size(
    steps: int, warmup_steps: int, concurrency: int, *, demo: bool = False
) -> None:
    """The simulator's request slots, (warm-up + measured steps) x R, named by their options."""
    from av_core.tools.simulate import MAX_STREAM_ENTRIES

    slots = (steps + warmup_steps) * concurrency
    if slots <= MAX_STREAM_ENTRIES:
        return
    if demo:
        raise CommandError(
            f"--steps {steps}: the demo replays ({steps} + {warmup_steps} warm-up steps) x "
            f"{concurrency} requests = {slots} request-steps, more than {MAX_STREAM_ENTRIES}: "
            "lower --steps"
        )
    raise CommandError(
        f"--steps {steps} + --warmup-steps {warmup_steps} at --concurrency {concurrency} make "
        f"{slots} request-steps to replay, more than {MAX_STREAM_ENTRIES}: lower --steps or "
        "the largest --concurrency"
    )


def _warn_without_refits(
    console: _Console, refits: int, round_ended: bool, what: str, advice: str
) -> None:
    """Warn when no round of the estimator ended: with ``refits == 0`` (vLLM's update) every
    prediction is the cold start; the map update still fits after the 1st, 2nd, 4th, ...
    observes of its first round, but never discounts its memory."""
    if refits == 0:
        console.warn(
            f"the estimator was never refit ({what}): every prediction is the cold start; "
            f"lower {advice}"
        )
    elif not round_ended:
        console.warn(
            f"the estimator never refit at a round's end ({what}): it fitted only after the "
            f"1st, 2nd, 4th, ... observes of its first round; lower {advice}"
        )


def _cost_model(args: argparse.Namespace) -> CostModel:
    """``--cost-model``: checked and (for ``measured FILE``) read before the trace."""
    from av_core.tools.simulate import GpuLikeCost, MeasuredCost

    spec = list(args.cost_model)
    size = {"gpu-like": 1, "measured": 2}.get(spec[0], len(spec))
    if len(spec) == size + 1 and args.trace is DEFAULT_TRACE:
        # `--cost-model gpu-like TRACE`: the option's nargs took the trace; give it back.
        try:
            args.trace = trace_arg(spec.pop())
        except argparse.ArgumentTypeError as error:
            raise CommandError(f"argument TRACE: {error}") from None
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
        try:
            path = types.readable_file(spec[1])
        except argparse.ArgumentTypeError as error:
            raise CommandError(f"--cost-model measured: {error}") from None
        with reading(path):
            return MeasuredCost.load(path)
    raise CommandError(
        f"--cost-model must be 'gpu-like' or 'measured FILE' (then at most a TRACE, when none "
        f"was given before), got {' '.join(spec)!r}"
    )


def depth_modes(text: str) -> tuple[DepthControl, ...]:
    """argparse type of ``--depth-control``: ``batch,per_request``, one of them, or ``none``."""
    parts = [p.strip() for p in text.split(",")]
    if parts == ["none"]:
        return ()
    modes: list[DepthControl] = []
    for part in parts:
        if part not in ("batch", "per_request"):
            raise argparse.ArgumentTypeError(
                f"takes batch, per_request (comma-separated) or none, got {text!r}"
            )
        if part in modes:
            raise argparse.ArgumentTypeError(f"{part!r} is listed twice in {text!r}")
        modes.append(part)  # type: ignore[arg-type]
    return tuple(modes)


def trt_schedule(text: str) -> dict[int, int]:
    """argparse type of ``--trt-schedule``: ``BATCH:LEN,...``."""
    from av_core.tools.peers import parse_trt_schedule

    try:
        return parse_trt_schedule(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _simulate(args: argparse.Namespace) -> int:
    """Serving simulation: adaptive verification against fixed K at several concurrencies."""
    from av_core.tools.plots import simulation_plot_names
    from av_core.tools.simulate import (
        PEERS_TITLE,
        format_markdown,
        format_peers_markdown,
        simulate_trace,
        simulation_preamble,
        simulation_tables,
        simulation_to_dict,
    )

    console = _console(args)
    if args.trt_schedule is not None and not args.peers:
        raise CommandError("--trt-schedule needs --peers (it sets the TensorRT-LLM peer policy)")
    _check_simulation_size(args.steps, args.warmup_steps, max(args.concurrency))
    cost = _cost_model(args)
    plots = _plots_ready(args, console, simulation_plot_names(f"_{args.drafter}"))
    trace = load_trace(args.trace)
    with _Job(console, "simulate", "policy") as job, about(args.trace.label):
        simulation = simulate_trace(
            trace,
            cost=cost,
            drafter=args.drafter,
            concurrency=args.concurrency,
            steps=args.steps,
            warmup_steps=args.warmup_steps,
            refit_interval=args.refit_interval,
            seed=args.seed,
            parallel_pass_tokens=args.parallel_pass_tokens,
            exploration=args.exploration,
            depth_control=args.depth_control,
            memory=args.memory,
            update=args.update,
            peers=args.peers,
            trt_schedule=args.trt_schedule,
            progress=job,
        )
    if args.refit_interval > args.warmup_steps + args.steps:
        # The map update (the estimator's default) fits within its first round too.
        within = (args.update or ESTIMATOR_DEFAULTS["update"]) == "map"
        _warn_without_refits(
            console,
            int(within),
            False,
            f"--refit-interval {args.refit_interval} is more than the "
            f"{args.warmup_steps + args.steps} simulated steps",
            "--refit-interval",
        )
    style = _style(args)
    tables = simulation_tables(simulation)
    preamble = simulation_preamble(simulation)
    if style == "markdown":
        # The README's tables first (format_markdown, format_peers_markdown), then the rest.
        summary = (
            "**summary: tokens per ms, and each adaptive policy over the best fixed K (K = 0 "
            "included)**\n\n" + format_markdown(simulation)
        )
        preamble = [*preamble, "", summary]
        if simulation.has_peers:
            preamble += ["", f"**{PEERS_TITLE}**\n\n" + format_peers_markdown(simulation)]
            tables = [t for t in tables if t.title != PEERS_TITLE]
    document = {"command": "simulate", "trace": args.trace.text, **simulation_to_dict(simulation)}
    _emit_tables(console, style, preamble, tables, document)
    if plots:
        from av_core.tools.plots import simulation_plots

        _write_plots(
            lambda d: simulation_plots(simulation, d, f"_{args.drafter}"), Path(args.out), console
        )
    return EXIT_OK


def _demo(args: argparse.Namespace) -> int:
    """Evaluate and simulate on the trace shipped with the package; plots in ./av_core_demo/."""
    from av_core.tools.evaluate import ONLINE, RAW, evaluate_trace
    from av_core.tools.plots import EVALUATION_PLOTS, simulation_plot_names
    from av_core.tools.simulate import simulate_trace
    from av_core.tools.tables import percent_change

    console = _console(args)
    _check_simulation_size(args.steps, DEMO_WARMUP_STEPS, max(DEFAULT_CONCURRENCY), demo=True)
    tables = {"evaluate": "evaluate.txt"} | {d: f"simulate_{d}.txt" for d in DEMO_DRAFTERS}
    out = _prepare_out(args, list(tables.values()))  # the tables go there even without plots
    pictures = [
        *EVALUATION_PLOTS,
        *(n for d in DEMO_DRAFTERS for n in simulation_plot_names(f"_{d}")),
    ]
    plots = _plots_ready(args, console, pictures)
    trace = load_trace(args.trace)
    with _Job(console, "demo: evaluate", "replay") as job, about(args.trace.label):
        evaluation = evaluate_trace(trace, progress=job)
    simulations = {}
    for drafter in DEMO_DRAFTERS:
        with _Job(console, f"demo: simulate {drafter}", "policy") as job:
            with about(args.trace.label):
                simulations[drafter] = simulate_trace(
                    trace, drafter=drafter, steps=args.steps, progress=job
                )
    out.mkdir(parents=True, exist_ok=True)
    console.result("== av-core evaluate (prequential replay of the online estimator) ==")
    console.result(evaluation.to_text())
    write_text_file(out / tables["evaluate"], evaluation.to_text() + "\n")
    for drafter, simulation in simulations.items():
        console.result(f"\n== av-core simulate --drafter {drafter} (gpu-like cost model) ==")
        console.result(simulation.to_text())
        write_text_file(out / tables[drafter], simulation.to_text() + "\n")

    if plots:
        from av_core.tools.plots import evaluation_plots, simulation_plots

        def make(directory: Path) -> list[Path]:
            paths = evaluation_plots(evaluation, directory)
            for drafter, simulation in simulations.items():
                paths += simulation_plots(simulation, directory, f"_{drafter}")
            return paths

        _write_plots(make, out, console)
    online = evaluation.feature(ONLINE).report.overall
    raw = evaluation.feature(RAW).report.overall
    console.result("")
    console.paragraph(
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
        console.paragraph(
            f"simulated, {drafter} drafter (gpu-like cost model, not measured): AV vs best "
            f"fixed K>=1 from {percent_change(ratios[worst])} (R={worst}) to "
            f"{percent_change(ratios[best])} (R={best}); with drafting-depth control, worst "
            f"case {percent_change(depth[lowest])} (R={lowest}) against the best fixed K "
            "including none"
            + (f"; plots and tables in {out}/" if drafter == "autoregressive" else "")
        )
    return EXIT_OK


def _add_update_option(parser: argparse.ArgumentParser) -> None:
    """``--update``: how the estimator refits (``None``: the estimator's own default)."""
    parser.add_argument(
        "--update",
        choices=("map", "vllm"),
        default=None,
        help="how the estimator refits: map (av_core's MAP fit of per-position histograms, "
        "after 1, 2, 4, ... steps of every round) or vllm (vLLM's damped Newton step once per "
        f"round); default: the estimator's, {ESTIMATOR_DEFAULTS['update']}",
    )


def add_demo(add: AddCommand) -> argparse.ArgumentParser:
    """``av-core demo`` and its options (``add`` creates the subparser)."""
    demo = add(
        "demo",
        help="evaluate and simulate on the real trace shipped with av_core",
        description="Runs evaluate and simulate (parallel and autoregressive drafters, gpu-like "
        "cost model) on the trace shipped inside the package; writes tables and plots to "
        "--out and ends with a summary: calibration, then each drafter's throughput.",
    )
    demo.add_argument(
        "--trace",
        type=trace_arg,
        default="shipped",
        metavar="TRACE",
        help="trace file or shipped trace name",
    )
    demo.add_argument(
        "--out", type=types.writable_dir, default="av_core_demo", help="folder for tables and plots"
    )
    demo.add_argument(
        "--steps", type=types.positive_int, default=1000, help="measured decode steps"
    )
    demo.set_defaults(handler=_demo)
    return demo


def add_evaluate(add: AddCommand) -> argparse.ArgumentParser:
    """``av-core evaluate`` and its options (``add`` creates the subparser)."""
    evaluate = add(
        "evaluate",
        help="prequential evaluation of the online estimator and the candidate features",
        description="Replays the online estimator over TRACE in decode order, scoring every "
        "draft with the prediction made at draft time; compares features; fits each workload "
        "with the fits' slopes and intercepts.",
    )
    _add_trace_argument(evaluate)
    evaluate.add_argument(
        "--refit-interval",
        type=types.positive_int,
        default=DEFAULT_REFIT_INTERVAL,
        help="observes between refits",
    )
    evaluate.add_argument(
        "--batch-rounds",
        type=types.positive_int,
        default=1,
        help="consecutive drafting rounds per observe, i.e. requests per decode step",
    )
    evaluate.add_argument(
        "--memory",
        type=types.memory,
        default=None,
        help="estimator memory across rounds, gamma in [0, 1) (default: the estimator's, "
        f"{ESTIMATOR_DEFAULTS['memory']}; 0 with --update vllm is vLLM's memoryless update)",
    )
    _add_update_option(evaluate)
    evaluate.add_argument(
        "--groups-per-workload",
        type=types.positive_int,
        default=4,
        help="prompt groups per workload for the intercept/entropy correlation",
    )
    evaluate.add_argument(
        "--out", type=types.path_text, default="av_core_evaluate", help="folder for the PNG plots"
    )
    evaluate.add_argument("--no-plots", action="store_true", help="tables only")
    _output_options(evaluate)
    evaluate.set_defaults(handler=_evaluate)
    return evaluate


def add_simulate(add: AddCommand) -> argparse.ArgumentParser:
    """``av-core simulate`` and its options (``add`` creates the subparser)."""
    gpu = GpuLikeCost()
    # Times in ms, bounded by the cost model's MAX_COST_MS (past it a run's sums overflow).
    time_ms = types.bounded_float(
        0.0, MAX_COST_MS, what=f"a finite number of ms in [0, {MAX_COST_MS:g}]"
    )
    positive_ms = types.bounded_float(
        0.0, MAX_COST_MS, low_open=True, what=f"a finite number of ms in (0, {MAX_COST_MS:g}]"
    )
    simulate = add(
        "simulate",
        help="serving simulation: adaptive verification against fixed K",
        description="Replays TRACE's drafting rounds for R concurrent requests and compares "
        "adaptive verification with fixed K = 0..K at every concurrency. "
        "The gpu-like cost model: ms(t) = base + max(0, t - knee) * per_token.",
    )
    _add_trace_argument(simulate)
    simulate.add_argument(
        "--cost-model",
        nargs="+",
        default=["gpu-like"],
        metavar="MODEL",
        help="'gpu-like' or 'measured FILE' (a file from av-core profile; TRACE may follow) "
        "(default: gpu-like)",
    )
    simulate.add_argument(
        "--concurrency",
        type=types.int_list(high=MAX_CONCURRENCY),
        default=",".join(str(c) for c in DEFAULT_CONCURRENCY),
        help="request counts: comma-separated integers and LOW-HIGH doubling ranges "
        "(1-512 = 1,2,4,...,512), increasing",
    )
    simulate.add_argument(
        "--drafter",
        choices=("parallel", "autoregressive"),
        default="parallel",
        help="how drafting is charged",
    )
    simulate.add_argument(
        "--parallel-pass-tokens",
        choices=("requests", "drafts"),
        default="requests",
        help="a parallel pass is charged at R tokens or at the R*K drafted tokens",
    )
    simulate.add_argument(
        "--steps", type=types.positive_int, default=1000, help="measured decode steps"
    )
    simulate.add_argument(
        "--warmup-steps", type=types.non_negative_int, default=200, help="unmeasured warm-up"
    )
    simulate.add_argument(
        "--refit-interval",
        type=types.positive_int,
        default=ESTIMATOR_DEFAULTS["refit_interval"],
        help="estimator refit interval",
    )
    simulate.add_argument("--seed", type=types.seed, default=0, help="seed of the round streams")
    simulate.add_argument(
        "--exploration",
        type=types.probability,
        default=None,
        help="planner exploration floor in [0, 1] (default: the planner's own)",
    )
    simulate.add_argument(
        "--memory",
        type=types.memory,
        default=None,
        help="estimator memory across rounds, gamma in [0, 1) (default: the estimator's)",
    )
    _add_update_option(simulate)
    simulate.add_argument(
        "--depth-control",
        type=depth_modes,
        default="batch,per_request",
        help="drafting-depth policies to add beside AV: comma-separated batch, per_request, or "
        "none",
    )
    for name, value, kind in (
        ("verify-base-ms", gpu.verify_base_ms, positive_ms),
        ("verify-knee", gpu.verify_knee, types.non_negative_int),
        ("verify-per-token-ms", gpu.verify_per_token_ms, time_ms),
        ("draft-base-ms", gpu.draft_base_ms, time_ms),
        ("draft-knee", gpu.draft_knee, types.non_negative_int),
        ("draft-per-token-ms", gpu.draft_per_token_ms, time_ms),
    ):
        simulate.add_argument(
            f"--{name}",
            type=kind,
            default=value,
            metavar="N" if kind is types.non_negative_int else "MS",
            help="gpu-like cost model",
        )
    simulate.add_argument(
        "--out", type=types.path_text, default="av_core_simulate", help="folder for the PNG plot"
    )
    simulate.add_argument("--no-plots", action="store_true", help="tables only")
    _output_options(simulate)
    simulate.add_argument(
        "--peers",
        action="store_true",
        help="also run the other engines' policies (SGLang's EMA tiers, TensorRT-LLM's "
        "draft_len_schedule, vLLM's adaptive verification) and the hindsight oracle",
    )
    simulate.add_argument(
        "--trt-schedule",
        type=trt_schedule,
        default=None,
        metavar="BATCH:LEN,...",
        help="with --peers: TensorRT-LLM's draft_len_schedule, batch-size threshold : draft "
        "length (default 4:4,8:2,32:1; larger batches do not speculate)",
    )
    simulate.set_defaults(handler=_simulate)
    return simulate
