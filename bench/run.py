"""``make bench``: every bench, sized to finish in about 30 minutes on 2 cores, each writing its figures into
``bench/results.json``; then ``bench/report.html`` and the performance table of docs/performance.md are generated
from it.

One engine (tiny-qwen3) is started for all benches that need one (SmolLM2 for the recompute bench); a bench that
fails is reported and the rest still run. ``--only NAME ...`` runs a subset; results of other benches are kept.

    python -m bench.run [--only stream_ttfb capacity] [--results bench/results.json]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from nemo_polar.engine.launcher import EngineProcess, EngineSpec, free_port

HERE = Path(__file__).resolve().parent

# (result name, module, arguments): the order runs the quick ones first.
BENCHES: list[tuple[str, str, list[str]]] = [
    ("reconstruct", "bench.reconstruct", []),
    ("render_scale", "bench.render_scale", []),
    ("session_scale", "bench.session_scale", []),
    ("proxy_workers", "bench.proxy_workers", []),
    ("proxy_overhead", "bench.proxy_overhead", []),
    ("proxy_overhead_chat", "bench.proxy_overhead", ["--mode", "chat"]),
    ("stream_ttfb", "bench.stream_ttfb", []),
    ("merge", "bench.merge", []),
    ("staging", "bench.staging", []),
    ("capacity", "bench.capacity", []),
    ("grade_bwrap", "bench.grade", ["--rounds", "5"]),
    ("grade_docker", "bench.grade", ["--rounds", "5", "--runtime", "docker"]),
    ("soak", "bench.soak", ["--sessions", "3000", "--baseline", "1000"]),
    ("cli_sessions", "bench.cli_sessions", ["--sessions", "4"]),
    ("recompute", "bench.recompute", []),
    ("learn", "bench.learn", []),
    ("learn_ablation", "bench.learn_ablation", []),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, help="result names to run")
    parser.add_argument("--results", type=Path, default=HERE / "results.json")
    args = parser.parse_args()
    chosen = [b for b in BENCHES if args.only is None or b[0] in args.only]
    failed: list[str] = []
    t_all = time.monotonic()
    with EngineProcess(EngineSpec(model="tiny-qwen3", port=free_port())) as engine:
        assert engine.proc is not None
        env = {
            **os.environ,
            "POLAR_BENCH_RESULTS": str(args.results),
            "POLAR_BENCH_ENGINE_URL": engine.spec.url,
            "POLAR_BENCH_ENGINE_PID": str(engine.proc.pid),
        }
        for name, module, extra in chosen:
            # their own engine (SmolLM2): the shared one serves random weights
            if name in ("recompute", "learn", "learn_ablation"):
                env = {k: v for k, v in env.items() if not k.startswith("POLAR_BENCH_ENGINE_")}
            print(f"== {name}: python -m {module} {' '.join(extra)}", flush=True)
            t0 = time.monotonic()
            done = subprocess.run([sys.executable, "-m", module, *extra], env=env, cwd=HERE.parent)
            print(f"== {name}: exit {done.returncode} in {time.monotonic() - t0:.0f} s", flush=True)
            if done.returncode != 0:
                failed.append(name)
    subprocess.run([sys.executable, "-m", "bench.report", "--results", str(args.results), "--docs"], check=True)
    print(f"benches: {len(chosen) - len(failed)}/{len(chosen)} ran in {(time.monotonic() - t_all) / 60:.1f} min")
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
