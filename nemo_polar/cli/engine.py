"""``polar engine up|down``: the embedded vLLM engine."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    engine = subparsers.add_parser("engine", help="start or stop the embedded vLLM engine")
    esub = engine.add_subparsers(dest="action", required=True)
    eup = esub.add_parser("up", help="start vLLM and wait until it is healthy")
    eup.add_argument("--model", default="tiny-qwen3", help="tiny-qwen3, smollm2-135m-instruct or a model directory")
    eup.add_argument("--port", type=int, default=8011)
    eup.add_argument("--host", default="127.0.0.1")
    eup.add_argument("--max-model-len", type=int)
    eup.add_argument("--tool-call-parser", help="vLLM's tool-call parser (default: the model family's, else hermes)")
    eup.add_argument("--reasoning-parser", help="vLLM's reasoning parser (default: the model family's, if any)")
    eup.add_argument("--timeout", type=float, default=300.0)
    eup.add_argument(
        "--nice",
        type=int,
        default=0,
        help="CPU niceness of the engine (1-19): on a CPU machine shared with the proxy, 10 keeps the proxy's "
        "p95 time to first delta at the engine's own (the engine still gets every idle cycle)",
    )
    eup.set_defaults(func=_engine_up)
    edown = esub.add_parser("down", help="stop engines started with `polar engine up`")
    edown.add_argument("--port", type=int)
    edown.set_defaults(func=_engine_down)


def _engine_up(args: argparse.Namespace) -> int:
    from nemo_polar.engine.launcher import EngineSpec, up

    spec = EngineSpec(
        model=args.model,
        port=args.port,
        host=args.host,
        max_model_len=args.max_model_len,
        tool_call_parser=args.tool_call_parser,
        reasoning_parser=args.reasoning_parser,
        nice=args.nice,
    )
    print(up(spec, timeout=args.timeout))
    return 0


def _engine_down(args: argparse.Namespace) -> int:
    from nemo_polar.engine.launcher import down

    stopped = down(args.port)
    print("\n".join(f"stopped {url}" for url in stopped) or "no engine running")
    return 0
