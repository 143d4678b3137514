"""Per-call render cost at real session sizes: a session of ``--calls`` calls whose history grows to ``--context``
tokens (each call appends a sampled assistant turn and a tool result), rendered as the proxy renders it in
continuation mode (Qwen3 tokenizer and chat template of tiny-qwen3, in process; no engine: this is the proxy's own
CPU work). Two ways side by side on the same renders: the whole template rendered and its whole text tokenized on
every call, and the proxy's way — the template run over the new messages only (``SegmentedTemplate``) and only the
text they add tokenized (``IncrementalEncoder``) — whose ids must equal the full ones on every call. Each way runs
the session in a pass of its own (a proxy does one or the other: run in turns, the full way's leftovers, which grow
with the context, slowed the other's next call about 2x), and each timed render starts from caches that hold other
work, as in a proxy serving many sessions: the same ``--evict`` MiB are copied before each. Printed:
ms per call at the last calls, and the exponent of per-call time against context length (0 = flat, 1 = linear in
the context). The last line is the incremental render's ms per call at full size.

    python -m bench.render_scale [--calls 200] [--context 65536] [--evict 64] [--model tiny-qwen3_5] [--text-only]

``--model`` takes any built model directory's name (a model family's stand-in renders with that family's template).
``--text-only`` is the session for a template that renders no tools (Gemma 3, DeepSeek V3.1's own): per call an
assistant text turn and a user message, no tools offered.
"""

from __future__ import annotations

import argparse
import random
import time
from array import array
from collections.abc import Iterator
from typing import Any

from bench.common import fit_exponent, report
from nemo_polar.engine.families import CHATML
from nemo_polar.paths import cache_dir
from nemo_polar.proxy.render.prepared import as_vllm_sees_it
from nemo_polar.proxy.render.renderer import PROBE_TOOLS, LocalRenderer, TokenCache

DEFAULT_MODEL = CHATML.stand_in  # the project's own
WORDS = [
    "def",
    "class",
    "return",
    "import",
    "self",
    "value",
    "error",
    "test",
    "file",
    "path",
    "the",
    "of",
    "and",
    "to",
    "in",
    "for",
    "if",
    "else",
    "while",
]


def text(rng: random.Random, tokens: int) -> str:
    lines = []
    while tokens > 0:
        n = rng.randrange(4, 14)
        lines.append(" ".join(rng.choice(WORDS) for _ in range(n)))
        tokens -= n + 1
    return "\n".join(lines)


def session(calls: int, context: int, text_only: bool = False) -> Iterator[list[dict[str, Any]]]:
    """The conversation at each call: a long system prompt, then per call a sampled turn and a tool result (a user
    message where ``text_only``)."""
    rng = random.Random(0)
    step = context // calls
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. " + text(rng, 1500)},
        {"role": "user", "content": "Fix the failing test."},
    ]
    for i in range(calls):
        yield messages
        if text_only:
            messages.append({"role": "assistant", "content": text(rng, step // 4)})
            messages.append({"role": "user", "content": text(rng, 3 * step // 4)})
            continue
        ident = f"call{i:05d}"  # 9 letters and digits: the one id form every template takes (Mistral's no other)
        call = {"id": ident, "type": "function", "function": {"name": "bash", "arguments": '{"command":"pytest"}'}}
        messages.append({"role": "assistant", "content": text(rng, step // 4), "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": ident, "content": text(rng, 3 * step // 4)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--context", type=int, default=65536)
    parser.add_argument("--evict", type=int, default=64, help="MiB copied before each timed render")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="a model under $POLAR_CACHE/models (its template)")
    parser.add_argument("--text-only", action="store_true", help="no tools: for a template that renders none")
    args = parser.parse_args()
    tools = None if args.text_only else PROBE_TOOLS
    scratch, other = bytearray(args.evict << 20), bytes(args.evict << 20)

    def evict() -> None:
        scratch[:] = other  # no allocation: only what the caches hold changes

    local = LocalRenderer(cache_dir() / "models" / args.model)
    full_ids: list[array] = []
    rows: list[list[float]] = []  # [context tokens, template ms, full ms, incremental ms]
    for messages in session(args.calls, args.context, args.text_only):  # the full way, as the proxy did before
        view = [as_vllm_sees_it(m) for m in messages]  # tool-call arguments as mappings, as vLLM renders them
        evict()
        t0 = time.perf_counter()
        local.tokenizer.apply_chat_template(view, tools=tools, add_generation_prompt=True, tokenize=False)
        t1 = time.perf_counter()
        evict()
        t2 = time.perf_counter()
        full = local.render_sync(messages, tools, {})
        rows.append([len(full), (t1 - t0) * 1e3, (time.perf_counter() - t2) * 1e3, 0.0])
        full_ids.append(array("i", full))
    cache = TokenCache()
    tails = segmented = 0
    for i, messages in enumerate(
        session(args.calls, args.context, args.text_only)
    ):  # the same session, the proxy's way
        evict()
        t0 = time.perf_counter()
        incremental = local.render_sync(messages, tools, {}, cache)
        rows[i][3] = (time.perf_counter() - t0) * 1e3
        assert array("i", incremental) == full_ids[i], f"call {i}: ids differ from the full tokenization ({cache.how})"
        tails += cache.how.startswith("tail:")
        segmented += cache.template_how.startswith("messages:")
    last = rows[-10:]
    ctx = sum(r[0] for r in last) / len(last)
    template_ms, full_ms, inc_ms = (sum(r[k] for r in last) / len(last) for k in (1, 2, 3))
    later = [r for r in rows if r[0] >= rows[-1][0] / 8]  # past the fixed system prompt's share
    exp_full = fit_exponent([(r[0], r[2]) for r in later])
    exp_inc = fit_exponent([(r[0], r[3]) for r in later])
    print(
        f"{args.calls} calls, context {rows[0][0]} -> {rows[-1][0]} tokens; {tails}/{args.calls} tokenized the tail, "
        f"{segmented}/{args.calls} ran the template over the new messages only"
    )
    print(f"last 10 calls (~{ctx:.0f} tokens): whole template alone {template_ms:.1f} ms")
    print(f"  full tokenization   {full_ms:7.1f} ms/call   exponent vs context {exp_full:.2f}")
    print(f"  incremental         {inc_ms:7.1f} ms/call   exponent vs context {exp_inc:.2f}")
    figures = {
        "context_tokens": round(ctx),
        "full_ms": round(full_ms, 2),
        "incremental_ms": round(inc_ms, 2),
        "speedup": round(full_ms / inc_ms, 1),
        "exponent_full": round(exp_full, 2),
        "exponent_incremental": round(exp_inc, 2),
        "template_on_new_messages_only": segmented == args.calls - 1,  # after the first; else over the whole history
    }
    which = "" if args.model == DEFAULT_MODEL else f" ({args.model})"
    report(
        "render_scale",
        figures,
        f"per-call render at {ctx / 1000:.0f}k tokens{which}: {inc_ms:.1f} ms incremental vs {full_ms:.1f} ms full "
        f"({full_ms / inc_ms:.1f}x; exponent {exp_inc:.2f} vs {exp_full:.2f})",
    )


if __name__ == "__main__":
    main()
