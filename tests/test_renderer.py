"""The in-process renderer reproduces the engine's own render of every real harness conversation."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nemo_polar.proxy.apis import CAPTURED_APIS, get_adapter
from nemo_polar.proxy.engine_client import EngineClient
from nemo_polar.proxy.render.renderer import verified_local_renderer
from tests.conftest import all_fixtures, load_fixture, make_proxy
from tests.helpers.clients import loopback


@pytest.mark.anyio
async def test_local_render_equals_engine_render_on_every_fixture(engine_url: str) -> None:
    engine = EngineClient(engine_url)
    try:
        local = await verified_local_renderer(engine)
        assert local is not None, "the engine's model directory is local, so the local renderer must verify"
        for harness, name in all_fixtures():
            fixture = load_fixture(harness, name)
            conv = get_adapter(CAPTURED_APIS[fixture["api"]]).parse(fixture["body"])
            messages, tools = conv.template_messages(), conv.template_tools()
            for kwargs in ({}, {"enable_thinking": False}):
                assert local.render_sync(messages, tools, kwargs) == await engine.tokenize_chat(
                    messages, tools, kwargs
                ), f"{harness}/{name} {kwargs}"
    finally:
        await engine.aclose()


def test_proxy_switches_to_the_verified_local_renderer(engine_url: str, tmp_path: Path) -> None:
    """... and, running inside this test process, never freezes its host's heap (only `polar proxy`, which owns its
    process, does): frozen, a closed session's objects could never be collected."""
    import gc

    frozen = gc.get_freeze_count()
    with contextlib.closing(make_proxy(engine_url, tmp_path)) as handles:  # a fresh proxy: the shared one switched
        proxy = next(handles)
        assert proxy.apps.proxy.renderer.name == "engine"
        session = proxy.session(sampling_overrides={"max_tokens": 2})
        body = {"model": "local-model", "messages": [{"role": "user", "content": "hi"}]}
        headers = {"authorization": f"Bearer {session['api_key']}"}
        deadline = time.monotonic() + 60
        while proxy.apps.proxy.renderer.name != "local":
            assert loopback.post(f"{proxy.url}/v1/chat/completions", json=body, headers=headers, timeout=60).is_success
            assert time.monotonic() < deadline, "local renderer was never adopted"
            time.sleep(0.2)
        [first, *_] = proxy.records(session["session_id"])
        assert first["tokenize"] == "full:engine_tokenize"  # the first call was rendered by the engine
        # A new session after the switch: its first call is the local renderer's first render of it (the last call
        # in the loop may already have been rendered locally, if the switch landed between its arrival and render).
        after = proxy.session(sampling_overrides={"max_tokens": 2})
        headers = {"authorization": f"Bearer {after['api_key']}"}
        assert loopback.post(f"{proxy.url}/v1/chat/completions", json=body, headers=headers, timeout=60).is_success
        [local] = proxy.records(after["session_id"])
        assert local["tokenize"] == "full:first" and local["template"] == "full:first"
        assert local["prompt_token_ids"] == first["prompt_token_ids"]  # the same render either way
    assert gc.get_freeze_count() == frozen


@pytest.mark.parametrize(("render", "loaded"), [("auto", True), ("engine", False)])
def test_the_tokenizer_stack_is_loaded_before_serving(render: str, loaded: bool) -> None:
    """Imported lazily in a worker thread, transformers stalls the proxy's event loop for seconds on its first
    call; an app that may render in-process imports it when it is built."""
    code = (
        "import sys\n"
        "from nemo_polar.proxy.http.app import create_apps\nfrom nemo_polar.proxy.http.config import ProxyConfig\n"
        "assert 'transformers.models.auto.tokenization_auto' not in sys.modules\n"
        f"create_apps(ProxyConfig(engine_url='http://127.0.0.1:9', render={render!r}))\n"
        "print('transformers.models.auto.tokenization_auto' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(loaded)
