"""The closed loop's figure (`make learn` as a bench): held-out reward before -> after for two seeds, the spread of
the gains, steps and wall time, and the trainer/engine logprob mismatch on trained tokens; the curves go to
``bench/learn.png``. ``--from`` records the figures of a finished ``polar learn`` run (its OUT/learn.json) instead of
running one.

    python -m bench.learn [--out runs/learn] [--from runs/learn/learn.json]
"""

from __future__ import annotations

import argparse
import base64
from pathlib import Path

from bench.common import report
from nemo_polar.learn.loop import LearnConfig
from nemo_polar.learn.report import LearnSummary, curves_png, run_seeds

CURVE = Path(__file__).resolve().parent / "learn.png"  # docs/learn.md shows it


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/learn"))
    parser.add_argument("--from", dest="done", type=Path, help="a finished run's learn.json")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    args = parser.parse_args()
    if args.done:
        summary = LearnSummary.model_validate_json(args.done.read_text())
    else:
        summary = run_seeds([LearnConfig(out=args.out / f"seed-{s}", seed=s) for s in args.seeds], args.out)
    seeds = summary.seeds
    CURVE.write_bytes(base64.b64decode(curves_png(summary)))
    figures: dict[str, float | int | str] = {
        "steps": len(seeds[0].reward_per_step),
        "mean_gain": summary.mean_gain,
        "gain_spread": summary.gain_spread,
        "min_gain": min(s.gain for s in seeds),
        "wall_s": sum(s.wall_s for s in seeds),
        "max_mismatch": max(m for s in seeds for m in s.mismatch_per_step),
        "served_vs_trained": max(s.served_vs_trained for s in seeds),
        "served_vs_base": min(s.served_vs_base for s in seeds),
    }
    for s in seeds:
        figures[f"before_seed{s.seed}"] = s.held_out_before
        figures[f"after_seed{s.seed}"] = s.held_out_after
    runs = ", ".join(f"seed {s.seed} {s.held_out_before:.2f} → {s.held_out_after:.2f}" for s in seeds)
    report(
        "learn",
        figures,
        f"held-out reward {runs} ({figures['steps']} steps, {figures['wall_s'] / 60:.0f} min for both); "
        f"gain {summary.mean_gain:+.2f} vs spread {summary.gain_spread:.2f}; "
        f"trainer/engine |Δ| ≤ {figures['max_mismatch']:.0e}",
    )


if __name__ == "__main__":
    main()
