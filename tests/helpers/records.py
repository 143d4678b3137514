"""Call records built by hand for every reconstruction edge case (Qwen3's token ids), and a real continuation-mode
session with an interleaved subagent recorded by the proxy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nemo_polar.proxy.store.records import CallRecord
from nemo_polar.reconstruct.io import load_records
from tests.conftest import ProxyHandle
from tests.helpers.clients import openai_client

EOT = 151645
_clock = iter(range(1, 10_000))


def rec(call_id: str, prompt: list[int], sampled: list[int], **kw: Any) -> CallRecord:
    fields: dict[str, Any] = {
        "call_id": call_id,
        "session_id": "s",
        "api": "chat",
        "mode": "continuation",
        "request": {"model": "m", "messages": [{"role": "user", "content": "x"}]},
        "prompt_token_ids": prompt,
        "sampled_token_ids": sampled,
        "sampled_logprobs": [-0.1 * (i + 1) for i in range(len(sampled))],
        "finish_reason": "stop",
        "started_at": float(next(_clock)),
        "complete": True,
        "render_reason": "first_call",
    }
    fields.update(kw)
    return CallRecord(**fields)


def child(call_id: str, parent: CallRecord, delta: list[int], sampled: list[int], **kw: Any) -> CallRecord:
    kw.setdefault("parent_call_id", parent.call_id)
    kw.setdefault("render_reason", "continuation")
    return rec(call_id, parent.prompt_token_ids + parent.sampled_token_ids + delta, sampled, **kw)


def subagent_and_compaction() -> list[CallRecord]:
    """A main chain m1-m2-m3 with a subagent s1-s2 interleaved and a compaction k1 at the end, in call order."""
    m1 = rec("m1", [1, 2, 3], [10, EOT])
    s1 = rec("s1", [7, 8], [40, EOT], render_reason="new_conversation")
    m2 = child("m2", m1, [20], [11, EOT])
    s2 = child("s2", s1, [41], [42, EOT])
    m3 = child("m3", m2, [21], [12, EOT])
    k1 = rec("k1", [1, 2, 99], [50, EOT], render_reason="history_diverged")
    return [m1, s1, m2, s2, m3, k1]


IM_START, ASSISTANT, NL, ENDOFTEXT = 151644, 77091, 198, 151643
HEADER = [IM_START, ASSISTANT, NL]  # "<|im_start|>assistant\n"
GLUE = [151667, 271, 151668, 271]  # "<think>\n\n</think>\n\n": Qwen3's generation prompt with thinking off
CONTEXT = [IM_START, 8948, NL, 100, 101, EOT, NL, IM_START, 872, NL, 102, 103, EOT, NL]  # system + user turns


def full(r: CallRecord) -> list[int]:
    return r.prompt_token_ids + r.sampled_token_ids


def tool_turn(n: int) -> list[int]:
    return [IM_START, 872, NL, 500 + n, 501 + n, EOT, NL]  # a "<tool_response>" user turn


def chat(call_id: str, prompt: list[int], sampled: list[int], parent: CallRecord | None = None) -> CallRecord:
    return rec(
        call_id,
        prompt,
        sampled,
        mode="chat",
        parent_call_id=parent.call_id if parent else None,
        render_reason="engine_render:continuation" if parent else "engine_render:first_call",
    )


def main_and_subagent(proxy: ProxyHandle, turns: int, **session: Any) -> tuple[Path, list[CallRecord]]:
    """A continuation-mode agent of ``turns`` calls with a subagent interleaved in its first two, recorded by the
    proxy on the real engine: the session's records file and its records."""
    made = proxy.session(sampling_overrides={"max_tokens": 8}, **session)
    client = openai_client(proxy, made["api_key"])
    main = [{"role": "system", "content": "main agent"}, {"role": "user", "content": "fix the bug"}]
    sub = [{"role": "system", "content": "explorer subagent"}, {"role": "user", "content": "find files"}]
    for turn in range(turns):
        for history in (main, sub) if turn < 2 else (main,):
            reply = client.chat.completions.create(model="local-model", messages=history)
            history += [
                {"role": "assistant", "content": reply.choices[0].message.content},
                {"role": "user", "content": f"tool output {turn}"},
            ]
    path = proxy.record_dir / f"{made['session_id']}.jsonl"
    return path, load_records([path])[made["session_id"]]
