"""One sampling model (what the harness asked, what a session pins, what the engine was sent) with one merge rule, and
one API adapter registry that the proxy and the offline export both go through."""

from __future__ import annotations

import ast
import importlib
import json
import pkgutil
import typing
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

import nemo_polar.proxy.apis as apis
from nemo_polar.proxy.apis import ADAPTERS, ApiAdapter, chat, get_adapter
from nemo_polar.proxy.engine_client import EngineInfo
from nemo_polar.proxy.generate.generation import plan
from nemo_polar.proxy.sampling import SamplingParams
from nemo_polar.proxy.store.records import Api, CallRecord, read_records
from nemo_polar.proxy.store.sessions import SessionConfig, SessionStore
from nemo_polar.reconstruct import export
from tests.conftest import ProxyHandle
from tests.helpers.clients import anthropic_client, openai_client

ROOT = Path(__file__).resolve().parents[1]
HI = [{"role": "user", "content": "hi"}]


# -- the merge rule -----------------------------------------------------------------------------------------------
def test_pinned_wins_and_max_tokens_is_a_cap() -> None:
    asked = SamplingParams(temperature=1.7, top_p=0.5, top_k=40, max_tokens=99, stop=["END"], seed=1)
    pinned = SamplingParams(temperature=0.5, top_k=20, max_tokens=5)
    assert SamplingParams.resolve(asked, pinned) == SamplingParams(
        temperature=0.5, top_p=0.5, top_k=20, max_tokens=5, stop=["END"], seed=1
    )
    # max_tokens: the smaller of the two when both are given, whichever is given otherwise
    cap = SamplingParams(max_tokens=5)
    assert SamplingParams.resolve(SamplingParams(max_tokens=3), cap).max_tokens == 3
    assert SamplingParams.resolve(SamplingParams(), cap).max_tokens == 5
    assert SamplingParams.resolve(SamplingParams(max_tokens=3), SamplingParams()).max_tokens == 3
    # a pin of 0 is a value, not "unset" (top_k=0 disables top-k in vLLM)
    assert SamplingParams.resolve(SamplingParams(top_k=40), SamplingParams(top_k=0)).top_k == 0
    assert SamplingParams.resolve(asked, SamplingParams()) == asked
    assert SamplingParams(top_k=3, max_tokens=5).engine_fields() == {"top_k": 3, "max_tokens": 5}


def test_session_pin_of_max_tokens_must_be_positive(proxy: ProxyHandle) -> None:
    with pytest.raises(ValidationError, match="max_tokens must be at least 1"):
        SessionConfig.model_validate({"sampling_overrides": {"max_tokens": 0}})
    resp = proxy.admin("POST", "/polar/sessions", json={"sampling_overrides": {"max_tokens": 0}})
    assert resp.status_code == 400 and "max_tokens must be at least 1" in resp.json()["error"]["message"]
    pinned = SessionConfig.model_validate({"sampling_overrides": {"top_k": 3, "max_tokens": 8}}).sampling_overrides
    assert pinned == SamplingParams(top_k=3, max_tokens=8)


def test_records_written_before_top_k_still_load(tmp_path: Path) -> None:
    old = {
        "call_id": "call-1",
        "session_id": "sess-1",
        "api": "chat",
        "mode": "continuation",
        "request": {},
        "started_at": 0.0,
        "complete": True,
        "sampling": {"temperature": 0.5, "top_p": 0.9, "max_tokens": 5, "stop": None, "seed": None},
    }
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(old) + "\n")
    [rec] = read_records(path)
    assert rec.sampling == SamplingParams(temperature=0.5, top_p=0.9, max_tokens=5)
    assert rec.sampling.top_k is None


# -- what is sent is what is recorded -------------------------------------------------------------------------------
class _Engine:
    async def info(self) -> EngineInfo:
        return EngineInfo(model="tiny", max_model_len=4096, eot_id=7)


class _Renderer:
    async def render(self, messages: Any, tools: Any, kwargs: Any, cache: Any = None) -> list[int]:
        return [1, 2, 3]


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["continuation", "chat"])
async def test_engine_request_carries_the_recorded_sampling(mode: str) -> None:
    session = SessionStore(None).create(
        SessionConfig.model_validate({"mode": mode, "sampling_overrides": {"top_k": 3, "max_tokens": 5}})
    )
    conv = chat.parse({"model": "m", "messages": HI, "top_k": 9, "max_tokens": 50, "temperature": 0.2})
    the_plan = await plan(_Engine(), _Renderer(), session, conv)  # type: ignore[arg-type]
    assert the_plan.sampling == SamplingParams(temperature=0.2, top_k=3, max_tokens=5)
    sent = {k: the_plan.body[k] for k in SamplingParams.model_fields if k in the_plan.body}
    assert sent == the_plan.sampling.engine_fields() == {"temperature": 0.2, "top_k": 3, "max_tokens": 5}


