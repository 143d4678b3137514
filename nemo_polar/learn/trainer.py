"""The parts both loops drive: the policy engine, the trainer process and the weight sync between them. The
trainer is ``grpo_worker`` in the engine virtualenv (torch + transformers), spoken to in JSON lines; its optimiser
state lives across steps."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from nemo_polar.engine.launcher import EngineProcess, EngineSpec, engine_python, free_port
from nemo_polar.engine.weights import load_weights
from nemo_polar.proxy.http.client import ProxyClient

WORKER = Path(__file__).with_name("grpo_worker.py")


class TrainerProcess:
    """The ``grpo_worker`` process in the engine virtualenv (its optimiser state lives across steps)."""

    def __init__(self, log: Path) -> None:
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log = log.open("ab")
        self.proc = subprocess.Popen(
            [str(engine_python()), "-W", "ignore", str(WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )

    def call(self, op: str, **kw: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"trainer exited with code {self.proc.wait()} (log: {self._log.name})")
        reply = json.loads(line)
        if not reply.pop("ok"):
            raise RuntimeError(f"trainer {op}: {reply['error']}")
        return reply

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


def drop_older(checkpoint: Path) -> None:
    """Keep only the checkpoint the engine now serves (each is a full copy of the weights)."""
    for old in checkpoint.parent.iterdir():
        if old != checkpoint and old.name.startswith("v"):
            shutil.rmtree(old, ignore_errors=True)


def start_engine(model: str, dtype: str | None, out: Path) -> tuple[EngineProcess, str]:
    """The policy engine a loop samples from, with vLLM's in-place weight reload on; its log in ``out``."""
    spec = EngineSpec(model=model, port=free_port(), dtype=dtype, weight_sync=True)
    engine = EngineProcess(spec, log_path=out / "engine.log")
    return engine, engine.start(timeout=600)


def sync_weights(proxy: ProxyClient, engine_url: str, checkpoint: Path, version: int) -> None:
    """The weight sync: the proxy pauses (in-flight calls drain, new ones wait), the engine reloads ``checkpoint``
    in place, the proxy resumes with ``version``, which every later record carries; older checkpoints go."""
    proxy.pause(timeout_s=120)
    load_weights(engine_url, checkpoint)
    proxy.resume(policy_version=version)
    drop_older(checkpoint)
