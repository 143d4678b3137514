"""``bench/results.json`` -> ``bench/report.html`` (self-contained: one plot per bench, inline PNG) and, with
``--docs``, the performance table of ``docs/performance.md`` (between its ``bench:table`` markers). Every figure the
docs state comes from here, with the command that reproduces it and whether it meets its target.

    python -m bench.report [--results bench/results.json] [--docs]
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_polar.paths import write_between_markers

HERE = Path(__file__).resolve().parent
PAGE = HERE.parent / "docs" / "performance.md"
BEGIN, END = "<!-- bench:table -->", "<!-- /bench:table -->"


Figures = dict[str, Any]


@dataclass(frozen=True)
class Spec:
    what: str  # what the bench runs
    command: str
    target: str
    met: Callable[[Figures], bool] | None  # None: a measurement with no target
    bars: list[tuple[str, str]]  # (label, figure key) plotted
    line: float | None = None  # the target, drawn across the bars


SPECS: dict[str, Spec] = {
    "proxy_overhead": Spec(
        "64 concurrent multi-turn sessions per side, 32 tokens per turn, continuation mode; engine at nice 10 "
        "(ABBA with its default priority)",
        "python -m bench.proxy_overhead",
        "p50 ≤ 1.05×",
        lambda f: f["p50"] <= 1.05,
        [("p50", "p50"), ("p99", "p99"), ("p50, engine at default priority", "p50_nice0")],
        1.05,
    ),
    "proxy_overhead_chat": Spec(
        "the same in chat mode (the engine renders and parses)",
        "python -m bench.proxy_overhead --mode chat",
        "p50 ≤ 1.05×",
        lambda f: f["p50"] <= 1.05,
        [("p50", "p50"), ("p99", "p99"), ("p50, engine at default priority", "p50_nice0")],
        1.05,
    ),
    "stream_ttfb": Spec(
        "streamed Chat / Responses / Messages through the proxy vs vLLM's streamed chat, 8 concurrent pairs; "
        "engine at `--nice 10` (default priority beside it)",
        "python -m bench.stream_ttfb",
        "time to first text delta p50 ≤ 1.05×, p95 ≤ 1.5× (median of 3 rounds)",
        lambda f: (
            max(f[k] for k in f if k.endswith("_p50")) <= 1.05 and max(f[k] for k in f if k.endswith("_p95")) <= 1.5
        ),
        [
            ("chat p50", "chat_p50"),
            ("chat p95", "chat_p95"),
            ("responses p50", "responses_p50"),
            ("responses p95", "responses_p95"),
            ("messages p50", "anthropic_p50"),
            ("messages p95", "anthropic_p95"),
            ("chat p95, engine at default priority", "chat_p95_nice0"),
            ("responses p95, default", "responses_p95_nice0"),
            ("messages p95, default", "anthropic_p95_nice0"),
        ],
        1.5,
    ),
    "merge": Spec(
        "16 agent sessions x 8 calls recorded through the proxy on the real engine",
        "python -m bench.merge",
        "≤ 1/5.4 trainer updates per request",
        lambda f: f["updates_ratio"] <= 1 / 5.4,
        [("merged/per-request updates", "updates_ratio")],
        1 / 5.4,
    ),
    "reconstruct": Spec(
        "prefix merging of 4 sessions x 200 calls with contexts growing to 64k tokens (records read from JSONL)",
        "python -m bench.reconstruct",
        "linear in tokens (exponent ≈ 1); ≥ 10k calls/s",
        lambda f: f["prefix_merging_exponent"] < 1.2 and f["prefix_merging_calls_per_s"] >= 10_000,
        [("prefix merging calls/s", "prefix_merging_calls_per_s"), ("per request calls/s", "per_request_calls_per_s")],
        10_000,
    ),
    "render_scale": Spec(
        "a 200-call session growing to 64k tokens, rendered as the proxy renders in continuation mode (no engine)",
        "python -m bench.render_scale",
        "per-call render at 64k ≤ 10 ms, flat in the context",
        lambda f: f["incremental_ms"] <= 10 and f["exponent_incremental"] < 0.5,
        [("full ms", "full_ms"), ("incremental ms", "incremental_ms")],
        10,
    ),
    "session_scale": Spec(
        "200-call sessions growing to 64k and 128k tokens through `polar proxy` (stub engine: the proxy's own work), "
        "then 256 concurrent sessions at 32k",
        "python -m bench.session_scale",
        "records ≤ 10 B per unique token",
        lambda f: f["bytes_per_unique_token_64k"] <= 10,
        [("CPU ms/call 64k", "cpu_ms_per_call_64k"), ("CPU ms/call 128k", "cpu_ms_per_call_128k")],
    ),
    "proxy_workers": Spec(
        "256 sessions at 32k through 1 and through 2 proxy worker processes side by side (ABBA blocks of equal calls, "
        "stub engine); the load generator and stub engine share the same cores",
        "python -m bench.proxy_workers",
        "2 workers ≥ 1.6× 1 worker's calls/s",
        lambda f: f["ratio"] >= 1.6,
        [("calls/s, 1 worker", "calls_per_s_1"), ("calls/s, 2 workers", "calls_per_s_2")],
    ),
    "staging": Spec(
        "24 sessions (INIT 1 s and POSTRUN 1 s simulated by sleeps, RUN 3 s of real generations), 2 run slots",
        "python -m bench.staging",
        "≥ 90% engine busy pipelined",
        lambda f: f["pipelined_busy"] >= 0.9,
        [("serial", "serial_busy"), ("pipelined", "pipelined_busy")],
        0.9,
    ),
    "capacity": Spec(
        "1,000 lightweight sessions (3 real chat calls, 4 s of simulated tool time after each) on one gateway + proxy",
        "python -m bench.capacity",
        "≥ 1,000 sessions in RUN at once, all published, no lost record",
        lambda f: f["peak_in_run"] >= 1000 and f["published"] == f["sessions"] and f["lost_records"] == 0,
        [("peak in RUN", "peak_in_run"), ("published", "published")],
        1000,
    ),
    "grade_bwrap": Spec(
        "the 12 bundled instances (gold patches) graded with swebench in fresh bwrap sandboxes, rounds alternating",
        "python -m bench.grade --rounds 5",
        "prewarm > cold in every round",
        lambda f: f.get("ratio_min", f["prewarm_per_min"] / f["cold_per_min"]) > 1,
        [("cold /min", "cold_per_min"), ("prewarm /min", "prewarm_per_min")],
    ),
    "grade_docker": Spec(
        "the same in docker",
        "python -m bench.grade --rounds 5 --runtime docker",
        "prewarm > cold in every round",
        lambda f: f.get("ratio_min", f["prewarm_per_min"] / f["cold_per_min"]) > 1,
        [("cold /min", "cold_per_min"), ("prewarm /min", "prewarm_per_min")],
    ),
    "soak": Spec(
        "3,000 lightweight sessions fed to one gateway 16 at a time; RSS from 1k to 3k sessions",
        "python -m bench.soak --sessions 3000 --baseline 1000",
        "< 10% growth in both processes",
        lambda f: f["gateway_growth_pct"] < 10 and f["proxy_growth_pct"] < 10,
        [("gateway %", "gateway_growth_pct"), ("proxy %", "proxy_growth_pct")],
        10,
    ),
    "cli_sessions": Spec(
        "scripted Pi sessions on the bundled tasks (real CLI, sandbox, proxy, engine, grader), 4 per runtime and "
        "slot count",
        "python -m bench.cli_sessions --sessions 4",
        "none (a cost measurement)",
        None,
        [
            ("bwrap 1 slot /min", "bwrap_1_sessions_per_min"),
            ("bwrap 4 slots /min", "bwrap_4_sessions_per_min"),
            ("docker 1 slot /min", "docker_1_sessions_per_min"),
            ("docker 4 slots /min", "docker_4_sessions_per_min"),
        ],
    ),
    "recompute": Spec(
        "8 sessions x 4 calls with SmolLM2-135M (real weights); trainable logprobs recomputed with transformers",
        "python -m bench.recompute",
        "none (a measurement: on the CPU the engine samples in float32, as the trainer recomputes)",
        None,
        [("mean |Δ|", "mean_abs_logprob_delta"), ("max |Δ|", "max_abs_logprob_delta")],
    ),
    "learn": Spec(
        "`make learn`: GRPO on the project's own traces, SmolLM2-135M on 'which number is bigger?', two seeds, "
        "weights synced into vLLM each step",
        "python -m bench.learn",
        "held-out gain > its spread across seeds, both seeds ≤ 30 min",
        lambda f: f["min_gain"] > f["gain_spread"] and f["wall_s"] <= 1800,
        [
            ("seed 0 before", "before_seed0"),
            ("seed 0 after", "after_seed0"),
            ("seed 1 before", "before_seed1"),
            ("seed 1 after", "after_seed1"),
        ],
    ),
    "learn_ablation": Spec(
        "the paper's Fig. 5 with the real trainer: one sync step's Pi sessions as per-request and prefix-merged rows "
        "(one trainer step each from the same weights), and the harness loop's GRPO steps sync vs async (staleness 1)",
        "python -m bench.learn_ablation",
        "the same loss and gradient both ways; fewer rows merged; the engine busier async",
        lambda f: (
            bool(f["same_gradient"])
            and f["rows_per_request"] > f["rows_prefix_merging"]
            and f["engine_busy_async"] > f["engine_busy_sync"]
        ),
        [
            ("rows per request", "rows_per_request"),
            ("rows merged", "rows_prefix_merging"),
            ("trainer s per request", "trainer_s_per_request"),
            ("trainer s merged", "trainer_s_prefix_merging"),
        ],
    ),
}


def plot(name: str, spec: Spec, figures: Figures) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [label for label, key in spec.bars if key in figures]
    values = [float(figures[key]) for _, key in spec.bars if key in figures]
    fig, ax = plt.subplots(figsize=(6, 2.6))
    ax.bar(labels, values, color="#4c72b0")
    if spec.line is not None:
        ax.axhline(spec.line, color="#c44e52", linestyle="--", label=f"target {spec.line:g}")
        ax.legend(loc="best", fontsize=8)
    ax.set_title(name, fontsize=10)
    ax.tick_params(labelsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def rows(results: dict[str, Any]) -> list[tuple[str, Spec, Figures, str, bool | None]]:
    out = []
    for name, spec in SPECS.items():
        if name in results:
            entry = results[name]
            met = spec.met(entry["figures"]) if spec.met is not None else None
            out.append((name, spec, entry["figures"], entry["line"], met))
    return out


def _verdict(met: bool | None) -> str:
    return "—" if met is None else "yes" if met else "**no**"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")  # |Δ| would end a Markdown table cell


def performance_table(results: dict[str, Any]) -> str:
    lines = ["| bench | what | figure (its last line) | target | met |", "|---|---|---|---|---|"]
    for _name, spec, _, line, met in rows(results):
        cells = (f"`{spec.command}`", spec.what, line, spec.target, _verdict(met))
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines)


def write_html(results: dict[str, Any], out: Path) -> None:
    parts = [
        "<!doctype html><meta charset=utf-8><title>nemo_polar benchmarks</title>",
        "<style>body{font:14px system-ui;max-width:900px;margin:2em auto}code{background:#eee}"
        ".no{color:#c44e52;font-weight:bold}.yes{color:#55a868}</style><h1>nemo_polar benchmarks</h1>",
    ]
    for name, spec, figures, line, met in rows(results):
        verdict = (
            "no target: a measurement"
            if met is None
            else f"<span class={'yes' if met else 'no'}>{'meets' if met else 'misses'} its target</span>"
        )
        parts.append(
            f"<h2>{html.escape(name)}</h2><p>{html.escape(spec.what)}<br><code>{html.escape(spec.command)}</code></p>"
            f"<p><b>{html.escape(line)}</b><br>target: {html.escape(spec.target)} — {verdict}</p>"
            f"<img alt='{html.escape(name)}' src='data:image/png;base64,{plot(name, spec, figures)}'>"
        )
    out.write_text("\n".join(parts) + "\n")


def update_page(table: str) -> None:
    try:
        write_between_markers(PAGE, "bench:table", table)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=HERE / "results.json")
    parser.add_argument("--html", type=Path, default=HERE / "report.html")
    parser.add_argument("--docs", action="store_true", help="rewrite the performance table of docs/performance.md")
    args = parser.parse_args()
    results = json.loads(args.results.read_text())
    write_html(results, args.html)
    table = performance_table(results)
    if args.docs:
        update_page(table)
    met = sum(1 for *_, ok in rows(results) if ok is True)
    print(f"{args.html}: {len(rows(results))} benches, {met} meet their targets")


if __name__ == "__main__":
    main()
