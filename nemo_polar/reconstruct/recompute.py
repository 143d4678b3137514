"""The trainer-side logprob check: recompute every trainable token's logprob with transformers under the engine's
own weights and report the agreement (mean/max |Δ|, KL). The model runs in the engine virtualenv, so the work is
done by :mod:`.recompute_worker` in a process there: one per process, started on first use and kept (torch's
imports alone are ~6 s of CPU, paid once however many sessions a process checks)."""

from __future__ import annotations

import atexit
import tempfile
from pathlib import Path
from typing import Any

from nemo_polar.engine.worker_process import WorkerProcess, WorkerProcessError
from nemo_polar.reconstruct.io import write_traces
from nemo_polar.reconstruct.trace import Trace

_worker = WorkerProcess(Path(__file__).with_name("recompute_worker.py"), "logprob recompute worker")
atexit.register(_worker.close)


def recompute_logprobs(traces: list[Trace], model_dir: Path) -> dict[str, Any]:
    """Per trainable token, the trainer's logprob under ``model_dir``'s weights against the engine's: token count,
    mean and max |Δ|, and the k3 KL estimate (:mod:`.recompute_worker`)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "traces.jsonl"
        write_traces([t for t in traces if t.trainable_tokens], path)
        try:
            return _worker.call({"model_dir": str(model_dir), "traces": str(path)})["report"]
        except WorkerProcessError as exc:
            raise RuntimeError(f"logprob recomputation failed: {exc}") from None
