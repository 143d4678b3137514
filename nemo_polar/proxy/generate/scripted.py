"""The scripted policy's turns, as the engine's token ids.

Tests and demos hold a session's model turns to a script (see :class:`~nemo_polar.proxy.store.sessions.SessionConfig`).
A :class:`~nemo_polar.proxy.store.sessions.ScriptTurn` is written by the model's own chat template, so a script runs on
any model family: the engine's render of a one-line conversation with its generation prompt is a prefix of its render of
the same conversation closed by the turn, and what follows the prefix is the turn exactly as the template writes it (its
tool-call format, its reasoning markers, its end of turn). The engine's forced-tokens logits processor
(``engine/vllm_plugins/polar_forced_tokens.py``) lets the model sample only those ids; vLLM stops at the first stop
token among them, or at the one the template writes next. The ids and logprobs are still the engine's own samples."""

from __future__ import annotations

import contextlib
from typing import Any

from nemo_polar.proxy.conversation import CallIdForm
from nemo_polar.proxy.engine_client import EngineClient
from nemo_polar.proxy.errors import ProxyError
from nemo_polar.proxy.store.sessions import FORCED_IDS, THEN_STOP, ScriptTurn, Session

OPENING = [{"role": "user", "content": "Go on."}]
PROBE_TEXT = "Scripted turns are held to these tokens."
REASONING = "The script gives this turn."


async def engine_extra(engine: EngineClient, session: Session, call_ids: CallIdForm = "as_sent") -> dict[str, Any]:
    """What is merged into the engine request of the session's next call (its script entry, if any); ``call_ids``:
    the form of call id the model's format takes (TemplateTraits)."""
    position = session.answered_calls()
    script = session.config.script
    step = script[position] if position < len(script) else None
    if not isinstance(step, ScriptTurn):
        return session.config.engine_extra(position)
    if position not in session.forced:
        await check_forcing(engine)
        kwargs = session.config.chat_template_kwargs
        session.forced[position] = await turn_ids(engine, step, kwargs, position, call_ids)
    return session.config.engine_extra(position, session.forced[position])


async def turn_ids(
    engine: EngineClient,
    turn: ScriptTurn,
    template_kwargs: dict[str, Any],
    position: int,
    call_ids: CallIdForm = "as_sent",
) -> dict[str, Any]:
    """The forced-tokens processor's fields for ``turn``: its ids and the token the template writes after it.

    A reasoning model's generation prompt may open its reasoning (GLM's ``<think>``) while its template writes a turn
    without reasoning with no opening at all: such a turn only follows that prompt with some reasoning in it, so a
    turn without any is written again with :data:`REASONING`. Where the template ends a turn with no token of its own
    (GLM: what comes next, ``<|observation|>`` or ``<|user|>``, both stop tokens), the next message's first token is
    the stop to end on, so the history the template writes next continues what was sampled."""
    info = await engine.info()
    candidates = [turn] if turn.reasoning is not None else [turn, turn.model_copy(update={"reasoning": REASONING})]

    async def text(messages: list[dict[str, Any]], generation_prompt: bool) -> str:
        ids = await engine.tokenize_chat(messages, None, template_kwargs, generation_prompt=generation_prompt)
        # Compared as text: a whole render may tokenise a seam differently ("\n" + "\n" as one "\n\n" token), while
        # the model samples its turn after the prompt's own ids.
        return await engine.detokenize(ids)

    async def ids(part: str) -> list[int]:
        body = {"model": info.model, "prompt": part, "add_special_tokens": False}
        return list((await engine.post_json("/tokenize", body))["tokens"])

    try:
        prompt = await text(OPENING, True)
        for candidate in candidates:
            message = candidate.message(call_ids)
            written = await text([*OPENING, message], False)
            if len(written) <= len(prompt) or not written.startswith(prompt):
                continue
            fields: dict[str, Any] = {FORCED_IDS: await ids(written[len(prompt) :])}
            with contextlib.suppress(ProxyError):  # a template that takes no such next message: any stop ends it
                after = await text([*OPENING, message, _next_message(message)], False)
                if after.startswith(written) and len(after) > len(written):
                    fields[THEN_STOP] = (await ids(after[len(written) :]))[0]
            return fields
    except ProxyError as exc:
        raise ProxyError(
            400, f"the model's chat template cannot write script entry {position}: {exc.message}", code="script_invalid"
        ) from None
    raise ProxyError(
        400,
        f"the model's chat template does not write script entry {position} as a continuation of its generation "
        "prompt, so no sample can produce it",
        code="script_invalid",
    )


def _next_message(message: dict[str, Any]) -> dict[str, Any]:
    """What follows the turn in a session: the first call's result, or the user's next message."""
    if message.get("tool_calls"):
        return {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "ok"}
    return {"role": "user", "content": "Go on."}


async def check_forcing(engine: EngineClient) -> None:
    """Once per engine: does it hold a request to given ids? (An engine without the processor ignores the field.)"""
    if engine.forcing_verified:
        return
    info = await engine.info()
    probe = {"model": info.model, "prompt": PROBE_TEXT, "add_special_tokens": False}
    ids = (await engine.post_json("/tokenize", probe))["tokens"]
    target = ids[::-1]  # no model samples this by chance
    body = {
        "model": info.model,
        "prompt": ids,
        "max_tokens": len(target),
        "temperature": 0,
        "return_token_ids": True,
        "vllm_xargs": {FORCED_IDS: target},
    }
    try:
        got = (await engine.post_json("/v1/completions", body, probe="forced-tokens"))["choices"][0].get("token_ids")
    except ProxyError as exc:
        got = exc.message
    if got != target:
        raise ProxyError(
            500,
            "the engine does not hold a request to given token ids, which scripted turns need: start it with "
            "`--logits-processors polar_forced_tokens:ForcedTokens` and nemo_polar/engine/vllm_plugins on its "
            f"PYTHONPATH (`polar engine up` does both); it answered {str(got)[:200]}",
            code="script_unsupported",
        )
    engine.forcing_verified = True
