"""The chat template runs over only the messages a call appended (SegmentedTemplate): the text must equal the whole
template's render on every call, whatever the conversation does; a template whose iterations could see more than a
bounded window of messages, or change what a later one renders, is refused; and every fallback says why."""

from __future__ import annotations

import random
from typing import Any

import pytest
from jinja2 import Environment
from transformers.utils.chat_template_utils import _compile_jinja_template

from nemo_polar.proxy.render.renderer import PROBE_TOOLS, TokenCache, _as_vllm_sees_them
from nemo_polar.proxy.render.template_segments import NotSegmentable, SegmentedTemplate, TemplateCache
from tests.helpers.renders import MODELS, NASTY, grow, renderer, sessions


def env(template: str) -> Environment:
    """The environment transformers renders chat templates in (trim_blocks, lstrip_blocks, its extensions)."""
    return _compile_jinja_template(template).environment


def rendering(e: Environment, messages: list[dict[str, Any]], **context: Any) -> Any:
    """``render(template, **marks)`` for SegmentedTemplate.render: the derived template rendered with ``context``."""
    return lambda template, **marks: template.render(messages=messages, **context, **marks)


def whole(local: Any, messages: list[dict[str, Any]], tools: Any) -> str:
    view = _as_vllm_sees_them(messages)
    return local.tokenizer.apply_chat_template(view, tools=tools, add_generation_prompt=True, tokenize=False)


@pytest.mark.parametrize("model", MODELS)
def test_segmented_text_equals_the_whole_render(model: str) -> None:
    local = renderer(model)
    assert local.segments is not None, "the model's own template is proven local"
    hows: list[str] = []
    for seed, rng, cache, messages in sessions():
        tools: Any = PROBE_TOOLS
        for turn in range(40):
            if turn == 20:  # the harness rewrites one message in the middle of the history
                messages[5] = {**messages[5], "content": "rewritten"}
            if turn == 30:
                tools = None
            ids = local.render_sync(messages, tools, {}, cache)
            assert cache.template.text == whole(local, messages, tools), (model, seed, turn, cache.template_how)
            assert ids == local.render_sync(messages, tools, {})
            hows.append(cache.template_how)
            grow(rng, messages, turn)
        assert hows[-40] == "full:first" and hows[-10] == "full:tools_or_arguments_changed"
        rewrite = hows.pop(-20)  # from the rewritten message on
        assert rewrite.startswith("messages:") and int(rewrite.split(":")[1]) == 2 * 20 + 2 - 4
    assert sum(h.startswith("messages:") for h in hows) == len(hows) - 2 * 3, hows
    assert max(int(h.split(":")[1]) for h in hows if h.startswith("messages:")) <= 3  # 2 new, 1 they change


SIMPLE = (
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}</s>{% endfor %}{% if add_generation_prompt %}>{% endif %}"
)
REFUSED = {
    "an iteration sets a namespace attribute": "{% set ns = namespace(n=0) %}{% for m in messages %}"
    "{% set ns.n = ns.n + 1 %}{{ ns.n }}{% endfor %}",
    "loop.length": "{% for m in messages %}{{ loop.length }}{% endfor %}",
    "reads messages other than by loop.index0": "{% for m in messages %}{{ messages[0].content }}{% endfor %}",
    "breaks the loop": "{% for m in messages %}{% if m.role == 'x' %}{% break %}{% endif %}{{ m.content }}{% endfor %}",
    "2 top-level loops": SIMPLE + SIMPLE,
    "calls strftime_now": "{% for m in messages %}{{ strftime_now('%Y') }}{% endfor %}",
    "uses messages as a whole": "{% macro n() %}{{ messages | length }}{% endmacro %}"
    "{% for m in messages %}{{ n() }}{% endfor %}",
    "loop.changed": "{% for m in messages %}{% if loop.changed(m.role) %}{{ m.role }}{% endif %}{% endfor %}",
    "uses loop as a whole": "{% macro f(l) %}{{ l.length }}{% endmacro %}{% for m in messages %}{{ f(loop) }}"
    "{% endfor %}",
    # An inner loop's filter and else see the outer loop (Jinja scopes them outside the inner body).
    "reads loop.revindex": "{% for m in messages %}{% for c in m.calls if loop.revindex > 1 %}{{ c }}{% endfor %}"
    "{% endfor %}",
    "reads loop.length": "{% for m in messages %}{% for c in m.calls %}{{ c }}{% else %}{{ loop.length }}"
    "{% endfor %}{% endfor %}",
}


@pytest.mark.parametrize("why", list(REFUSED))
def test_templates_an_iteration_could_see_past_its_window_are_refused(why: str) -> None:
    template = REFUSED[why]
    with pytest.raises(NotSegmentable, match=why):
        SegmentedTemplate.derive(template, env(template))


def test_an_environment_that_lets_templates_mutate_values_is_refused() -> None:
    with pytest.raises(NotSegmentable, match="change a list or dict"):
        SegmentedTemplate.derive(SIMPLE, Environment())


