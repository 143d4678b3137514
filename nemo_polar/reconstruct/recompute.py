"""The trainer-side logprob check: recompute every trainable token's logprob with transformers under the engine's
own weights and report the agreement (mean/max |Δ|, KL). The model runs in the engine virtualenv, so the work is
done by :mod:`.recompute_worker` in a process there: one per process, started on first use and kept (torch's
imports alone are ~6 s of CPU, paid once however many sessions a process checks)."""

from __future__ import annotations

import atexit
import json
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

from nemo_polar.engine.launcher import engine_python
from nemo_polar.reconstruct.io import write_traces
from nemo_polar.reconstruct.trace import Trace

WORKER = Path(__file__).with_name("recompute_worker.py")

_lock = threading.Lock()  # one request at a time on the worker's pipes
_worker: subprocess.Popen[str] | None = None


def _started() -> subprocess.Popen[str]:
    global _worker
    if _worker is None or _worker.poll() is not None:
        cmd = [str(engine_python()), "-W", "ignore", str(WORKER)]
        proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1
        )
        assert proc.stdout is not None and proc.stderr is not None
        if not proc.stdout.readline():
            log = proc.stderr.read()[-2000:]
            raise RuntimeError(f"logprob recomputation failed: its worker exited on start:\n{log}")
        threading.Thread(target=proc.stderr.read, daemon=True).start()  # drained, so its log never blocks it
        _worker = proc
    return _worker


@atexit.register
def _stop() -> None:
    if _worker is not None and _worker.poll() is None:
        assert _worker.stdin is not None
        _worker.stdin.close()
        try:
            _worker.wait(timeout=10)
        except subprocess.TimeoutExpired:
            _worker.kill()


def recompute_logprobs(traces: list[Trace], model_dir: Path) -> dict[str, Any]:
    """Per trainable token, the trainer's logprob under ``model_dir``'s weights against the engine's: token count,
    mean and max |Δ|, and the k3 KL estimate (:mod:`.recompute_worker`)."""
    with tempfile.TemporaryDirectory() as tmp, _lock:
        path = Path(tmp) / "traces.jsonl"
        write_traces([t for t in traces if t.trainable_tokens], path)
        proc = _started()
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps({"model_dir": str(model_dir), "traces": str(path)}) + "\n")
        line = proc.stdout.readline()
    if not line:
        raise RuntimeError("logprob recomputation failed: its worker exited")
    reply = json.loads(line)
    if not reply["ok"]:
        raise RuntimeError(f"logprob recomputation failed:\n{reply['error']}")
    return reply["report"]
