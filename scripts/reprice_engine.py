"""Re-derives a bench-engine folder's simulated and priced figures with the current cost model
(``av_core.llama_cpp.bench.reprice``), without running a model: writes ``runs.repriced.jsonl``
and ``results.repriced.json`` beside the folder's own files and prints, per row, the measured
tokens/s, the simulated figure and their ratio.

    python scripts/reprice_engine.py FOLDER [--extra-costs COSTS.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from av_core.llama_cpp.bench import BenchConfig, write_results
from av_core.llama_cpp.reprice import reprice


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--extra-costs", type=Path, default=None)
    args = parser.parse_args()
    try:
        records, rows = reprice(args.folder, extra_costs=args.extra_costs)
    except ValueError as error:
        parser.exit(2, f"reprice_engine: error: {error}\n")
    settings = json.loads((args.folder / "settings.json").read_text(encoding="utf-8"))
    config = BenchConfig(
        settings["target"],
        settings["drafter"],
        num_positions=settings["num_positions"],
        max_new_tokens=settings["max_new_tokens"],
        temperature=settings["temperature"],
        clock=settings["clock"],
    )
    with (args.folder / "runs.repriced.jsonl").open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")
    write_results(args.folder / "results.repriced.json", config, rows)
    for row in rows:
        simulated = row["simulated_tokens_per_s"]
        ratio = "-" if simulated is None else f"{simulated / row['tokens_per_s']:.3f}"
        print(
            f"t={row['threads']} R={row['R']:>2} {row['policy']:>16}: measured "
            f"{row['tokens_per_s']:6.2f} simulated {simulated or float('nan'):6.2f} ({ratio}); "
            f"draft {row['draft_ms_per_step']:.1f}/{row['priced_draft_ms_per_step']:.1f} "
            f"verify {row['verify_ms_per_step']:.1f}/{row['priced_verify_ms_per_step']:.1f} "
            "ms/step (measured/priced)"
        )


if __name__ == "__main__":
    main()
