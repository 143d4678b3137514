"""The ``polar`` command line."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any


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


def _proxy(args: argparse.Namespace) -> int:
    import signal
    import threading

    from nemo_polar.proxy.app import ProxyConfig
    from nemo_polar.proxy.family_parser import unreadable_format
    from nemo_polar.proxy.serve import ProxyServer

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


def _reconstruct(args: argparse.Namespace) -> int:
    import json

    from nemo_polar.reconstruct.audit import audit
    from nemo_polar.reconstruct.builders import per_request, prefix_merging
    from nemo_polar.reconstruct.export import export
    from nemo_polar.reconstruct.io import load_records
    from nemo_polar.reconstruct.recompute import recompute_logprobs

    build = prefix_merging if args.builder == "prefix_merging" else per_request
    traces, failed, stats, by_id = [], 0, [], {}
    try:
        sessions = load_records(args.records)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"polar {args.command}: {exc}") from None
    for session_id, records in sorted(sessions.items()):
        result = build(records)
        traces += result.traces
        failed += len(result.failed_call_ids)
        stats.append({"session_id": session_id, **result.stats})
        by_id.update((r.call_id, r) for r in records)
        if args.command == "audit":
            report = audit(result.traces, records)
            line = {"session_id": session_id, "ok": report.ok, **report.model_dump()}
            if args.recompute_logprobs:
                line["logprob_recompute"] = recompute_logprobs(result.traces, args.recompute_logprobs)
            print(json.dumps(line))
            if not report.ok:
                return 1
    if args.command == "reconstruct":
        summary: dict[str, object] = {"traces": len(traces), "failed_calls": failed, "format": args.format}
        if args.rollout_id and args.format != "gym-token-entries":
            raise SystemExit("polar reconstruct: --rollout-id is for --format gym-token-entries")
        try:
            if args.format == "gym-token-entries":
                summary["entries"] = _gym_token_entries(sessions, args.output, args.rollout_id or [])
            else:
                export(traces, by_id, args.output, args.format)
        except (OSError, ValueError) as exc:
            raise SystemExit(f"polar reconstruct: {exc}") from None
        print(json.dumps({**summary, "sessions": stats}))
    return 0


def _gym_token_entries(sessions: dict[str, list], out: Path, pairs: list[str]) -> int:
    """NeMo Gym ``TokenEntry`` records, one per call, into a Gym token store directory (needs nemo-gym; dispatched
    here because ``reconstruct/`` may not import ``env/gym``)."""
    rollout_ids = {}
    for pair in pairs:
        session_id, sep, rollout_id = pair.partition("=")
        if not sep or not session_id or not rollout_id:
            raise ValueError(f"--rollout-id wants SESSION_ID=ROLLOUT_ID, got {pair!r}")
        rollout_ids[session_id] = rollout_id
    if unknown := sorted(set(rollout_ids) - set(sessions)):
        raise ValueError(f"--rollout-id names sessions not in the records: {', '.join(unknown)}")
    try:
        from nemo_polar.env.gym.tokens import export_sessions, write_token_store
    except ImportError as exc:
        raise SystemExit(f"polar reconstruct: --format gym-token-entries needs nemo-gym ({exc})") from None
    return write_token_store(export_sessions(sessions, rollout_ids), out)


def _rollout(args: argparse.Namespace) -> int:
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from nemo_polar.env.rollout import collect_dataset, compose, rollout, summary
    from nemo_polar.progress import attempts_progress

    try:
        cfg = compose(args.overrides)
        if args.cfg:
            print(OmegaConf.to_yaml(cfg))
            return 0
        if cfg.get("dataset") is not None:
            with attempts_progress(f"{cfg.env.name} on {cfg.dataset.name}") as progress:
                report = collect_dataset(cfg, progress)
            print(report.model_dump_json(indent=2))
            return 0
        result = rollout(cfg)
    except (HydraException, OmegaConfBaseException, ValueError, FileNotFoundError) as exc:
        raise SystemExit(f"polar rollout: {exc}") from None
    print(summary(cfg, result).model_dump_json(indent=2))
    return 0 if result.status == "completed" else 1


def _generate(args: argparse.Namespace) -> int:
    from nemo_polar.env.generate import generate
    from nemo_polar.env.polar_env import PolarEnvConfig
    from nemo_polar.env.rollout import serve_proxy
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


def _learn(args: argparse.Namespace) -> int:
    from nemo_polar.learn.report import run_harness_seeds, run_seeds

    try:
        if args.harness:
            summary: Any = run_harness_seeds(_harness_learn_configs(args), args.output)
        else:
            summary = run_seeds(_learn_configs(args), args.output)
    except (OSError, ValueError, RuntimeError) as exc:
        raise SystemExit(f"polar learn: {exc}") from None
    print(summary.model_dump_json(indent=2))
    return 0


def _learn_configs(args: argparse.Namespace) -> list[Any]:
    from nemo_polar.learn.loop import LearnConfig

    given = {"steps": args.steps, "lr": args.lr, "held_out": args.held_out, "eval_samples": args.eval_samples}
    given |= {"prompts_per_step": args.prompts, "generations": args.generations}
    given = {k: v for k, v in given.items() if v is not None}
    return [LearnConfig(out=args.output / f"seed-{seed}", seed=seed, **given) for seed in args.seed or [0, 1]]


def _harness_learn_configs(args: argparse.Namespace) -> list[Any]:
    from nemo_polar.learn.harness_loop import HarnessLearnConfig

    given = {"steps": args.steps, "lr": args.lr, "held_out": args.held_out, "eval_samples": args.eval_samples}
    given |= {"groups_per_step": args.prompts, "generations": args.generations, "warmup_steps": args.warmup_steps}
    given |= {"staleness": args.staleness}
    given = {k: v for k, v in given.items() if v is not None}
    return [
        HarnessLearnConfig(harness=args.harness, out=args.output / f"seed-{seed}", seed=seed, **given)
        for seed in args.seed or [0, 1]
    ]


def _container_formatter_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--container-formatter",
        action="append",
        metavar="TEMPLATE",
        help="the image of a NeMo Gym row that names none, as Gym's SWE agents find it: a .sif path or an image name "
        "with {instance_id} (repeatable: tried in order; see docs/train.md)",
    )


def _convert_rows(args: argparse.Namespace) -> int:
    from nemo_polar.rewards.legacy import convert_file

    try:
        rows = convert_file(args.source, args.output, args.image, args.specs, args.swebench)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"polar convert-rows: {exc}") from None
    print(f"{len(rows)} rows -> {args.output}")
    return 0


def _view(args: argparse.Namespace) -> int:
    from nemo_polar.view.report import run

    return run(args)  # exit 2 with "polar view: <path>: ..." on bad input


def _grade(args: argparse.Namespace) -> int:
    import json

    from nemo_polar.rewards.datasets import select_instances
    from nemo_polar.rewards.grader import Prediction, grade_many
    from nemo_polar.sandbox import RuntimeUnavailable

    try:
        instances = select_instances(args.instances, container_formatter=args.container_formatter)
        by_id = {inst.instance_id: inst for inst in instances}
        text = args.predictions.read_text()
        rows = (
            json.loads(text)
            if text.lstrip().startswith("[")
            else [json.loads(x) for x in text.splitlines() if x.strip()]
        )
        preds = [Prediction.model_validate(r) for r in rows]
    except (OSError, ValueError) as exc:
        raise SystemExit(f"polar grade: {exc}") from None
    unknown = [p.instance_id for p in preds if p.instance_id not in by_id]
    if unknown:
        raise SystemExit(f"polar grade: predictions for unknown instances: {', '.join(unknown[:10])}")
    log_dir = args.output.parent / f"{args.output.stem}.logs"  # every graded instance's evaluation log, kept
    pairs = [(by_id[p.instance_id], p.model_patch) for p in preds]
    try:
        results = grade_many(pairs, runtime=args.runtime, log_dir=log_dir)
    except RuntimeUnavailable as exc:  # no daemon, no skopeo, an image that is nowhere: say so, no traceback
        raise SystemExit(f"polar grade: {exc}") from None
    statuses: dict[str, int] = {}
    for r in results:
        statuses[r.status] = statuses.get(r.status, 0) + 1
    summary = {
        "instances": len(results),
        "resolved": sum(r.resolved for r in results),
        "masked": sum(r.mask_sample for r in results),
        "by_status": statuses,
    }
    report = {"summary": summary, "results": [r.model_dump(mode="json") for r in results]}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2))
    print(json.dumps(summary))
    return 0


def _patterns(args: argparse.Namespace) -> int:
    from nemo_polar.env.patterns import patterns_table
    from nemo_polar.paths import write_between_markers

    tasks = args.tasks or _checkout("examples/tasks/patterns")
    results = args.results or tasks / "results"
    try:
        table, problems = patterns_table(tasks, results)
        if args.markdown:
            write_between_markers(args.markdown, "patterns:table", table)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"polar patterns: {exc}") from None
    print(table)
    for problem in problems:
        print(f"polar patterns: {problem}", file=sys.stderr)
    return 1 if problems else 0


def _checkout(rel: str) -> Path:
    from nemo_polar.paths import source_dir

    root = source_dir()
    if root is None:
        raise SystemExit(f"polar: not running from a checkout; give the path of {rel}")
    return root / rel


def _harness_install(args: argparse.Namespace) -> int:
    from nemo_polar.env.harness import install

    install(args.names or None)
    return 0


def _gym_root(args: argparse.Namespace) -> int:
    from nemo_polar.env.gym import gym_root

    if not (args.wheel or args.wheel_dir):
        print(gym_root())
        return 0
    from nemo_polar.env.gym.wheel import WheelError, build_wheel

    try:
        wheel = build_wheel(args.wheel_dir)
    except WheelError as exc:
        raise SystemExit(f"polar gym-root: {exc}") from None
    print(wheel.parent)
    return 0


def _gym_recipe(args: argparse.Namespace) -> int:
    """Check NeMo-RL recipes as NeMo-RL loads them, before any GPU time: each one's summary as JSON, or the first
    problem."""
    from nemo_polar.env.gym.recipes import RecipeError, check_recipe

    for path in args.recipes:
        try:
            summary = check_recipe(path)
        except RecipeError as exc:
            raise SystemExit(f"polar gym-recipe: {exc}") from None
        print(summary.model_dump_json(indent=1))
    return 0


def _gym_venvs(args: argparse.Namespace) -> int:
    """Print the gym overrides that reuse prepared server venvs (nothing where Gym builds its own), a line per venv
    on stderr."""
    from nemo_polar.env.gym import ENVIRONMENTS, venvs

    environments, venv_dir = args.environment or list(ENVIRONMENTS), args.venv_dir or Path.cwd()
    try:
        venvs.server_venvs(environments, venv_dir)  # the names checked first, whatever this Python
    except venvs.VenvError as exc:
        raise SystemExit(f"polar gym-venvs: {exc}") from None
    if venvs.gym_builds_its_venvs():
        print(
            f"polar gym-venvs: Python {sys.version.split()[0]} meets nemo-gym's {venvs.gym_requires_python()}: "
            "Gym builds its server venvs itself",
            file=sys.stderr,
        )
        return 0
    try:
        done = venvs.prepare(environments, venv_dir)
    except venvs.VenvError as exc:
        raise SystemExit(f"polar gym-venvs: {exc}") from None
    for server, how in done:
        print(f"polar gym-venvs: {how} {server.path}", file=sys.stderr)
    print(" ".join(venvs.gym_overrides(venv_dir)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from nemo_polar.env.gym import ENVIRONMENTS
    from nemo_polar.env.harness import HARNESSES

    parser = argparse.ArgumentParser(
        prog="polar",
        description="nemo_polar: RL of coding agents inside their real CLIs. Start an engine (polar engine up), "
        "then run sessions (polar rollout), datasets (polar rollout dataset=bundled n_samples=4) or SFT generation "
        "(polar generate); inspect with polar view, polar audit, polar reconstruct.",
        epilog="Every command has its own --help. Quick start: make demo; docs/quickstart.md has the rest.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    engine = sub.add_parser("engine", help="start or stop the embedded vLLM engine")
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

    proxy = sub.add_parser("proxy", help="serve the token-faithful model API proxy")
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
    pat = sub.add_parser(
        "patterns",
        help="the scenario x CLI table of multi-context sessions (subagents, compaction, retries, ...)",
        description="Render the summary lines the pattern tests write (make patterns) as the scenario x CLI table: "
        "calls, chains by role, breaks by reason, tokens lost, audit. Exits 1 if a scripted scenario has no result, "
        "lost tokens or failed its audit.",
    )
    pat.add_argument("--tasks", type=Path, help="the scenario files (default: examples/tasks/patterns)")
    pat.add_argument("--results", type=Path, help="the tests' summary lines (default: <tasks>/results)")
    pat.add_argument(
        "--markdown", type=Path, help="also write the table between the patterns:table markers of this page"
    )
    pat.set_defaults(func=_patterns)
    for name, helptext in (
        ("reconstruct", "build traces from proxy records"),
        ("audit", "check traces against the records they came from"),
    ):
        cmd = sub.add_parser(name, help=helptext)
        cmd.add_argument("records", nargs="+", type=Path, help="the proxy's per-session JSONL files")
        cmd.add_argument("--builder", choices=["per_request", "prefix_merging"], default="prefix_merging")
        if name == "reconstruct":
            cmd.add_argument(
                "-o", "--output", type=Path, required=True, help="the output file (a directory for gym-token-entries)"
            )
            cmd.add_argument(
                "--format",
                choices=["traces", "gym", "sft-jsonl", "sft-parquet", "gym-token-entries"],
                default="traces",
                help="traces JSONL (default), NeMo Gym result rows, SFT rows (chat messages + token fields), or NeMo "
                "Gym TokenEntry records, one per call, in a Gym token store directory (rollout id = session id)",
            )
            cmd.add_argument(
                "--rollout-id",
                action="append",
                metavar="SESSION_ID=ROLLOUT_ID",
                help="gym-token-entries: the Gym rollout id of a session (repeatable)",
            )
        else:
            cmd.add_argument(
                "--recompute-logprobs",
                type=Path,
                metavar="MODEL_DIR",
                help="recompute trainable logprobs with transformers; report the mean and max absolute "
                "difference and KL (k3)",
            )
        cmd.set_defaults(func=_reconstruct)

    rollout = sub.add_parser(
        "rollout",
        help="run one harness session on a task, or a dataset with n_samples attempts each (Hydra overrides)",
        description="Compose conf/rollout.yaml with Hydra overrides. With task=FILE: run one session of a real "
        "coding CLI through a proxy session and write its directory (records, patch, logs, transcript). With "
        "dataset=bundled|swebench: attempt every instance n_samples times through the rollout gateway, grade, "
        "reconstruct (builder=prefix_merging|per_request) and write results.jsonl, traces.jsonl and sessions/. "
        "Examples: env=polar_pi task=examples/tasks/calc_add/task.yaml engine.url=http://127.0.0.1:8011 | "
        "env=polar_codex dataset=bundled n_samples=4 engine.url=... | --cfg to print the composed config.",
    )
    rollout.add_argument("overrides", nargs="*", help="e.g. env=polar_codex task=examples/tasks/calc_add/task.yaml")
    rollout.add_argument("--cfg", action="store_true", help="print the composed config and exit")
    rollout.set_defaults(func=_rollout)

    gen = sub.add_parser(
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
    _container_formatter_arg(gen)
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

    learn = sub.add_parser(
        "learn",
        help="a closed GRPO loop on this machine: rollouts through the proxy, traces, update, weights into vLLM",
        description="SmolLM2-135M-Instruct learns on this machine. With --harness NAME every rollout is a session of "
        "that unchanged CLI, run by the path the Gym environments serve NeMo-RL with (sandbox, proxy, swebench's "
        "grade, the verdict's mask), on generated tasks whose value exists only in a workspace file: a warm-up from "
        "the teacher's accepted sessions (SFT), then GRPO; held-out tasks are scored before the warm-up, at the start "
        "of RL and at its end. Without it, the quick mode: 'which number is bigger?' in one chat call per session. "
        "Each step: prefix-merged rows with per-session GRPO advantages, one step of NeMo-RL's clipped "
        "policy-gradient loss (torch, in the engine's virtualenv), then the proxy pauses, vLLM reloads the new "
        "weights in place and the proxy resumes with the next policy version. Writes OUT/seed-N/learn.json, "
        "OUT/learn.json and OUT/learn.html.",
    )
    learn.add_argument("-o", "--output", type=Path, default=Path("runs/learn"), help="the output directory")
    learn.add_argument("--harness", help="learn through this CLI (pi, mini_swe_agent, ...); default: the quick mode")
    learn.add_argument("--seed", type=int, action="append", help="a seed (repeatable; default: 0 and 1)")
    learn.add_argument("--steps", type=int, help="GRPO steps (default: 12; 4 with --harness)")
    learn.add_argument("--prompts", type=int, help="tasks per step, a GRPO group each (default: 8; 4 with --harness)")
    learn.add_argument("--generations", type=int, help="sessions per task: the group (default: 8; 4 with --harness)")
    learn.add_argument("--held-out", type=int, help="held-out tasks (default: 32; 12 with --harness)")
    learn.add_argument("--eval-samples", type=int, help="sessions per held-out task (default: 4; 2 with --harness)")
    learn.add_argument("--warmup-steps", type=int, help="--harness: SFT steps on the teacher's accepted sessions")
    learn.add_argument("--lr", type=float, help="GRPO's learning rate (default: 2e-5; 3e-5 with --harness)")
    learn.add_argument(
        "--staleness",
        type=int,
        choices=(0, 1),
        help="--harness: 1 runs step n+1's sessions while step n trains (async, truncated importance sampling)",
    )
    learn.set_defaults(func=_learn, seed=None)

    grade = sub.add_parser("grade", help="grade SWE-bench predictions with swebench's grader in fresh sandboxes")
    grade.add_argument(
        "--instances", type=Path, required=True, help="JSONL, local HF dataset files, a bundled task dir, or 'bundled'"
    )
    _container_formatter_arg(grade)
    grade.add_argument("--predictions", type=Path, required=True, help="{instance_id, model_patch} rows (JSONL/JSON)")
    grade.add_argument("--runtime", choices=["bwrap", "docker", "local"], default="bwrap")
    grade.add_argument(
        "-o",
        "--output",
        type=Path,
        required=True,
        help="the report (JSON); each evaluation log is kept in OUTPUT_STEM.logs/ beside it",
    )
    grade.set_defaults(func=_grade)

    conv = sub.add_parser(
        "convert-rows",
        help="convert legacy rows (SWE-Gym, SWE-bench before 5.0) into rows with eval_script, log_parser and image",
        description="Write each row's eval script, log parser and eval type with a pre-5.0 swebench's own spec tables "
        "(in a tool venv under $POLAR_CACHE/envs, built once), and name its image. Rows that already have an eval "
        "script are kept. Nothing is written unless every row converts.",
    )
    conv.add_argument("source", type=Path, help="JSONL, parquet/json files or a save_to_disk directory")
    conv.add_argument("-o", "--output", type=Path, required=True, help="the converted rows (JSONL)")
    conv.add_argument(
        "--image",
        required=True,
        help="'swebench' (swebench/sweb.eval.x86_64.<id, __ as _1776_>), 'swe-gym' (xingyaoww/..., __ as _s_), or a "
        "template with {instance_id}, {id_1776} or {id_s}",
    )
    conv.add_argument("--specs", type=Path, help="YAML {repo: {version: spec}} for repositories the tables lack")
    conv.add_argument(
        "--swebench", default="swebench==4.1.0", metavar="REQUIREMENT", help="the swebench to take the tables from"
    )
    conv.set_defaults(func=_convert_rows)

    view = sub.add_parser(
        "view",
        help="write a self-contained static HTML report of sessions, records or traces",
        description="One HTML page (inline CSS, no scripts) of session directories, a gateway state_dir, proxy record "
        "files or a traces JSONL: sessions, calls, chains and segments, tokens coloured by loss mask, break reasons "
        "and audit failures highlighted, reward and grader log.",
    )
    view.add_argument(
        "inputs",
        nargs="+",
        type=Path,
        metavar="INPUT",
        help="session directories (or directories of them), records JSONL, traces JSONL",
    )
    view.add_argument("-o", "--output", type=Path, required=True, help="the HTML file to write")
    view.add_argument("--tokenizer", type=Path, metavar="DIR", help="model directory whose tokenizer decodes ids")
    view.add_argument("--max-tokens", type=int, default=4000, help="tokens rendered per trace (default 4000)")
    view.set_defaults(func=_view)

    gym = sub.add_parser(
        "gym-root",
        help="print the NeMo Gym root to export as NEMO_GYM_EXTRA_ROOTS",
        description="Print the NeMo Gym root (export it as NEMO_GYM_EXTRA_ROOTS). With --wheel: build nemo_polar's "
        "wheel from this checkout and print its directory instead, for UV_FIND_LINKS: the agent's requirements.txt "
        "installs nemo-polar by name into the venv Gym builds (examples/nemo_rl/README.md).",
    )
    gym.add_argument("--wheel", action="store_true", help="build the wheel into $POLAR_CACHE/dist, print that dir")
    gym.add_argument("--wheel-dir", type=Path, metavar="DIR", help="build the wheel into DIR instead (implies --wheel)")
    gym.set_defaults(func=_gym_root)

    grecipe = sub.add_parser(
        "gym-recipe",
        help="check NeMo-RL GRPO recipes before any GPU time",
        description="Load each recipe the way NeMo-RL does (its defaults inheritance), merge its Gym part with "
        "nemo-gym's own parser, validate the Polar agents it configures and check that every dataset row routes to "
        "one of them; print each recipe's summary as JSON, or exit 1 naming the first problem. Needs "
        "POLAR_GYM_ROOT=$(polar gym-root) exported, as NeMo-RL does.",
    )
    grecipe.add_argument("recipes", nargs="+", type=Path, metavar="RECIPE", help="a NeMo-RL recipe (YAML)")
    grecipe.set_defaults(func=_gym_recipe)

    gvenvs = sub.add_parser(
        "gym-venvs",
        help="prepare the server venvs `gym env start` runs, on a Python older than nemo-gym's marker",
        description="On a Python older than nemo-gym's Requires-Python (uv will not install nemo-gym there), put a "
        "venv of this environment where Gym looks for each server's venv (the Polar agent, the native server, "
        "Gym's legacy_agent relay), reusing those that import what their server needs, and print the gym "
        "overrides that make Gym reuse them (++skip_venv_if_present=true). On a Python that meets the marker, "
        "print nothing: Gym builds its venvs itself. Use it as `gym env start ... $(polar gym-venvs ...)`.",
    )
    gvenvs.add_argument(
        "--environment", action="append", metavar="NAME", help="a polar_* environment (repeatable; default: all)"
    )
    gvenvs.add_argument(
        "--venv-dir", type=Path, metavar="DIR", help="Gym's uv_venv_dir (default: the working directory, as Gym's)"
    )
    gvenvs.set_defaults(func=_gym_venvs)

    harness = sub.add_parser("harness", help="the pinned coding CLIs")
    hsub = harness.add_subparsers(dest="action", required=True)
    hinstall = hsub.add_parser("install", help="install the pinned CLIs into the shared prefix (npm)")
    hinstall.add_argument("names", nargs="*", help=f"{', '.join(HARNESSES)} (default: all)")
    hinstall.set_defaults(func=_harness_install)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
