"""A helper process in the engine virtualenv (where vLLM and torch live) that answers JSON lines: started on first
use, one request at a time (a lock serialises the exchange), restarted if it died. Its first line says it is ready;
every reply carries ``ok``, and ``error`` when not ok. The parser worker and the logprob recompute worker use it."""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path
from typing import Any

from nemo_polar.engine.launcher import engine_python


class WorkerProcessError(RuntimeError):
    pass


class WorkerProcess:
    def __init__(self, script: Path, name: str, python: Path | None = None) -> None:
        self.script, self.name, self.python = script, name, python
        self._proc: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()

    def _start(self) -> subprocess.Popen[str]:
        if self._proc is None or self._proc.poll() is not None:
            cmd = [str(self.python or engine_python()), str(self.script)]
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
            assert proc.stdout is not None
            if not proc.stdout.readline():
                raise WorkerProcessError(f"the {self.name} exited on start ({cmd[0]}: is the engine venv there?)")
            self._proc = proc
        return self._proc

    def call(self, message: dict[str, Any]) -> dict[str, Any]:
        """The reply to ``message``; its ``error`` raised when it is not ok."""
        with self._lock:
            proc = self._start()
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(json.dumps(message) + "\n")
            line = proc.stdout.readline()
        if not line:
            raise WorkerProcessError(f"the {self.name} exited")
        reply = json.loads(line)
        if not reply.get("ok"):
            raise WorkerProcessError(reply.get("error", f"the {self.name} failed"))
        return reply

    def close(self) -> None:
        """End the process (its stdin closed: it finishes the request in hand and exits)."""
        if self._proc is not None:
            if self._proc.stdin is not None:
                self._proc.stdin.close()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