def test_records_carry_top_k_pinned_or_asked(proxy: ProxyHandle) -> None:
    pinned = proxy.session(sampling_overrides={"top_k": 3, "max_tokens": 4})
    client = openai_client(proxy, pinned["api_key"])
    client.chat.completions.create(model="local-model", messages=HI, extra_body={"top_k": 9})

    asked = proxy.session()
    aclient = anthropic_client(proxy, asked["api_key"])
    aclient.messages.create(model="local-model", max_tokens=4, top_k=7, messages=HI)
    oclient = openai_client(proxy, asked["api_key"])
    oclient.responses.create(model="local-model", input="hi", max_output_tokens=4)  # Responses has no top_k

    [rec] = proxy.records(pinned["session_id"])
    assert rec["complete"] and rec["sampling"]["top_k"] == 3 and rec["sampling"]["max_tokens"] == 4
    by_api = {r["api"]: r for r in proxy.records(asked["session_id"])}
    assert by_api["anthropic"]["complete"] and by_api["anthropic"]["sampling"]["top_k"] == 7
    assert by_api["responses"]["complete"] and by_api["responses"]["sampling"]["top_k"] is None
    assert [r["sampling"] for r in proxy.disk_records(asked["session_id"])] == [
        by_api["anthropic"]["sampling"],
        by_api["responses"]["sampling"],
    ]


# -- one adapter registry ---------------------------------------------------------------------------------------------
def test_one_adapter_per_api() -> None:
    assert set(ADAPTERS) == set(typing.get_args(Api))
    defined: list[ApiAdapter] = []  # every adapter any module of the package defines
    for info in pkgutil.iter_modules(apis.__path__):
        module = importlib.import_module(f"{apis.__name__}.{info.name}")
        defined += [v for v in vars(module).values() if isinstance(v, ApiAdapter)]
    assert sorted(a.name for a in defined) == sorted(ADAPTERS)
    assert all(ADAPTERS[a.name] is a and get_adapter(a.name) is a for a in defined)
    with pytest.raises(KeyError, match="unknown API 'bedrock'"):
        get_adapter("bedrock")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "path",
    [
        *(p.relative_to(ROOT).as_posix() for p in (ROOT / "nemo_polar/proxy/http").glob("*.py")),
        "nemo_polar/reconstruct/export.py",
    ],
)
def test_proxy_and_export_reach_apis_only_through_the_registry(path: str) -> None:
    tree = ast.parse((ROOT / path).read_text())
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("nemo_polar.proxy.apis"):
            imported |= {f"{node.module}:{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            assert not any(a.name.startswith("nemo_polar.proxy.apis.") for a in node.names)
    assert imported <= {"nemo_polar.proxy.apis:get_adapter", "nemo_polar.proxy.apis:ApiAdapter"}


def _spy(monkeypatch: pytest.MonkeyPatch, api: Api) -> list[Any]:
    seen: list[Any] = []
    adapter = ADAPTERS[api]

    def parse(body: Any) -> Any:
        seen.append(body)
        return adapter.parse(body)

    def parse_reusing(body: Any, memos: Any) -> Any:  # the proxy's way, where an API has it
        seen.append(body)
        assert adapter.parse_reusing is not None
        return adapter.parse_reusing(body, memos)

    reusing = parse_reusing if adapter.parse_reusing else None
    monkeypatch.setitem(ADAPTERS, api, replace(adapter, parse=parse, parse_reusing=reusing))
    return seen


def test_export_parses_through_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _spy(monkeypatch, "responses")
    body = {"model": "m", "input": "hi"}
    rec = CallRecord(call_id="c", session_id="s", api="responses", mode="chat", request=body, started_at=0.0)
    assert export.conversation(rec).messages[0].content == "hi"
    assert seen == [body]


def test_proxy_parses_through_the_registry(proxy: ProxyHandle, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _spy(monkeypatch, "chat")
    session = proxy.session(sampling_overrides={"max_tokens": 2})
    client = openai_client(proxy, session["api_key"])
    client.chat.completions.create(model="local-model", messages=HI)
    assert [b["messages"] for b in seen] == [HI]
