"""Each message as the chat template sees it, prepared once per session message instead of once per call.

Before a template runs, transformers' ``apply_chat_template`` copies the whole conversation twice (message objects
to dicts without None-valued keys, then everything into plain JSON types, reasoning aliased under the names
templates read): at 400 messages that was half of a call's render time, and it grows with the history while only
the last messages are new. Every one of those steps maps messages one at a time
(transformers 5.24, ``tokenization_utils_base.apply_chat_template`` -> ``chat_template_utils._normalize_chat_messages``
and ``render_jinja_template``: ``_plain_template_data`` and ``_alias_reasoning_fields``), so a message prepared
alone is the message prepared in its list, and a message whose JSON is unchanged since the session's last call is
prepared as before. The template then runs as ``render_jinja_template`` runs it: the compiled template rendered
with the prepared messages, the plain tools, no documents, the generation prompt, and the tokenizer's special
tokens overlaid by the template arguments, all made plain. ``tests/test_template_segments.py`` holds the text equal
to ``apply_chat_template``'s on growing and rewritten sessions for both offline models.

Templates render in transformers' immutable sandbox, so a prepared message handed to one call cannot be changed by
it and is safe to hand to the next.
"""

from __future__ import annotations

import json
from typing import Any

from nemo_polar.proxy.render.prefix import same_objects


def as_vllm_sees_it(message: dict[str, Any]) -> dict[str, Any]:
    """vLLM hands HF templates tool-call arguments as parsed objects, not JSON strings (anything but a JSON object
    becomes ``{}``: vllm/renderers/chat_utils.py ``_postprocess_messages``), in a function object whose keys come in
    the order of the OpenAI SDK's ``Function`` type it was validated as (``arguments``, then ``name``): a template that
    writes the object whole (Mistral's ``function|tojson``) writes them in that order."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    parsed = []
    for call in calls:
        fn = dict(call["function"])
        arguments = fn.pop("arguments", None)
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments else {}
            except json.JSONDecodeError:
                arguments = {}
        parsed.append({**call, "function": {"arguments": arguments if isinstance(arguments, dict) else {}, **fn}})
    return {**message, "tool_calls": parsed}


class TemplateInputs:
    """Renders a template source over messages prepared as ``apply_chat_template`` prepares them."""

    def __init__(self, tokenizer: Any) -> None:
        from transformers.utils import chat_template_utils as ctu  # the renderer only exists where it is installed

        self._ctu = ctu
        self.tokenizer = tokenizer
        # transformers >= 5.2x copies a message's reasoning into each of its names (gpt-oss's template reads only
        # ``thinking``); an engine on an older transformers does not. The local renderer follows the engine.
        self.alias_reasoning = True

    def prepare(self, message: dict[str, Any]) -> dict[str, Any]:
        ctu = self._ctu
        plain = ctu._plain_template_data(ctu._normalize_chat_messages([as_vllm_sees_it(message)]))
        return (ctu._alias_reasoning_fields(plain) if self.alias_reasoning else plain)[0]

    def prepared(
        self, messages: list[dict[str, Any]], keys: list[bytes], before: list[bytes], kept: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """``messages`` prepared, reusing ``kept`` (the last call's) where a message's JSON ``keys[i]`` equals the
        last call's ``before[i]`` (first those that are the same bytes objects, found in C)."""
        shared = same_objects(keys, before, len(kept))
        return [
            *kept[:shared],
            *(
                kept[i] if i < len(kept) and i < len(before) and key == before[i] else self.prepare(msg)
                for i, (msg, key) in enumerate(zip(messages[shared:], keys[shared:], strict=True), shared)
            ),
        ]

    def render(self, template: Any, prepared: list[dict[str, Any]], tools: Any, kwargs: dict[str, Any]) -> str:
        """``template`` (compiled in the environment ``_compile_jinja_template`` gives) rendered over ``prepared``."""
        ctu = self._ctu
        arguments = ctu._plain_template_data({**self.tokenizer.special_tokens_map, **kwargs})
        return template.render(
            messages=prepared,
            tools=ctu._plain_template_data(tools),
            documents=None,
            add_generation_prompt=True,
            **arguments,
        )
