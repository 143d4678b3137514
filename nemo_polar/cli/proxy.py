"""``polar proxy``: serve the token-faithful model API proxy from a config file, flags overriding it."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any


def register(subparsers: argparse._SubParsersAction) -> None:
    proxy = subparsers.add_parser("proxy", help="serve the token-faithful model API proxy")
    proxy.add_argument("--config", type=Path, help="YAML with ProxyConfig fields (see conf/proxy/default.yaml)")
    proxy.add_argument("--engine-url")
    proxy.add_argument("--port", type=int, default=8100, help="the model API (what harnesses call)")
    proxy.add_argument("--admin-port", type=int, help="the admin API (default: --port + 1)")
    proxy.add_argument("--host", default="127.0.0.1")
    proxy.add_argument("--mode", choices=["continuation", "chat", "chat_prefix"])
    proxy.add_argument("--record-dir", type=Path)
    proxy.add_argument("--model-alias", action="append", help="extra model name to accept (repeatable)")
    proxy.add_argument("--api-key", help="pre-create one session with this API key")
    proxy.add_argument(
        "--tool-call-parser",
        help="vLLM's name for the model's tool-call format, as given to the engine (default: the model directory's "
        "polar-family.json, else hermes/qwen3_coder, read in process); other formats are read by vLLM's own parsers",
    )
    proxy.add_argument("--reasoning-parser", help="likewise, vLLM's reasoning parser")
    proxy.add_argument(
        "--admin-token",
        help="bearer token of the admin API (default: --admin-token-file, else $POLAR_ADMIN_TOKEN, else a random "
        "one). Prefer the file or the variable: every local user can read a process's argv; a token that starts "
        "with '-' needs --admin-token=VALUE here",
    )
    proxy.add_argument("--admin-token-file", type=Path, help="a file holding the admin token (keep it mode 0600)")
    proxy.add_argument(
        "--workers",
        type=_worker_count,
        help="proxy worker processes, each a whole proxy on its own two ports (worker i on --port + 2i and the next), "
        "a session pinned to one (default: workers in --config, else one per spare core)",
    )
    proxy.add_argument(
        "--pool-file",
        type=Path,
        help="write the workers' addresses here as JSON (ProxyPool, without the admin token) for the rollout side",
    )
    proxy.add_argument(
        "--pool-port",
        type=int,
        help="with workers: the pool's admin API (/metrics: every worker's, labelled; /health), behind the admin "
        "token (default: the port after the last worker's; a free one with --port 0)",
    )
    proxy.add_argument("--log-level", default="warning")
    proxy.set_defaults(func=_proxy)


def _proxy(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from nemo_polar.proxy.http.config import ProxyConfig
    from nemo_polar.proxy.http.serve import ProxyServer
    from nemo_polar.proxy.parse.family_parser import unreadable_format

    values: dict = {}
    if args.config:
        from omegaconf import OmegaConf

        values = OmegaConf.to_container(OmegaConf.load(args.config), resolve=True)  # type: ignore[assignment]
    flags = {
        "engine_url": args.engine_url,
        "default_mode": args.mode,
        "record_dir": args.record_dir,
        "model_aliases": args.model_alias,
        "tool_call_parser": args.tool_call_parser,
        "reasoning_parser": args.reasoning_parser,
        "workers": args.workers,
        "admin_token": args.admin_token or _token_file(args.admin_token_file) or os.environ.get("POLAR_ADMIN_TOKEN"),
    }
    values.update({k: v for k, v in flags.items() if v is not None})
    values.setdefault("freeze_heap", True)  # this process is the proxy's own
    if "engine_url" not in values:
        raise SystemExit("polar proxy: --engine-url (or engine_url in --config) is required")
    try:
        config = ProxyConfig.model_validate(values)
    except ValidationError as exc:
        raise SystemExit(f"polar proxy: invalid configuration: {exc}") from None
    # A model whose sampled format cannot be read here is refused now, not at a session's first call.
    if problem := asyncio.run(unreadable_format(config)):
        raise SystemExit(f"polar proxy: {problem}. Run the proxy beside the model's files, or use --mode chat.")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    if config.worker_count() > 1:
        return _serve_workers(args, config, stop, random_token=values.get("admin_token") is None)
    admin_port = args.admin_port or args.port + 1
    server = ProxyServer(config, args.host, args.port, admin_port, log_level=args.log_level, api_key=args.api_key)
    with server:
        _write_pool(args.pool_file, [server.client()])
        print(f"model API  {server.url}   (harnesses; the only listener a sandbox relay forwards to)", flush=True)
        print(f"admin API  {server.admin_url}   (sessions, records, pause/resume, metrics)", flush=True)
        if values.get("admin_token") is None:
            print(f"admin token {server.admin_token}   (random; pass --admin-token or $POLAR_ADMIN_TOKEN)", flush=True)
        stop.wait()
    return 0


def _serve_workers(args: argparse.Namespace, config: Any, stop: threading.Event, *, random_token: bool) -> int:
    """Serve the proxy as ``config.worker_count()`` worker processes until ``stop``."""
    from nemo_polar.proxy.http.admin import pool_admin_app
    from nemo_polar.proxy.http.serve import BackgroundServer
    from nemo_polar.proxy.http.workers import ProxyWorkers, pool_port

    workers = ProxyWorkers(
        config, host=args.host, port=args.port, admin_port=args.admin_port, api_key=args.api_key,
        log_level=args.log_level,
    )  # fmt: skip
    pool_at = args.pool_port if args.pool_port is not None else pool_port(workers.count, args.port)
    try:
        workers.start()
        pool_api = BackgroundServer(pool_admin_app(workers.pool, config.admin_token), args.host, pool_at or None)
    except (OSError, RuntimeError) as exc:
        workers.stop()
        raise SystemExit(f"polar proxy: {exc}") from None
    try:
        with pool_api:
            _write_pool(args.pool_file, workers.pool.workers)  # before the addresses: a reader of them may read it
            _say_workers(workers.pool.workers, pool_api.url, config.admin_token if random_token else None)
            _watch(workers, stop)
    finally:
        workers.stop()
    return 0


def _say_workers(workers: list[Any], pool_url: str, random_token: str | None) -> None:
    first, *others = workers  # worker 0 printed as a single proxy is: it answers as one
    print(f"model API  {first.url}   (worker 0 of {len(workers)}; harnesses)", flush=True)
    print(f"admin API  {first.admin_url}   (worker 0: its sessions, records, pause/resume, metrics)", flush=True)
    for i, w in enumerate(others, 1):
        print(f"worker {i}   model API  {w.url}   admin API  {w.admin_url}", flush=True)
    print("a session lives on the worker whose admin API opened it; weight sync: all (ProxyPool)", flush=True)
    print(f"pool API   {pool_url}   (every worker's /metrics in one, labelled worker; /health)", flush=True)
    if random_token:
        print(f"admin token {random_token}   (random; pass --admin-token or $POLAR_ADMIN_TOKEN)", flush=True)


def _watch(workers: Any, stop: threading.Event) -> None:
    """Until ``stop``, say once for each worker that ends on its own: the others keep serving."""
    told: set[int] = set()
    while not stop.wait(1.0):
        for index, code in workers.exited().items():
            if index not in told:
                told.add(index)
                print(
                    f"polar proxy: worker {index} exited with status {code}; its sessions' next calls fail, the "
                    "calls it answered are in the record directory; the other workers keep serving",
                    file=sys.stderr,
                    flush=True,
                )


def _write_pool(path: Path | None, workers: list[Any]) -> None:
    """The workers' addresses as a ProxyPool, less the admin token: its reader takes that from $POLAR_ADMIN_TOKEN."""
    from nemo_polar.proxy.http.pool import ProxyPool

    if path is not None:
        pool = ProxyPool(workers=workers)
        path.write_text(pool.model_dump_json(indent=2, exclude={"workers": {"__all__": {"admin_token"}}}) + "\n")


def _worker_count(text: str) -> int:
    try:
        count = int(text)
    except ValueError:
        count = 0
    if not 1 <= count <= 256:
        raise argparse.ArgumentTypeError(f"a worker count is 1-256, got {text!r}")
    return count


def _token_file(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise SystemExit(f"polar proxy: cannot read --admin-token-file {path}: {exc.strerror}") from None
    if not token:
        raise SystemExit(f"polar proxy: --admin-token-file {path} is empty")
    return token
