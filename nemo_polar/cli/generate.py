"""``polar generate``: offline SFT data by rejection sampling, from Hydra overrides of ``conf/generate.yaml`` (the
keys and groups of ``polar rollout``'s config). The flags of earlier releases are aliases of those keys."""

from __future__ import annotations

import argparse
from pathlib import Path

from nemo_polar.cli.options import container_formatter_arg

# flag -> the config key it sets (flags kept for the commands users already have)
ALIASES: dict[str, str] = {
    "env": "env",
    "attempts": "n_samples",
    "engine_url": "engine.url",
    "proxy_url": "proxy.url",
    "proxy_admin_url": "proxy.admin_url",
    "proxy_admin_token": "proxy.admin_token",
    "model": "model",
    "runtime": "runtime",
    "scripted": "scripted",
    "run_slots": "gateway.run_slots",
    "timeout": "timeout",
    "output": "out",
    "instance_id": "dataset.instance_ids",
    "limit": "dataset.limit",
    "container_formatter": "dataset.container_formatter",
}


def register(subparsers: argparse._SubParsersAction) -> None:
    from nemo_polar.env.gym import ENVIRONMENTS

    gen = subparsers.add_parser(
        "generate",
        help="offline SFT data: attempt instances N times, keep what the grader accepts, export JSONL + Parquet",
        description="Rejection sampling: run a harness over SWE instances with n_samples attempts each through the "
        "rollout gateway, grade every final patch with swebench in a fresh sandbox, keep the sessions that resolve "
        "their instance and export their traces as SFT rows (messages, token ids, loss masks, logprobs, reward, "
        "harness, instance id) to OUT/sft.jsonl and OUT/sft.parquet, with acceptance statistics in "
        "OUT/acceptance.json. Re-running the same command skips finished attempts. Configured as `polar rollout` "
        "is: Hydra overrides of conf/generate.yaml (e.g. env=polar_pi dataset=bundled n_samples=4 "
        "engine.url=http://HOST:8000 out=sft/; --cfg prints the composed config); each flag below sets one key.",
    )
    gen.add_argument("overrides", nargs="*", help="e.g. env=polar_codex dataset=swebench dataset.path=rows.jsonl")
    gen.add_argument("--cfg", action="store_true", help="print the composed config and exit")
    gen.add_argument("--env", help=f"env=: {', '.join(ENVIRONMENTS)}")
    gen.add_argument(
        "--instances", help="dataset=bundled, or dataset=swebench dataset.path=FILE (SWE-bench/SWE-Gym/Gym rows)"
    )
    container_formatter_arg(gen)
    gen.add_argument("--instance-id", action="append", help="dataset.instance_ids: only this instance (repeatable)")
    gen.add_argument("--limit", type=int, help="dataset.limit: only the first N instances")
    gen.add_argument("--attempts", type=int, help="n_samples: attempts per instance (default 4)")
    gen.add_argument("--engine-url", help="engine.url: any vLLM server (e.g. a large teacher on a GPU host)")
    gen.add_argument("--proxy-url", help="proxy.url: a running `polar proxy`'s model API instead of an engine")
    gen.add_argument("--proxy-admin-url", help="proxy.admin_url: that proxy's admin API (its --admin-port listener)")
    gen.add_argument("--proxy-admin-token", help="proxy.admin_token (default: $POLAR_ADMIN_TOKEN)")
    gen.add_argument("--model", help="model: the model name the harness is told to use")
    gen.add_argument("--runtime", choices=["bwrap", "docker", "local"], help="runtime=")
    gen.add_argument(
        "--scripted",
        action=argparse.BooleanOptionalAction,
        help="scripted: drive the CLI with each instance's scripted policy (default: on for 'bundled', off otherwise)",
    )
    gen.add_argument("--run-slots", type=int, help="gateway.run_slots: harness sessions at once (default 2)")
    gen.add_argument("--timeout", type=float, help="timeout: seconds per harness run (default 1800)")
    gen.add_argument("-o", "--output", type=Path, help="out: the output directory")
    gen.set_defaults(func=_generate)


def hydra_value(value: object) -> str:
    """One value in Hydra's override grammar: strings quoted (paths and templates hold characters it parses)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, list):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def alias_overrides(args: argparse.Namespace) -> list[str]:
    """The overrides the given flags stand for (after the positional ones, so a flag wins where both set a key)."""
    out: list[str] = []
    if args.instances is not None:
        bundled = str(args.instances) == "bundled"
        out += ["dataset=bundled"] if bundled else ["dataset=swebench", f"dataset.path={hydra_value(args.instances)}"]
    for flag, key in ALIASES.items():
        value = getattr(args, flag)
        if value is None:
            continue
        if key in ("env", "runtime"):  # config groups: a bare option name
            out.append(f"{key}={value}")
        else:
            # ++: set even where the dataset's group has no such key (bundled takes no container_formatter)
            out.append(f"++{key}={hydra_value(str(value) if isinstance(value, Path) else value)}")
    return out


def _generate(args: argparse.Namespace) -> int:
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from nemo_polar.env.frontends.generate import dataset_of, generate_dataset
    from nemo_polar.env.frontends.rollout import compose
    from nemo_polar.env.specs import UnknownEnv
    from nemo_polar.progress import attempts_progress

    try:
        cfg = compose([*args.overrides, *alias_overrides(args)], config_name="generate")
        if args.cfg:
            print(OmegaConf.to_yaml(cfg))
            return 0
        instances = dataset_of(cfg)
        with attempts_progress(f"generate {cfg.env.name}") as progress:
            report = generate_dataset(cfg, instances, progress)
    except (HydraException, OmegaConfBaseException, OSError, ValueError, UnknownEnv) as exc:
        raise SystemExit(f"polar generate: {exc}") from None
    print(report.model_dump_json(indent=2))
    return 0
