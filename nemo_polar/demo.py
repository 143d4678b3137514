"""``make demo``: the whole loop on this machine with real parts.

A real vLLM engine (tiny-qwen3 on CPU, or a model family's ``tiny-<family>``), the proxy in front of it, and the
real coding CLIs — Codex, Claude Code, Qwen Code, Pi and Gemini CLI — each solving a bundled SWE-style task in its own
bwrap sandbox through a proxy session; swebench grades every final patch in a fresh sandbox, the records are
reconstructed into prefix-merged traces and audited, and an HTML report shows what was captured. The tiny CPU model
cannot act on its own, so each CLI's model turns follow the task's script, written by the model's own chat template
in its family's tool-call format and held to those tokens (:mod:`nemo_polar.proxy.generate.scripted`): the CLI,
its tools and the engine's sampling are real.

``--model tiny-llama3`` (``make demo MODEL=tiny-llama3``) runs it on another model family. Set
``POLAR_DEMO_ENGINE_URL`` to use an engine that is already running, ``POLAR_DEMO_OUT`` for the output.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from nemo_polar.env.gym import environments
from nemo_polar.env.harness import HARNESSES
from nemo_polar.env.polar_env import Group, PolarEnv, PolarEnvConfig
from nemo_polar.env.rollout import serve_proxy
from nemo_polar.proxy.http.client import ProxyClient
from nemo_polar.reconstruct.audit import audit
from nemo_polar.rewards.instance import SWEInstance, bundled_instances


def demo_tasks() -> dict[str, str]:
    """Each environment's bundled task (its harness's ``demo_task``: a different bug for each CLI), in ``order``."""
    return {h.env_name(): h.demo_task for h in HARNESSES.values()}


def __getattr__(name: str) -> dict[str, str]:
    # TASKS, read when asked: a harness registered after this import (a test's toy) has its task there.
    if name == "TASKS":
        return demo_tasks()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class DemoRow(BaseModel):
    env: str
    harness: str
    instance_id: str
    status: str
    calls: int
    traces: int
    trainable_tokens: int
    context_tokens: int
    breaks: int
    audit_ok: bool
    reward: float | None
    wall_s: float


@contextlib.contextmanager
def engine(console: Console, model: str) -> Iterator[str]:
    if url := os.environ.get("POLAR_DEMO_ENGINE_URL"):
        yield url
        return
    from nemo_polar.engine.launcher import EngineProcess, EngineSpec, free_port

    console.print(f"engine  starting vLLM with {model} on CPU (30-90 s) ...")
    with EngineProcess(EngineSpec(model=model, port=free_port())) as proc:
        console.print(f"engine  {proc.spec.url}")
        yield proc.spec.url


def model_dir(engine_url: str) -> Path | None:
    """The engine's model directory when it is on this machine: the report decodes token ids with its tokenizer."""
    with contextlib.suppress(httpx.HTTPError, KeyError, IndexError):
        root = httpx.get(f"{engine_url}/v1/models", timeout=10).json()["data"][0].get("root")
        if root and Path(root).is_dir():
            return Path(root)
    return None


def summarise(env: PolarEnv, group: Group, wall_s: float) -> DemoRow:
    [sample] = group.samples
    records = sample.records
    report = audit(sample.traces, records)
    trainable = sum(t.trainable_tokens for t in sample.traces)
    total = sum(len(t.prompt_ids) + len(t.response_ids) for t in sample.traces)
    return DemoRow(
        env=env.spec.name,
        harness=env.spec.harness,
        instance_id=group.instance_id,
        status=sample.outcome.session_status or sample.outcome.status,
        calls=len(records),
        traces=len(sample.traces),
        trainable_tokens=trainable,
        context_tokens=total - trainable,
        breaks=sum(1 for t in sample.traces if t.break_reason),
        audit_ok=report.ok,
        reward=sample.reward,
        wall_s=wall_s,
    )


async def run_all(proxy: ProxyClient, out: Path, instances: dict[str, SWEInstance]) -> list[DemoRow]:
    """Each environment's task, all at once, in the order of ``instances``."""

    async def one(name: str) -> DemoRow:
        config = PolarEnvConfig(
            env=name,
            proxy=proxy,
            state_dir=out / name,
            scripted=True,
            gateway={"run_slots": 1, "init_workers": 1, "post_workers": 1},
        )
        env = PolarEnv(config)
        t0 = time.monotonic()
        [group] = await env.acollect([instances[name]], 1)
        return summarise(env, group, time.monotonic() - t0)

    return list(await asyncio.gather(*(one(name) for name in instances)))


def table(rows: list[DemoRow]) -> Table:
    t = Table(title=f"nemo_polar demo: {len(rows)} real CLIs, one real engine, real grading")
    for col in ("CLI", "task", "status", "calls", "merged traces", "trainable", "context", "breaks", "audit"):
        t.add_column(col, justify="right" if col in ("calls", "merged traces", "trainable", "context") else "left")
    t.add_column("reward", justify="right")
    t.add_column("wall s", justify="right")
    for r in rows:
        t.add_row(
            r.harness,
            r.instance_id,
            r.status,
            str(r.calls),
            str(r.traces),
            str(r.trainable_tokens),
            str(r.context_tokens),
            str(r.breaks),
            "ok" if r.audit_ok else "FAILED",
            "masked" if r.reward is None else f"{r.reward:.1f}",
            f"{r.wall_s:.0f}",
        )
    return t


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the real CLIs on bundled tasks through the proxy, graded")
    parser.add_argument("--model", default="tiny-qwen3", help="a model `polar engine up` knows, or a model directory")
    parser.add_argument(
        "--env",
        action="append",
        choices=list(environments()),
        metavar="polar_<cli>",
        help="run only this environment (repeatable); default: every one",
    )
    args = parser.parse_args(argv)
    envs = [env for env in environments() if env in (args.env or environments())]
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # tokenizers only here: no "PyTorch was not found"
    console = Console(width=None if sys.stdout.isatty() else 150)
    out = Path(os.environ.get("POLAR_DEMO_OUT") or tempfile.mkdtemp(prefix="polar-demo-"))
    by_id = {i.instance_id: i for i in bundled_instances()}
    tasks = demo_tasks()
    instances = {env: by_id[tasks[env]] for env in envs}
    console.print(
        "[bold]scripted policy[/bold]: the embedded CPU model cannot drive a coding CLI on its own, so each CLI's "
        "model turns are held to the task's script, written by the model's own chat template. The CLIs, their tools, "
        "the history round trips, the engine's sampling, the grading and the reconstruction are all real."
    )
    with engine(console, args.model) as url, serve_proxy(url, out / "proxy", "local-model") as proxy:
        console.print(f"proxy   {proxy.url}  (records in {out / 'proxy'})")
        rows = asyncio.run(run_all(proxy, out, instances))
        tokenizer = model_dir(url)
    console.print(table(rows))
    from nemo_polar.view.report import write_report

    report = write_report([out / env for env in envs], out / "report.html", tokenizer)
    console.print(f"report  {report}")
    console.print(f"runs    {out}  (per CLI: sessions with records.jsonl, patch.diff, grade, transcript)")
    ok = all(r.reward == 1.0 and r.audit_ok and r.breaks == 0 for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
