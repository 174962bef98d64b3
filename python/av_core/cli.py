"""The ``av-core`` command line (also ``python -m av_core``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import numpy as np

from av_core import AcceptanceEstimator, __version__
from av_core.synthetic import SyntheticWorkload


def _demo(args: argparse.Namespace) -> int:
    """Fits the online estimator to a synthetic workload with known coefficients."""
    workload = SyntheticWorkload(slope=0.55, intercepts=(1.4, 0.9, 0.5, 0.1))
    estimator = AcceptanceEstimator(workload.num_positions)
    rng = np.random.default_rng(args.seed)
    for _ in range(args.steps):
        step = workload.step(rng, args.requests)
        predictions = estimator.predict(step.features)
        estimator.observe(step.features, step.num_admitted, step.num_accepted, predictions)
    fitted = ", ".join(f"{b:+.3f}" for b in estimator.intercepts)
    true = ", ".join(f"{b:+.3f}" for b in workload.intercepts)
    print(f"synthetic workload: {args.steps} decode steps x {args.requests} requests, K = 4")
    print(f"refits: {estimator.num_refits}")
    print(f"slope      fitted {estimator.slope:+.3f}   true {workload.slope:+.3f}")
    print(f"intercepts fitted [{fitted}]   true [{true}]")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="av-core",
        description="Adaptive verification for speculative decoding: estimator and planner.",
    )
    parser.add_argument("--version", action="version", version=f"av_core {__version__}")
    commands = parser.add_subparsers(dest="command")
    demo = commands.add_parser("demo", help="fit the online estimator on a synthetic workload")
    demo.add_argument("--steps", type=int, default=2000)
    demo.add_argument("--requests", type=int, default=64)
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(handler=_demo)
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
