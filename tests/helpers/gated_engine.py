"""A stub engine (no model) whose answers a test can hold: vLLM's non-streamed ``/v1/completions`` in shape, a fixed
reply, the prompt's ids echoed. While the gate is shut every completion that arrives is counted and held until the
test opens it, so a test knows exactly which calls are in flight at the engine when it acts (a weight sync)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from fastapi import FastAPI, Request

REPLY_IDS = [9707, 13, 151645]  # "Hello." and the end of turn (Qwen's vocabulary)


class Gate:
    def __init__(self) -> None:
        self.open = threading.Event()
        self.open.set()
        self._arrived = 0
        self._changed = threading.Condition()

    def arrive(self) -> None:
        with self._changed:
            self._arrived += 1
            self._changed.notify_all()

    def wait_arrived(self, count: int, timeout_s: float = 120) -> None:
        """Until ``count`` completions have reached the engine in all (a bound only against a hang)."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while self._arrived < count:
                assert self._changed.wait(max(0.0, deadline - time.monotonic())), f"{self._arrived} of {count} arrived"

    @property
    def arrived(self) -> int:
        with self._changed:
            return self._arrived


def gated_engine(gate: Gate) -> FastAPI:
    app = FastAPI()

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"data": [{"id": "tiny-qwen3", "max_model_len": 4096}]}

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict[str, Any]:
        body = await request.json()
        return {"tokens": [151645] if body.get("prompt") == "<|im_end|>" else [151644, 872, 198, 151645]}

    @app.post("/v1/completions")
    async def completions(request: Request) -> dict[str, Any]:
        body = await request.json()
        if "x-polar-probe" in request.headers:  # the proxy's own probe: not a model call
            return {"choices": [{"index": 0, "text": "", "token_ids": [], "finish_reason": "stop"}]}
        gate.arrive()
        while not gate.open.is_set():
            await asyncio.sleep(0.005)
        choice = {
            "index": 0,
            "text": "Hello.",
            "token_ids": REPLY_IDS,
            "prompt_token_ids": body["prompt"],
            "finish_reason": "stop",
            "logprobs": {"token_logprobs": [-0.5] * len(REPLY_IDS)},
        }
        return {"choices": [choice]}

    return app
