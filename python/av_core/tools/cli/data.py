"""The commands that list or produce the data the others read: ``traces`` (the shipped traces),
``profile`` (a measured cost file) and ``collect`` (a labeled trace), each one's options beside
what it runs.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from av_core.tools import argtypes as types
from av_core.tools.cli.common import (
    COMMON_PROVENANCE,
    EXIT_OK,
    PROVENANCE,
    AddCommand,
    CommandError,
    TraceArg,
    _check_device,
    _console,
    _emit_tables,
    _Job,
    _model_modules,
    _output_options,
    _probe_output,
    _require,
    _style,
    about,
    load_trace,
    reading,
    shipped_names,
)
from av_core.tools.cli.engine import add_engine_option, collect_llama, profile_llama
from av_core.tools.profile import DEFAULT_TOKENS
from av_core.tools.progress import progress_enabled
from av_core.tools.trace import SHIPPED_TRACES

if TYPE_CHECKING:
    from av_core.tools.collect import CollectSummary
    from av_core.tools.trace import DraftTrace


def _traces(args: argparse.Namespace) -> int:
    """The shipped traces: names for TRACE, what each holds, and where it comes from."""
    from av_core.tools.tables import Table, col, fixed

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
        table.notes.append(f"{file}: {PROVENANCE.get(file, 'collected by av-core collect')}.")
    table.notes.append(COMMON_PROVENANCE)
    _emit_tables(
        console, _style(args), [], [table], {"command": "traces", "tables": [table.to_dict()]}
    )
    return EXIT_OK


def _refuse_transformers_options(args: argparse.Namespace, *options: tuple[str, Any]) -> None:
    """``CommandError`` naming an option given with ``--engine llama.cpp`` that only the
    transformers path reads (``options``: each one's flag and the value it has when not given),
    rather than measuring something other than what was asked for."""
    for flag, default in options:
        value = getattr(args, flag.lstrip("-").replace("-", "_"))
        if value != default:
            shown = ",".join(map(str, value)) if isinstance(value, list | tuple) else value
            raise CommandError(
                f"{flag} {shown!r}: only --engine transformers reads it (llama.cpp runs the "
                "models on the CPU, at the loop's own shapes)"
            )


def _profile(args: argparse.Namespace) -> int:
    """Measures forward times of a target (and a drafter) into a cost file."""
    if args.engine == "llama.cpp":
        _refuse_transformers_options(
            args,
            ("--device", "cpu"),
            ("--tokens", list(DEFAULT_TOKENS)),
            ("--draft-depths", [1, 2, 3, 4]),
        )
        return profile_llama(args)
    console = _console(args)
    _probe_output("--output", args.output)
    _require(_model_modules(args.target, args.drafter), "collect", "profile")
    from av_core.tools.profile import (
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
    _probe_output("--output", args.output)
    if args.engine == "llama.cpp":
        _refuse_transformers_options(args, ("--device", "cpu"))
        return collect_llama(args)
    _require(_model_modules(args.target, args.drafter), "collect", "collect")
    from av_core.tools.collect import CollectConfig, collect, completed_prompt_ids, read_prompts

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
    from av_core.tools.trace import read_trace

    with reading(summary.output):
        whole = read_trace(summary.output) if summary.output.exists() else None
    console.result(collect_summary(summary, whole))
    return EXIT_OK


def _add_models(parser: argparse.ArgumentParser, *, drafter_required: bool) -> None:
    """``--target`` and ``--drafter``: model directories or GGUF files."""
    parser.add_argument(
        "--target", required=True, type=types.model_path, help="model directory or .gguf file"
    )
    parser.add_argument(
        "--drafter",
        required=drafter_required,
        default=None,
        type=types.model_path,
        help="model directory or .gguf file"
        + ("" if drafter_required else " (default: none, the target alone is timed)"),
    )


def _add_torch_options(parser: argparse.ArgumentParser) -> None:
    """``--device`` and ``--threads``: where and on how many CPU threads torch runs the models."""
    parser.add_argument(
        "--device", type=types.device, default="cpu", help="cpu, cuda[:N], mps or xpu[:N]"
    )
    parser.add_argument(
        "--threads",
        type=types.positive_int,
        default=None,
        help="torch CPU threads (default: torch's own choice, usually one per core)",
    )


def add_traces(add: AddCommand) -> argparse.ArgumentParser:
    """``av-core traces`` and its options (``add`` creates the subparser)."""
    traces = add(
        "traces",
        help="list the shipped traces (names for TRACE) with their provenance",
        description="The labeled traces shipped inside the package: the names evaluate, "
        "simulate and demo accept as TRACE, what each holds and how it was collected.",
    )
    _output_options(traces)
    traces.set_defaults(handler=_traces)
    return traces


def add_profile(add: AddCommand) -> argparse.ArgumentParser:
    """``av-core profile`` and its options (``add`` creates the subparser)."""
    profile = add(
        "profile",
        help="measure a model's forward time at a grid of token counts into a cost file",
        description="Times a target (and optionally a drafter) appending t tokens to a KV cache "
        "of --context tokens; writes JSON for 'av-core simulate --cost-model measured FILE' "
        "(needs av_core[collect]). Warns when a sweep is non-monotone or noisy.",
    )
    _add_models(profile, drafter_required=False)
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
    add_engine_option(profile)
    profile.add_argument(
        "--concurrency",
        type=types.int_list(),
        default="1,2,4,8",
        help="with --engine llama.cpp: the R values to profile the loop at",
    )
    profile.add_argument(
        "--k", type=types.bounded_int(1, 16), default=4, help="with --engine llama.cpp: K"
    )
    _add_torch_options(profile)
    profile.set_defaults(handler=_profile)
    return profile


def add_collect(add: AddCommand) -> argparse.ArgumentParser:
    """``av-core collect`` and its options (``add`` creates the subparser)."""
    collect = add(
        "collect",
        help="collect a labeled draft trace by speculative sampling with two causal LMs",
        description="Real speculative sampling between a target and a drafter that share a "
        "tokenizer (model directories or GGUF files; needs av_core[collect]). Full "
        "verification: every draft up to the first rejection is labeled. Resumable: prompts "
        "already in the output are skipped.",
    )
    _add_models(collect, drafter_required=True)
    collect.add_argument(
        "--prompts",
        required=True,
        type=types.readable_file,
        help='JSONL prompts file, one object a line: {"prompt_id": ..., "workload": ..., '
        '"prompt": ...} ("chat": false skips the chat template)',
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
        metavar="P",
        help="nucleus threshold in (0, 1]",
    )
    collect.add_argument(
        "--max-new-tokens", type=types.positive_int, default=128, help="tokens per prompt"
    )
    collect.add_argument("--seed", type=types.seed, default=0, help="sampling seed")
    add_engine_option(collect)
    _add_torch_options(collect)
    collect.add_argument(
        "--max-prompts",
        type=types.positive_int,
        default=None,
        help="stop after N prompts (default: every prompt in --prompts)",
    )
    collect.add_argument("--no-progress", action="store_true", help="no progress line")
    collect.set_defaults(handler=_collect)
    return collect
