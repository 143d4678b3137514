"""``polar generate``: offline SFT data by rejection sampling."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from nemo_polar.cli.options import container_formatter_arg


def register(subparsers: argparse._SubParsersAction) -> None:
    from nemo_polar.env.gym import ENVIRONMENTS

    gen = subparsers.add_parser(
        "generate",
        help="offline SFT data: attempt instances N times, keep what the grader accepts, export JSONL + Parquet",
        description="Rejection sampling: run a harness over SWE instances with N attempts each through the rollout "
        "gateway, grade every final patch with swebench in a fresh sandbox, keep the sessions that resolve their "
        "instance and export their traces as SFT rows (messages, token ids, loss masks, logprobs, reward, harness, "
        "instance id) to OUT/sft.jsonl and OUT/sft.parquet, with acceptance statistics in OUT/acceptance.json. "
        "Re-running the same command skips finished attempts.",
    )
    gen.add_argument("--env", default="polar_pi", help=", ".join(ENVIRONMENTS))
    gen.add_argument("--instances", type=Path, required=True, help="'bundled', a SWE-bench/SWE-Gym JSONL or HF files")
    container_formatter_arg(gen)
    gen.add_argument("--instance-id", action="append", help="only this instance (repeatable)")
    gen.add_argument("--limit", type=int, help="only the first N instances")
    gen.add_argument("--attempts", type=int, default=4, help="attempts per instance (default 4)")
    gen.add_argument("--engine-url", help="any vLLM server (e.g. a large teacher on a GPU host)")
    gen.add_argument("--proxy-url", help="a running `polar proxy`'s model API instead of --engine-url")
    gen.add_argument("--proxy-admin-url", help="that proxy's admin API (its --admin-port listener)")
    gen.add_argument("--proxy-admin-token", help="that proxy's admin token (default: $POLAR_ADMIN_TOKEN)")
    gen.add_argument("--model", default="local-model", help="the model name the harness is told to use")
    gen.add_argument("--runtime", choices=["bwrap", "docker", "local"], default="bwrap")
    gen.add_argument(
        "--scripted",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="drive the CLI with each instance's scripted policy (default: on for 'bundled', off otherwise)",
    )
    gen.add_argument("--run-slots", type=int, default=2, help="harness sessions at once")
    gen.add_argument("--timeout", type=float, default=1800.0, help="seconds per harness run")
    gen.add_argument("-o", "--output", type=Path, required=True, help="the output directory")
    gen.set_defaults(func=_generate)


def _generate(args: argparse.Namespace) -> int:
    from nemo_polar.env.frontends.generate import generate
    from nemo_polar.env.frontends.rollout import serve_proxy
    from nemo_polar.env.polar_env import PolarEnvConfig
    from nemo_polar.env.specs import UnknownEnv
    from nemo_polar.progress import attempts_progress
    from nemo_polar.rewards.datasets import select_instances

    try:
        instances = select_instances(args.instances, args.instance_id, args.limit, args.container_formatter)
        scripted = args.scripted if args.scripted is not None else str(args.instances) == "bundled"
        with serve_proxy(
            args.engine_url,
            args.output / "proxy",
            args.model,
            url=args.proxy_url,
            admin_url=args.proxy_admin_url,
            admin_token=args.proxy_admin_token or os.environ.get("POLAR_ADMIN_TOKEN"),
        ) as proxy:
            config = PolarEnvConfig(
                env=args.env,
                proxy=proxy,
                state_dir=args.output / "sessions",
                runtime=args.runtime,
                scripted=scripted,
                gateway={"run_slots": args.run_slots, "agent_budget_s": args.timeout},
            )
            with attempts_progress(f"generate {args.env}") as progress:
                report = generate(config, instances, args.attempts, args.output, progress)
    except (OSError, ValueError, UnknownEnv) as exc:
        raise SystemExit(f"polar generate: {exc}") from None
    print(report.model_dump_json(indent=2))
    return 0
