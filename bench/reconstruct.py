"""Reconstruction at the size of real SWE sessions: ``--calls`` calls whose context grows to ``--context`` tokens
(a tool result and a sampled turn per call, continuation mode, the proxy's parent links), built with prefix merging
and per request. Real sessions are 50-200 calls with 30k-100k-token contexts.

The records are synthetic — shaped exactly like the proxy's (every prompt extends its parent's prompt + sampled ids)
— because what is measured is the builders' work, which only depends on the token arrays; they go through a JSONL
file as the proxy writes it (each prompt stored as what it adds to its parent's) and ``load_records`` as real ones
do (so no token object is shared between records); the bytes that file takes per unique session token are printed
beside those of full records. The cost must be linear
in the tokens the records hold: two sizes are built side by side, interleaved, and the exponent of time against
total tokens is printed (1.0 = linear, 2.0 = quadratic). The last line is prefix merging's calls/s at full size.

    python -m bench.reconstruct [--calls 200] [--context 65536] [--sessions 4] [--rounds 5]
"""

from __future__ import annotations

import argparse
import math
import random
import tempfile
import time
from pathlib import Path

from bench.common import report
from nemo_polar.proxy.store.records import CallRecord, RecordWriter
from nemo_polar.reconstruct.audit import audit
from nemo_polar.reconstruct.builders import per_request, prefix_merging
from nemo_polar.reconstruct.io import load_records

EOT = 151645


def session(sid: str, calls: int, context: int, rng: random.Random) -> list[CallRecord]:
    system = [rng.randrange(1000, 150000) for _ in range(2000)]  # system prompt + tool schemas
    step = max((context - len(system)) // calls, 8)
    records: list[CallRecord] = []
    prompt = system
    for i in range(calls):
        sampled = [rng.randrange(1000, 150000) for _ in range(step // 4)] + [EOT]
        rec = CallRecord(
            call_id=f"{sid}-{i:04d}",
            session_id=sid,
            api="chat",
            mode="continuation",
            request=None,
            prompt_token_ids=prompt,
            sampled_token_ids=sampled,
            sampled_logprobs=[-0.5] * len(sampled),
            finish_reason="stop",
            started_at=float(i),
            complete=True,
            parent_call_id=records[-1].call_id if records else None,
            render_reason="continuation" if records else "first_call",
        )
        records.append(rec)
        tool_result = [rng.randrange(1000, 150000) for _ in range(step - len(sampled))]
        prompt = prompt + sampled + tool_result
    return records


STORED: list[tuple[int, int, int]] = []  # (bytes on disk, bytes as full records, unique tokens) per session


def through_disk(records: list[CallRecord]) -> list[CallRecord]:
    """Written as the proxy writes them (a prompt stored as what it adds to its parent's), read back whole."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "records.jsonl"
        writer = RecordWriter(path)
        with path.open("w") as fh:
            fh.write("".join(writer.line(r) for r in records))
        [loaded] = load_records([path]).values()
        full = sum(len(r.model_dump_json()) + 1 for r in records)
        STORED.append(
            (path.stat().st_size, full, len(records[-1].prompt_token_ids) + len(records[-1].sampled_token_ids))
        )
    return loaded


def tokens(records: list[CallRecord]) -> int:
    return sum(len(r.prompt_token_ids) + len(r.sampled_token_ids) for r in records)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--context", type=int, default=65536)
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds; the best round of each counts")
    args = parser.parse_args()
    rng = random.Random(0)
    sizes = {
        "half": [through_disk(session(f"h{i}", args.calls // 2, args.context // 2, rng)) for i in range(args.sessions)],
        "full": [through_disk(session(f"f{i}", args.calls, args.context, rng)) for i in range(args.sessions)],
    }
    for recs in sizes["full"]:
        built = prefix_merging(recs)
        assert len(built.traces) == 1 and audit(built.traces, recs).ok  # one chain, exact
    best: dict[tuple[str, str], float] = {}
    for _ in range(args.rounds):
        for builder in (prefix_merging, per_request):
            for size, sessions in sizes.items():
                t0 = time.perf_counter()
                for recs in sessions:
                    builder(recs)
                elapsed = time.perf_counter() - t0
                key = (builder.__name__, size)
                best[key] = min(best.get(key, math.inf), elapsed)
    figures: dict[str, float] = {}
    for name in ("prefix_merging", "per_request"):
        t_half, t_full = best[(name, "half")], best[(name, "full")]
        n_half = sum(tokens(r) for r in sizes["half"])
        n_full = sum(tokens(r) for r in sizes["full"])
        exponent = math.log(t_full / t_half) / math.log(n_full / n_half)
        calls = args.calls * args.sessions
        figures[f"{name}_calls_per_s"] = calls / t_full
        figures[f"{name}_exponent"] = exponent
        print(
            f"{name:<15} {args.sessions} sessions x {args.calls} calls to {args.context:,} tokens: "
            f"{calls / t_full:,.0f} calls/s, {n_full / t_full / 1e6:,.1f} M record tokens/s; "
            f"time ~ tokens^{exponent:.2f} ({n_half / 1e6:.1f} M -> {n_full / 1e6:.1f} M tokens)"
        )
    stored, full, unique = (sum(x[k] for x in STORED[-args.sessions :]) for k in range(3))
    figures["bytes_per_unique_token"] = stored / unique
    figures["full_record_bytes_per_unique_token"] = full / unique
    print(
        f"records on disk: {stored / unique:.1f} bytes per unique session token ({full / unique:.0f} as full records)"
    )
    report(
        "reconstruct",
        figures,
        f"prefix merging at {args.calls} calls / {args.context:,}-token contexts: "
        f"{figures['prefix_merging_calls_per_s']:,.0f} calls/s, time ~ tokens^{figures['prefix_merging_exponent']:.2f}",
    )


if __name__ == "__main__":
    main()
