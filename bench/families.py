"""The fidelity table: what holds for each model family behind the proxy, measured, the README's table rewritten.

Each family's stand-in (``tiny-<family>``: its real tokenizer and chat template, random weights, served by vLLM with
the family's own tool-call and reasoning parsers; nemo_polar/engine/build_models.py) gets, in continuation mode:

- **requests**: every real CLI request body in tests/fixtures/harness_requests (11 harnesses, 4 APIs) sent to the proxy:
  how many it accepted (a template that renders no tools refuses tools requests: the reason is given), and on how
  many the prompt it gave the engine equals the engine's own ``/tokenize`` render of the same conversation;
- **CLI sessions**: the demo's real harnesses (Codex, Claude Code, Qwen Code, Pi, Gemini CLI, mini-swe-agent,
  Hermes, Copilot CLI, Cline, opencode, OpenHands SDK), each on its bundled task with the scripted policy written
  by the family's template: sessions solved, scripted tool calls that came back to the CLI as tool calls (a session
  only goes on to its next call, and only solves its task, if the CLI ran the call), merged traces per session and
  breaks (history policy ``sampled``), and the audit (every trainable token an id the engine sampled, every
  stitched context the engine's prompt);
- **render**: the proxy's per-call render at 64k tokens (``bench.render_scale --context 65536``; a template that
  renders no tools is measured on a text-only session, ``--text-only``).

    python -m bench.families [--only tiny-llama3 /models/MyModel ...] [--no-docs]

``--only`` also takes your own model's directory (the engine serves it with its polar-family.json's parsers, else
hermes; pass a small one: the CLI sessions run on it).

About 2.5 minutes per family on 2 cores. The last line is the number of families where everything held.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel

from bench.common import report
from nemo_polar.engine.families import served_trait, stand_ins
from nemo_polar.engine.launcher import EngineProcess, EngineSpec, free_port
from nemo_polar.env.frontends.demo_runs import TASKS, DemoRow, run_all
from nemo_polar.env.frontends.rollout import serve_proxy
from nemo_polar.proxy.apis import CAPTURED_APIS, get_adapter
from nemo_polar.proxy.engine_client import EngineClient
from nemo_polar.proxy.http.client import ProxyClient
from nemo_polar.proxy.render.renderer import EngineRenderer, probe_template
from nemo_polar.rewards.instance import bundled_instances

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "harness_requests"
README = ROOT / "README.md"
NO_TOOLS = "template renders no tools"
MARKERS = ("<!-- families:table -->", "<!-- /families:table -->")


class FamilyResult(BaseModel):
    model: str
    parsers: str
    requests: int
    accepted: int
    refused: dict[str, int]
    render_equal: int
    sessions: list[DemoRow]
    tool_calls_scripted: int
    tool_calls_returned: int
    render_ms_64k: float | None
    render_how: str


def replay(proxy: ProxyClient, engine_url: str) -> tuple[int, int, dict[str, int], int]:
    """Every fixture request once: (requests, accepted, refusals by error code, renders equal to the engine's)."""
    fixtures = [json.loads(p.read_text()) for p in sorted(FIXTURES.glob("*/*.json"))]

    async def engine_render(body: dict[str, Any], api: str) -> list[int]:
        engine = EngineClient(engine_url)
        try:
            tool_parser = served_trait((await engine.info()).family, "tool_call_parser")  # as the proxy probes it
            traits = await probe_template(EngineRenderer(engine), tool_parser)
            conv = get_adapter(CAPTURED_APIS[api]).parse(body)
            tools = conv.template_tools() if conv.tool_choice != "none" else None
            return await EngineRenderer(engine).render(conv.template_messages(traits), tools, {})
        finally:
            await engine.aclose()

    accepted = equal = 0
    refused: dict[str, int] = {}
    for fixture in fixtures:
        session_id, key = proxy.create_session({"sampling_overrides": {"max_tokens": 8, "temperature": 0.0}})
        body = dict(fixture["body"])  # answered as one JSON body
        if "stream" in body:
            body["stream"] = False
        body.pop("stream_options", None)
        headers = {"authorization": f"Bearer {key}", "x-api-key": key, "x-goog-api-key": key}
        path = fixture["path"].replace(":streamGenerateContent?alt=sse", ":generateContent")
        resp = httpx.post(f"{proxy.url}{path}", json=body, headers=headers, timeout=300)
        if resp.status_code != 200:
            [record] = proxy.records(session_id)  # the failed record says why, whatever the API's error shape
            why = NO_TOOLS if "renders no tools" in (record.error or "") else str(resp.status_code)
            refused[why] = refused.get(why, 0) + 1
            continue
        accepted += 1
        [record] = proxy.records(session_id)
        equal += record.prompt_token_ids == asyncio.run(engine_render(body, fixture["api"]))
    return len(fixtures), accepted, refused, equal


def returned_calls(session_dir: Path, scripted: int) -> int:
    """Scripted tool calls the CLI ran: each one it ran is answered by a next model call of the same session."""
    [records] = session_dir.glob("*/records.jsonl")
    return min(scripted, len(records.read_text().splitlines()) - 1)


def render_ms(model: str, text_only: bool) -> tuple[float | None, str]:
    with tempfile.TemporaryDirectory() as tmp:
        results = Path(tmp) / "r.json"
        env = {**os.environ, "POLAR_BENCH_RESULTS": str(results)}
        cmd = [sys.executable, "-m", "bench.render_scale", "--calls", "60", "--context", "65536", "--model", model]
        done = subprocess.run(
            [*cmd, *(["--text-only"] if text_only else [])], env=env, cwd=ROOT, capture_output=True, text=True
        )
        if done.returncode != 0 or not results.exists():
            last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"
            return None, "the bench session is refused: " + last.split(": ", 1)[-1]
        figures = json.loads(results.read_text())["render_scale"]["figures"]
        template = "template on new messages" if figures["template_on_new_messages_only"] else "template on all"
        how = f"{template}, exponent {figures['exponent_incremental']}" + ("; text-only session" if text_only else "")
        return figures["incremental_ms"], how


def measure(model: str, out: Path) -> FamilyResult:
    instances = {i.instance_id: i for i in bundled_instances()}
    scripted = sum(sum(a["kind"] != "final" for a in instances[task].script or []) for task in TASKS.values())
    spec = EngineSpec(model=model, port=free_port())
    cmd, _ = spec.command()
    parsers = " + ".join(
        cmd[cmd.index(flag) + 1] for flag in ("--tool-call-parser", "--reasoning-parser") if flag in cmd
    )
    with EngineProcess(spec) as engine, serve_proxy(engine.spec.url, out / "proxy", "local-model") as proxy:
        requests, accepted, refused, equal = replay(proxy, engine.spec.url)
        rows: list[DemoRow] = []
        if NO_TOOLS not in refused:  # the demo's CLIs all send tools
            rows = asyncio.run(run_all(proxy, out, {env: instances[task] for env, task in TASKS.items()}))
    returned = sum(returned_calls(out / row.env, scripted // len(TASKS)) for row in rows)
    ms, how = render_ms(model, text_only=NO_TOOLS in refused)
    return FamilyResult(
        model=model,
        parsers=parsers or "none",
        requests=requests,
        accepted=accepted,
        refused=refused,
        render_equal=equal,
        sessions=rows,
        tool_calls_scripted=scripted if rows else 0,
        tool_calls_returned=returned,
        render_ms_64k=ms,
        render_how=how,
    )


def held(r: FamilyResult) -> bool:
    sessions_ok = all(s.reward == 1.0 and s.audit_ok and s.breaks == 0 and s.traces == 1 for s in r.sessions)
    tools_ok = r.tool_calls_returned == r.tool_calls_scripted
    return (
        r.render_equal == r.accepted and sessions_ok and tools_ok and r.accepted + sum(r.refused.values()) == r.requests
    )


def table(results: list[FamilyResult]) -> str:
    lines = [
        "| model family | stand-in | vLLM parsers | CLI requests accepted | render = engine's | CLI sessions solved "
        "| scripted tool calls returned | merged traces per session (breaks) | audit | render at 64k |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    labels = {name: f.label for name, f in stand_ins().items()}
    for r in results:
        refusals = ", ".join(f"{n} refused: {why}" for why, n in r.refused.items())
        accepted = f"{r.accepted}/{r.requests}" + (f" ({refusals})" if refusals else "")
        if r.sessions:
            solved = f"{sum(s.reward == 1.0 for s in r.sessions)}/{len(r.sessions)}"
            returned = f"{r.tool_calls_returned}/{r.tool_calls_scripted}"
            traces = ", ".join(f"{s.traces} ({s.breaks})" for s in sorted(r.sessions, key=lambda s: s.harness))
            audit = "ok" if all(s.audit_ok for s in r.sessions) else "FAILED"
        else:
            solved = returned = traces = audit = "— (no tools)"
        ms = f"{r.render_ms_64k:.1f} ms ({r.render_how})" if r.render_ms_64k is not None else r.render_how
        lines.append(
            f"| {labels.get(r.model, r.model)} | `{r.model}` | {r.parsers} | {accepted} "
            f"| {r.render_equal}/{r.accepted} | {solved} | {returned} | {traces} | {audit} | {ms} |"
        )
    return "\n".join(lines)


def write_readme(text: str) -> None:
    """The README's table with the measured rows replaced (rows of models not measured this time are kept)."""
    page = README.read_text()
    start, end = page.index(MARKERS[0]) + len(MARKERS[0]), page.index(MARKERS[1])
    old = [line for line in page[start:end].splitlines() if line.startswith("| ")][1:]  # its rows, less the header
    new = text.splitlines()
    rows = {_stand_in(line): line for line in [*old, *new[2:]]}
    known = list(stand_ins())
    order = [m for m in known if m in rows] + [m for m in rows if m not in known]
    README.write_text(page[:start] + "\n" + "\n".join([*new[:2], *(rows[m] for m in order)]) + "\n" + page[end:])


def _stand_in(row: str) -> str:
    return row.split("|")[2].strip().strip("`")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only", nargs="*", default=None, help="models to measure: names or model directories (default: every family)"
    )
    parser.add_argument("--no-docs", action="store_true", help="print the table, leave the README's rows")
    args = parser.parse_args()
    models = args.only or list(stand_ins())
    out = Path(tempfile.mkdtemp(prefix="polar-families-"))
    results = []
    for model in models:
        t0 = time.monotonic()
        results.append(measure(model, out / model))
        print(f"{model}: measured in {time.monotonic() - t0:.0f} s", flush=True)
    text = table(results)
    print(text)
    if not args.no_docs:
        write_readme(text)
    ok = sum(held(r) for r in results)
    report(
        "families",
        {r.model: r.model_dump(mode="json", exclude={"sessions"}) for r in results},
        f"model families where every check held: {ok}/{len(results)}",
    )


if __name__ == "__main__":
    main()
