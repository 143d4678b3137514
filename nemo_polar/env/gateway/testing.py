"""Public hooks put to use for tests and load tests. :class:`ChatLoopGateway`: a lightweight session for load tests
of the gateway and its scale-out: instead of a Node CLI per session, a
short agent loop of real chat calls through a real proxy session to the real engine (records and all), and an
instant grade. It measures the gateway, the proxy and the engine — not how fast a CLI starts.

``harness_options`` of a :class:`SessionRequest` shape the loop: ``turns`` (calls, default 2), ``max_tokens``
(default 8), ``hold_s`` (a pause after each call, default 0). Odd-numbered calls stream, so both response paths run.
"""

from __future__ import annotations

import json
import threading
import time

import httpx

from nemo_polar.env.gateway.gateway import Gateway
from nemo_polar.env.gateway.models import SessionRequest
from nemo_polar.env.runtime.attempt import AttemptDir
from nemo_polar.env.runtime.session import SessionResult, close_quietly, write_session
from nemo_polar.proxy.http.client import ProxyClient, thread_client
from nemo_polar.proxy.http.pool import session_proxy
from nemo_polar.rewards.grader import GradeResult


class InstantGrade:
    """Stands in for the evaluator: every patch resolves its instance."""

    def __init__(self, instance_id: str) -> None:
        self.instance_id = instance_id

    def grade(self, patch: str) -> GradeResult:
        return GradeResult(
            instance_id=self.instance_id, reward=1.0, resolved=True, status="resolved", mask_sample=False
        )

    def close(self) -> None:
        pass


def reply_text(resp: httpx.Response) -> str:
    """The assistant text of a chat completion, streamed (SSE) or whole."""
    if not resp.headers.get("content-type", "").startswith("text/event-stream"):
        return resp.json()["choices"][0]["message"]["content"] or ""
    parts = []
    for line in resp.text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            parts += [c.get("delta", {}).get("content") or "" for c in json.loads(line[6:]).get("choices", [])]
    return "".join(parts)


def chat_loop(
    proxy: ProxyClient,
    request: SessionRequest,
    attempt: AttemptDir,
    cancel: threading.Event,
) -> SessionResult:
    """One session's loop, its chat calls on this thread's pooled client (``thread_client``)."""
    options = request.harness_options
    meta = {"request_id": request.request_id}
    config = {"sampling_overrides": {"max_tokens": options.get("max_tokens", 8)}, "metadata": meta}
    session_id, key = proxy.create_session(config)
    history = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "Fix the bug."}]
    try:
        client = thread_client()
        for turn in range(options.get("turns", 2)):
            if cancel.is_set():
                break
            body = {"model": "local-model", "messages": history, "stream": turn % 2 == 1}
            headers = {"authorization": f"Bearer {key}"}
            resp = client.post(f"{proxy.url}/v1/chat/completions", json=body, headers=headers, timeout=600)
            resp.raise_for_status()
            reply = {"role": "assistant", "content": reply_text(resp)}
            history += [reply, {"role": "user", "content": f"ok {turn}"}]
            time.sleep(options.get("hold_s", 0.0))
        records = proxy.records(session_id)
    finally:
        close_quietly(proxy, session_id)
    result = SessionResult(
        session_id=session_id,
        harness="chat_loop",
        harness_version="0",
        runtime="none",
        instance_id=request.instance.instance_id,
        status="completed",
        exit_code=0,
        session_dir=attempt.root,
        records=records,
        calls=len(records),
    )
    write_session(result)
    return result


class ChatLoopGateway(Gateway):
    """The real gateway (pools, budgets, cancellation, state, delivery) with chat-loop sessions and instant grades."""

    def prepare(self, request: SessionRequest, attempt: AttemptDir) -> InstantGrade:
        attempt.root.mkdir(parents=True, exist_ok=True)
        return InstantGrade(request.instance.instance_id)

    def run_harness(
        self, request: SessionRequest, attempt: AttemptDir, budget: float, cancel: threading.Event
    ) -> SessionResult:
        proxy = request.proxy or session_proxy(self.proxy, request.request_id)
        return chat_loop(proxy, request, attempt, cancel)