# The same loop under each whitespace control the tags allow, on lines of their own or inline.
SHAPES = [
    "{%- for m in messages -%}\n  <{{ m.role }}>{{ m.content }}\n{%- endfor -%}\n{{ '>' if add_generation_prompt }}",
    "head\n{% for m in messages %}\n    <{{ m.role }}>\n    {{ m.content }}\n  {% endfor %}\ntail",
    "{% for m in messages +%}\n <{{ m.role }}>{% if loop.last %}last{% endif %}\n{%+ endfor %}\n",
    "{%- for m in messages %}{% for c in m.get('calls', []) %}{{ loop.index }}{{ c }}{% endfor %}"
    "{%- if not loop.first and messages[loop.index0 - 1].role == m.role %}+{% endif %}"
    "{%- if not loop.last and messages[loop.index0 + 2] is defined %}~{% endif %}{{ m.content }}{% endfor %}",
]


@pytest.mark.parametrize("shape", range(len(SHAPES)))
def test_every_whitespace_shape_renders_as_the_original(shape: int) -> None:
    template = SHAPES[shape]
    e = env(template)
    seg = SegmentedTemplate.derive(template, e)
    assert seg.lookahead == (2 if shape == 3 else 1)
    rng = random.Random(shape)
    cache = TemplateCache()
    messages: list[dict[str, Any]] = []
    for turn in range(12):
        role = rng.choice(["user", "assistant", "tool"])
        messages = [*messages, {"role": role, "content": rng.choice(NASTY) + f" {turn}", "calls": [turn] * (turn % 3)}]
        text, how = seg.render(
            rendering(e, messages, add_generation_prompt=True),
            messages,
            None,
            {},
            cache,
        )
        assert text == e.from_string(template).render(messages=messages, add_generation_prompt=True), (turn, how)
        lookahead = seg.lookahead
        assert how == (
            "full:first" if turn == 0 else "full:history_changed" if turn <= lookahead else f"messages:{lookahead + 1}"
        )


# Every loop attribute an iteration may read, the outer loop's in an inner loop's filter and else included.
EVERY_ATTRIBUTE = (
    "{%- for m in messages -%}[{{ loop.index0 }}/{{ loop.index }}/{{ loop.first }}/{{ loop.last }}/{{ loop.depth }}"
    "/{{ loop.depth0 }} {{ m.role }}:{{ m.content }} prev={{ loop.previtem.role if loop.previtem is defined }}"
    " next={{ loop.nextitem.role if loop.nextitem is defined }}"
    "{%- for c in m.calls if c + loop.index0 > 2 %}({{ loop.index }}:{{ c }}){% else %}(none at {{ loop.index }})"
    "{%- endfor %}{{ messages[loop.index0 - 1].role if not loop.first }}]"
    "{%- endfor -%}{{ '>' if add_generation_prompt }}"
)


class Untouchable(dict):
    """A message the template must not read: any access fails the render."""

    def __getattribute__(self, name: str) -> Any:
        raise AssertionError(f"an iteration that was not rendered read .{name}")

    def __getitem__(self, key: Any) -> Any:
        raise AssertionError(f"an iteration that was not rendered read [{key!r}]")


class History(list):
    """The messages as handed to the template: iterating over all of them fails the render."""

    def __iter__(self) -> Any:
        raise AssertionError("the template iterated over the whole history")


def test_iterations_before_the_window_are_not_run_and_the_loop_reads_as_the_whole_one() -> None:
    """Only the new messages' iterations run: the history is not iterated over, and the older messages (but the
    one ``loop.previtem`` and ``messages[loop.index0 - 1]`` read) are handed to the template as values that fail
    when read; and those iterations see index, first, previous and next item as in the whole loop."""
    e = env(EVERY_ATTRIBUTE)
    seg = SegmentedTemplate.derive(EVERY_ATTRIBUTE, e)
    rng = random.Random(7)
    cache = TemplateCache()
    messages: list[dict[str, Any]] = []
    hows = []
    for turn in range(10):
        for _ in range(rng.randrange(1, 4)):
            role = rng.choice(["user", "assistant", "tool"])
            messages = [*messages, {"role": role, "content": rng.choice(NASTY), "calls": list(range(turn % 4))}]
        start = len(cache.messages) - seg.lookahead
        seen = History(m if i >= start - 1 or not cache.starts else Untouchable() for i, m in enumerate(messages))
        text, how = seg.render(rendering(e, seen, add_generation_prompt=True), messages, None, {}, cache)
        assert text == e.from_string(EVERY_ATTRIBUTE).render(messages=messages, add_generation_prompt=True), how
        hows.append(how)
    assert hows[0] == "full:first" and all(h.startswith("messages:") for h in hows[1:]), hows


