"""Loading call records for reconstruction and writing traces out."""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

from nemo_polar.proxy.records import CallRecord, iter_records
from nemo_polar.reconstruct.trace import Trace


def load_records(paths: list[Path]) -> dict[str, list[CallRecord]]:
    """Records grouped by session. A corrupt line, or a complete record whose ids cannot be proven (no prompt,
    ids and logprobs of different lengths), raises with the file, line and call id."""
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


def recompute_logprobs(traces: list[Trace], model_dir: Path) -> dict[str, Any]:
    """Run :mod:`nemo_polar.reconstruct.recompute` in the engine virtualenv (torch lives there, not here)."""
    from nemo_polar.engine.launcher import engine_python

    script = Path(__file__).with_name("recompute.py")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "traces.jsonl"
        write_traces([t for t in traces if t.trainable_tokens], path)
        done = subprocess.run(
            [str(engine_python()), "-W", "ignore", str(script), str(model_dir), str(path)],
            capture_output=True,
            text=True,
        )
    if done.returncode != 0:
        raise RuntimeError(f"logprob recomputation failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def gym_output_items(trace: Trace, records: dict[str, CallRecord]) -> list[dict[str, Any]]:
    """NeMo Gym output items for one trace: token fields on each call's item, prefix-contiguous by construction."""
    items = []
    for span in trace.spans:
        rec = records[span.call_id]
        items.append(
            {
                "type": "message",
                "id": f"msg_{rec.call_id}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": rec.output_text or "", "annotations": []}],
                "prompt_token_ids": trace.context_before(span),
                "generation_token_ids": trace.response_ids[span.start : span.end],
                "generation_log_probs": list(rec.sampled_logprobs),
            }
        )
    return items


def check_contiguous(items: list[dict[str, Any]]) -> None:
    """NeMo-RL's rule for Gym results: each token-bearing item's prompt extends everything seen before it."""
    seen: list[int] = []
    for item in items:
        if "generation_token_ids" not in item:
            continue
        if item["prompt_token_ids"][: len(seen)] != seen:
            raise ValueError("Non-contiguous messages found!")
        seen = item["prompt_token_ids"] + item["generation_token_ids"]
