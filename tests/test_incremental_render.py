"""The proxy tokenizes only what a render appended to the session's previous one (IncrementalEncoder): the ids must
equal the full tokenization of every render, whatever the conversation does — grows, rewrites its history (the
Qwen3 template drops earlier turns' reasoning), carries special-token text, combining characters or odd whitespace
right after a turn boundary — for each offline model's real tokenizer and chat template."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any, ClassVar

import pytest

from nemo_polar.proxy.render.renderer import PROBE_TOOLS, IncrementalEncoder, TokenCache
from tests.helpers.renders import MODELS, grow, renderer, sessions


@pytest.mark.parametrize("model", MODELS)
def test_incremental_ids_equal_the_full_tokenization(model: str) -> None:
    local = renderer(model)
    assert local.incremental is not None, "the model's tokenizer has boundary tokens"
    hows: list[str] = []
    for seed, rng, cache, messages in sessions():
        for turn in range(40):
            tools = PROBE_TOOLS if seed != 1 else None
            full = local.render_sync(messages, tools, {})  # no cache: the whole text tokenized
            ids = local.render_sync(messages, tools, {}, cache)
            assert ids == full, (model, seed, turn, cache.how)
            for token in local.incremental.kinds:  # where each boundary token ends, as the cut looks it up
                scanned = [i + 1 for i, t in enumerate(full) if t == token]
                assert cache.token_ends(ids, token) in (scanned, None), (model, seed, turn, token)
            assert cache.token_ends(list(ids), next(iter(local.incremental.kinds))) is None  # not the last render
            hows.append(cache.how)
            grow(rng, messages, turn)
    tails = sum(h.startswith("tail:") for h in hows)
    assert hows[0] == "full:first" and tails >= len(hows) - 3 * 2, hows  # all but each session's first call(s)


def test_where_no_core_is_spare_a_render_that_extends_the_last_runs_on_the_loop() -> None:
    """``appends_in_thread`` off (ProxyConfig.helper_threads): a session's first render runs in a thread (a whole
    history), each that extends the last on the event loop's own thread; the ids are the same either way."""
    local, threads = renderer(MODELS[0]), []
    render_sync = local.render_sync

    def traced(*args: Any) -> list[int]:
        threads.append(threading.get_ident())
        return render_sync(*args)

    async def session(in_thread: bool) -> list[list[int]]:
        local.appends_in_thread, threads[:] = in_thread, []
        _, rng, cache, messages = next(sessions(1))
        rendered = []
        for turn in range(6):
            rendered.append(await local.render(messages, None, {}, cache))
            grow(rng, messages, turn)
        loop_thread = threading.get_ident()
        assert threads[0] != loop_thread and all((t == loop_thread) != in_thread for t in threads[1:]), in_thread
        return rendered

    local.render_sync = traced  # type: ignore[method-assign]
    assert asyncio.run(session(False)) == asyncio.run(session(True))


def test_a_cut_is_never_made_where_it_cannot_be_proven() -> None:
    """A rewritten history with no boundary left in common, and text whose ids do not show its boundary tokens
    (an added token that is normalized or strips), fall back to the full tokenization and say why."""
    local = renderer(MODELS[0])
    enc = local.incremental
    assert isinstance(enc, IncrementalEncoder)
    cache = TokenCache()
    assert enc.encode("<|im_start|>user\nhello<|im_end|>\n", cache) == local.encode(
        "<|im_start|>user\nhello<|im_end|>\n"
    )
    assert cache.how == "full:first"
    assert enc.encode("<|im_start|>user\nhello<|im_end|>\nmore", cache) == local.encode(
        "<|im_start|>user\nhello<|im_end|>\nmore"
    )
    assert cache.how == f"tail:{len(chr(10) + 'more')}"  # from the end of <|im_end|>
    rewritten = "<|endoftext|>system\nnew<|im_end|>\n"  # shares only "<|" with the last one
    assert enc.encode(rewritten, cache) == local.encode(rewritten) and cache.how == "full:no_boundary_in_common_prefix"
    assert enc._marks("<|im_end|>", [1, 2], (0, 0)) is None  # ids that do not show the text's boundary token
    for tok in local.tokenizer.added_tokens_decoder.values():
        if tok.content in enc.by_text:
            assert not (tok.lstrip or tok.rstrip or tok.normalized or tok.single_word)


def test_renderers_without_boundary_tokens_render_in_full(tmp_path: Path) -> None:
    class Slow:  # not a fast tokenizer: no proof of where its pieces split
        is_fast = False
        added_tokens_decoder: ClassVar[dict[int, object]] = {0: object()}

    assert IncrementalEncoder.for_tokenizer(Slow()) is None
