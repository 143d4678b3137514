"""``polar proxy``: serve the token-faithful model API proxy from a config file, flags overriding it."""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path


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
    proxy.add_argument("--log-level", default="warning")
    proxy.set_defaults(func=_proxy)


def _proxy(args: argparse.Namespace) -> int:
    import signal
    import threading

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
        "admin_token": args.admin_token or _token_file(args.admin_token_file) or os.environ.get("POLAR_ADMIN_TOKEN"),
    }
    values.update({k: v for k, v in flags.items() if v is not None})
    values.setdefault("freeze_heap", True)  # this process is the proxy's own
    if "engine_url" not in values:
        raise SystemExit("polar proxy: --engine-url (or engine_url in --config) is required")
    config = ProxyConfig.model_validate(values)
    # A model whose sampled format cannot be read here is refused now, not at a session's first call.
    if problem := asyncio.run(unreadable_format(config)):
        raise SystemExit(f"polar proxy: {problem}. Run the proxy beside the model's files, or use --mode chat.")
    admin_port = args.admin_port or args.port + 1
    server = ProxyServer(config, args.host, args.port, admin_port, log_level=args.log_level, api_key=args.api_key)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with server:
        print(f"model API  {server.url}   (harnesses; the only listener a sandbox relay forwards to)", flush=True)
        print(f"admin API  {server.admin_url}   (sessions, records, pause/resume, metrics)", flush=True)
        if values.get("admin_token") is None:
            print(f"admin token {server.admin_token}   (random; pass --admin-token or $POLAR_ADMIN_TOKEN)", flush=True)
        stop.wait()
    return 0


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
