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
from collections.abc import Iterator
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from nemo_polar.env.frontends.demo_runs import DemoRow, demo_tasks, run_all
from nemo_polar.env.frontends.rollout import serve_proxy
from nemo_polar.env.gym import environments
from nemo_polar.rewards.instance import bundled_instances


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
