"""The trainer-side logprob check: recompute every trainable token's logprob with transformers under the engine's
own weights and report the agreement (mean/max |Δ|, KL). The model runs in the engine virtualenv, so the work is
done by :mod:`.recompute_worker` in a subprocess there."""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from nemo_polar.engine.launcher import engine_python
from nemo_polar.reconstruct.io import write_traces
from nemo_polar.reconstruct.trace import Trace


def recompute_logprobs(traces: list[Trace], model_dir: Path) -> dict[str, Any]:
    """Run :mod:`.recompute_worker` in the engine virtualenv (torch lives there, not here)."""
    script = Path(__file__).with_name("recompute_worker.py")
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
