"""Reading call records for reconstruction (validated, grouped by session) and writing traces out."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from nemo_polar.proxy.store.records import CallRecord, iter_records
from nemo_polar.reconstruct.trace import Trace


def load_records(paths: list[Path]) -> dict[str, list[CallRecord]]:
    """Records grouped by session. A corrupt line, a record newer than this reader (``schema_version``, see
    :mod:`nemo_polar.proxy.store.records`), or a complete record whose ids cannot be proven (no prompt, ids and
    logprobs of different lengths) raises with the file, line and call id."""
    sessions: dict[str, list[CallRecord]] = defaultdict(list)
    for path in paths:
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such records file")
        for lineno, rec in iter_records(path):
            where = f"{path}:{lineno}"
            if rec.complete:
                if not rec.prompt_token_ids:
                    raise ValueError(f"{where}: record {rec.call_id} is complete but has no prompt_token_ids")
                if len(rec.sampled_token_ids) != len(rec.sampled_logprobs):
                    raise ValueError(
                        f"{where}: record {rec.call_id} has {len(rec.sampled_token_ids)} sampled ids but "
                        f"{len(rec.sampled_logprobs)} logprobs"
                    )
            sessions[rec.session_id].append(rec)
    return dict(sessions)


def write_traces(traces: list[Trace], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as fh:
        for trace in traces:
            fh.write(trace.model_dump_json() + "\n")