def test_a_prelude_value_an_iteration_reads_forces_the_whole_render_when_it_changes() -> None:
    """The last user message's index, found by a reversed scan before the loop (as Qwen3's template does), decides
    how later turns render: a new user message changes it, so earlier iterations are rendered again."""
    template = (
        "{%- set ns = namespace(last_user=-1) -%}"
        "{%- for m in messages | reverse -%}{%- if m.role == 'user' and ns.last_user < 0 -%}"
        "{%- set ns.last_user = messages | length - 1 - loop.index0 -%}{%- endif -%}{%- endfor -%}"
        "{%- for m in messages -%}{%- if loop.index0 > ns.last_user -%}[after]{%- endif -%}{{ m.content }}|"
        "{%- endfor -%}"
    )
    e = env(template)
    seg = SegmentedTemplate.derive(template, e)
    cache = TemplateCache()
    messages: list[dict[str, Any]] = [{"role": "user", "content": "u0"}]
    hows = []
    for role in ["assistant", "tool", "assistant", "user", "assistant", "tool"]:
        messages = [*messages, {"role": role, "content": role[0]}]
        text, how = seg.render(rendering(e, messages), messages, None, {}, cache)
        assert text == e.from_string(template).render(messages=messages)
        hows.append(how)
    assert hows == ["full:first", "messages:2", "messages:2", "full:prelude_changed", "messages:2", "messages:2"]


def test_a_message_holding_the_mark_is_rendered_whole() -> None:
    local = renderer(MODELS[0])
    assert local.segments is not None
    cache = TokenCache()
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yes"}]
    local.render_sync(messages, None, {}, cache)
    messages += [{"role": "user", "content": f"echo {local.segments.mark}"}]
    assert local.render_sync(messages, None, {}, cache) == local.render_sync(messages, None, {})
    assert cache.template_how == "full:NotSegmentable" and cache.template.text == ""
    messages += [{"role": "assistant", "content": "ok"}]
    assert local.render_sync(messages, None, {}, cache) == local.render_sync(messages, None, {})
    # The mark stays in the history (as a prelude that drops messages stays, Llama 3.1's): the session renders whole
    # from then on, without deriving the segments again, on the messages it prepared before.
    assert cache.template_how == "full:not_segmentable" and cache.template.whole_only


def test_unchanged_means_the_same_json_not_python_equality() -> None:
    """``True == 1 == 1.0`` in Python, and dicts are equal in any key order, but a template renders each its way."""
    e = env(SIMPLE)
    seg = SegmentedTemplate.derive(SIMPLE, e)
    cache = TemplateCache()
    before = [{"role": "user", "content": 1}, {"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}]
    seg.render(rendering(e, before, add_generation_prompt=True), before, None, {}, cache)
    for changed in (True, 1.0):
        later = [{"role": "user", "content": changed}, *before[1:], {"role": "assistant", "content": "c"}]
        text, how = seg.render(rendering(e, later, add_generation_prompt=True), later, None, {}, cache)
        assert text == e.from_string(SIMPLE).render(messages=later, add_generation_prompt=True)
        assert how == "full:history_changed"
    reordered = [{"content": True, "role": "user"}, *later[1:], {"role": "user", "content": "d"}]
    assert seg.render(rendering(e, reordered), reordered, None, {}, cache)[1] == "full:history_changed"


@pytest.mark.parametrize("model", MODELS)
def test_messages_are_prepared_once_and_as_transformers_prepares_them(model: str) -> None:
    """The template sees each message as apply_chat_template hands it over (None-valued keys dropped, reasoning
    under the names templates read, tool-call arguments parsed as vLLM does), prepared on the call that brought it
    and reused while its JSON is unchanged; a message changed in place, even only from true to 1, is prepared
    anew."""
    local = renderer(model)
    call = {"id": "c0", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls", "all": true}'}}
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent.", "name": None},
        {"role": "user", "content": "fix it"},
        {"role": "assistant", "content": None, "reasoning": "look first", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c0", "content": "a.py"},
    ]
    cache = TokenCache()
    local.render_sync(messages, PROBE_TOOLS, {}, cache)
    assert cache.template.text == whole(local, messages, PROBE_TOOLS)
    first = list(cache.template.prepared)
    assert "name" not in first[0] and "content" not in first[2]  # None-valued keys dropped
    assert first[2]["reasoning_content"] == "look first" and first[2]["tool_calls"][0]["function"]["arguments"] == {
        "command": "ls",
        "all": True,
    }
    messages += [{"role": "assistant", "content": "done", "thinking": "checked"}, {"role": "user", "content": "ok"}]
    local.render_sync(messages, PROBE_TOOLS, {}, cache)
    assert cache.template.text == whole(local, messages, PROBE_TOOLS)
    assert cache.template_how.startswith("messages:")
    assert all(a is b for a, b in zip(first, cache.template.prepared, strict=False))  # reused, not copied again
    again = list(cache.template.prepared)
    changed = {**call, "function": {**call["function"], "arguments": '{"command": "ls", "all": 1}'}}
    messages[2] = {**messages[2], "tool_calls": [changed]}
    messages.append({"role": "assistant", "content": "again"})
    local.render_sync(messages, PROBE_TOOLS, {}, cache)
    assert cache.template.text == whole(local, messages, PROBE_TOOLS)
    prepared = cache.template.prepared
    assert prepared[2] is not again[2] and prepared[2]["tool_calls"][0]["function"]["arguments"]["all"] == 1
    assert prepared[0] is again[0] and prepared[1] is again[1]
