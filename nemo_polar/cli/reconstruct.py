"""``polar reconstruct`` and ``polar audit``: traces from proxy records, exported or checked against them."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(subparsers: argparse._SubParsersAction) -> None:
    cmd = _records_parser(subparsers, "reconstruct", "build traces from proxy records")
    cmd.add_argument(
        "-o", "--output", type=Path, required=True, help="the output file (a directory for gym-token-entries)"
    )
    cmd.add_argument(
        "--format",
        choices=["traces", "gym", "sft-jsonl", "sft-parquet", "gym-token-entries"],
        default="traces",
        help="traces JSONL (default), NeMo Gym result rows, SFT rows (chat messages + token fields), or NeMo "
        "Gym TokenEntry records, one per call, in a Gym token store directory (rollout id = session id)",
    )
    cmd.add_argument(
        "--rollout-id",
        action="append",
        metavar="SESSION_ID=ROLLOUT_ID",
        help="gym-token-entries: the Gym rollout id of a session (repeatable)",
    )
    cmd.set_defaults(func=_reconstruct)
    cmd = _records_parser(subparsers, "audit", "check traces against the records they came from")
    cmd.add_argument(
        "--recompute-logprobs",
        type=Path,
        metavar="MODEL_DIR",
        help="recompute trainable logprobs with transformers; report the mean and max absolute difference and KL (k3)",
    )
    cmd.set_defaults(func=_audit)


def _records_parser(subparsers: argparse._SubParsersAction, name: str, helptext: str) -> argparse.ArgumentParser:
    cmd = subparsers.add_parser(name, help=helptext)
    cmd.add_argument("records", nargs="+", type=Path, help="the proxy's per-session JSONL files")
    cmd.add_argument("--builder", choices=["per_request", "prefix_merging"], default="prefix_merging")
    return cmd


def _sessions(args: argparse.Namespace) -> tuple[Any, dict[str, list]]:
    """The chosen builder and the records by session, or exit naming the unreadable file."""
    from nemo_polar.reconstruct.builders import per_request, prefix_merging
    from nemo_polar.reconstruct.io import load_records

    build = prefix_merging if args.builder == "prefix_merging" else per_request
    try:
        return build, load_records(args.records)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"polar {args.command}: {exc}") from None


def _audit(args: argparse.Namespace) -> int:
    import json

    from nemo_polar.reconstruct.audit import audit
    from nemo_polar.reconstruct.recompute import recompute_logprobs

    build, sessions = _sessions(args)
    for session_id, records in sorted(sessions.items()):
        traces = build(records).traces
        report = audit(traces, records)
        line = {"session_id": session_id, "ok": report.ok, **report.model_dump()}
        if args.recompute_logprobs:
            line["logprob_recompute"] = recompute_logprobs(traces, args.recompute_logprobs)
        print(json.dumps(line))
        if not report.ok:
            return 1
    return 0


def _reconstruct(args: argparse.Namespace) -> int:
    import json

    from nemo_polar.reconstruct.export import export

    build, sessions = _sessions(args)
    traces, failed, stats, by_id = [], 0, [], {}
    for session_id, records in sorted(sessions.items()):
        result = build(records)
        traces += result.traces
        failed += len(result.failed_call_ids)
        stats.append({"session_id": session_id, **result.stats})
        by_id.update((r.call_id, r) for r in records)
    summary: dict[str, object] = {"traces": len(traces), "failed_calls": failed, "format": args.format}
    if args.rollout_id and args.format != "gym-token-entries":
        raise SystemExit("polar reconstruct: --rollout-id is for --format gym-token-entries")
    try:
        if args.format == "gym-token-entries":
            summary["entries"] = _gym_token_entries(sessions, args.output, args.rollout_id or [])
        else:
            export(traces, by_id, args.output, args.format)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"polar reconstruct: {exc}") from None
    print(json.dumps({**summary, "sessions": stats}))
    return 0


# Stays here: it checks --rollout-id against the records, then hands off to env/gym/tokens (which owns the export
# and needs nemo-gym); the reconstruct package sits below env and may not import it.
def _gym_token_entries(sessions: dict[str, list], out: Path, pairs: list[str]) -> int:
    """NeMo Gym ``TokenEntry`` records, one per call, into a Gym token store directory (needs nemo-gym)."""
    rollout_ids = {}
    for pair in pairs:
        session_id, sep, rollout_id = pair.partition("=")
        if not sep or not session_id or not rollout_id:
            raise ValueError(f"--rollout-id wants SESSION_ID=ROLLOUT_ID, got {pair!r}")
        rollout_ids[session_id] = rollout_id
    if unknown := sorted(set(rollout_ids) - set(sessions)):
        raise ValueError(f"--rollout-id names sessions not in the records: {', '.join(unknown)}")
    try:
        from nemo_polar.env.gym.tokens import export_sessions, write_token_store
    except ImportError as exc:
        raise SystemExit(f"polar reconstruct: --format gym-token-entries needs nemo-gym ({exc})") from None
    return write_token_store(export_sessions(sessions, rollout_ids), out)
