"""Grading throughput: bundled instances graded per minute with swebench's grader in fresh sandboxes, with and
without evaluator prewarm (the next instance's sandbox is prepared while the current one's tests run, as the
gateway prepares an evaluator while the agent works). Rounds alternate between the two so both meet the same
machine load. Figures are medians over the rounds; the last line is the prewarmed/cold throughput ratio with its
range over the rounds.

    python -m bench.grade [--rounds 3] [--runtime bwrap]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import report
from nemo_polar.rewards import bundled_instances
from nemo_polar.rewards.grader import grade_many


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runtime", default="bwrap")
    args = parser.parse_args()
    pairs = [(inst, inst.patch) for inst in bundled_instances()]
    rates: dict[bool, list[float]] = {True: [], False: []}  # instances/min, per round
    with tempfile.TemporaryDirectory(prefix="polar-bench-grade-") as tmp:
        for _ in range(args.rounds):
            for prewarm in (False, True):
                t0 = time.monotonic()
                results = grade_many(pairs, runtime=args.runtime, work_dir=Path(tmp), prewarm=prewarm)
                rates[prewarm].append(60 * len(results) / (time.monotonic() - t0))
                assert all(r.resolved for r in results), [r.reason for r in results if not r.resolved]
    ratios = [warm / cold for cold, warm in zip(rates[False], rates[True], strict=True)]
    rate = {k: statistics.median(v) for k, v in rates.items()}
    ratio = statistics.median(ratios)
    print(f"instances: {len(pairs)} x {args.rounds} rounds per side, runtime {args.runtime}, gold patches")
    print(f"cold:      {rate[False]:.1f} instances/min (rounds: {', '.join(f'{r:.0f}' for r in rates[False])})")
    print(f"prewarm:   {rate[True]:.1f} instances/min (rounds: {', '.join(f'{r:.0f}' for r in rates[True])})")
    print(f"prewarm/cold per round: {', '.join(f'{r:.2f}' for r in ratios)}")
    report(
        f"grade_{args.runtime}",
        {
            "runtime": args.runtime,
            "cold_per_min": rate[False],
            "prewarm_per_min": rate[True],
            "ratio": ratio,
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
        },
        f"grading ({args.runtime}) prewarm/cold throughput: {rate[False]:.0f} -> {rate[True]:.0f} instances/min "
        f"({ratio:.2f}x, rounds {min(ratios):.2f}-{max(ratios):.2f})",
    )


if __name__ == "__main__":
    main()
