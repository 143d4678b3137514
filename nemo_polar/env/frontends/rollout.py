"""``polar rollout``: compose the Hydra config, then run one harness session on a task file (its session
directory), or ``n_samples`` attempts per instance of a dataset through the rollout gateway (graded, reconstructed,
with GRPO group advantages)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from pydantic import BaseModel, Field

from nemo_polar.env.harness import get_harness
from nemo_polar.env.harness.script import Action
from nemo_polar.env.polar_env import PolarEnv, PolarEnvConfig
from nemo_polar.env.runtime.session import SessionResult, run_session
from nemo_polar.env.specs import EnvOverrides, PolarEnvSpec, resolve_env
from nemo_polar.progress import AttemptsProgress
from nemo_polar.proxy.http.client import ProxyClient
from nemo_polar.proxy.http.pool import ProxyPool, session_proxy
from nemo_polar.reconstruct.export import write_jsonl
from nemo_polar.rewards.instance import SWEInstance
from nemo_polar.sandbox import get_runtime
from nemo_polar.sandbox.workspace import Task


def conf_dir() -> Path:
    from nemo_polar.paths import conf_dir as package_conf_dir

    return package_conf_dir()


def compose(overrides: list[str], config_name: str = "rollout") -> DictConfig:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        return hydra_compose(config_name=config_name, overrides=overrides)


class TaskFile(Task):
    script: list[Action] | None = Field(default=None, description="scripted policy turns, for the tiny models")


def task_script(task: TaskFile, scripted: bool | None) -> list[Action] | None:
    """The policy turns a task-file session is held to: the file's script unless ``scripted=false`` (the model
    chooses its own actions); ``scripted=true`` needs a file that has one. ``None`` (the default): the file decides."""
    if scripted is True and not task.script:
        raise ValueError(f"scripted=true, but the task file of {task.instance_id} has no script")
    return None if scripted is False else task.script


def load_task(path: Path) -> TaskFile:
    """A task file; ``repo`` is relative to the file. Errors name the file."""
    if not path.is_file():
        raise FileNotFoundError(f"task file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text())
        task = TaskFile.model_validate(data)
    except (yaml.YAMLError, ValueError) as exc:
        raise ValueError(f"{path}: not a valid task file: {exc}") from None
    if not task.repo.is_absolute():
        task.repo = (path.parent / task.repo).resolve()
    return task


def output_dir(cfg: DictConfig, what: str) -> Path:
    """``out``, else ``runs/<env>/<what>-<time>``."""
    return Path(cfg.out) if cfg.out else Path("runs") / cfg.env.name / f"{what}-{time.strftime('%Y%m%d-%H%M%S')}"


@contextlib.contextmanager
def engine_url(cfg: DictConfig) -> Iterator[str | None]:
    """The policy engine's URL: started for the run (engine=embedded), given, or None where a running proxy (which
    has its own engine) is named."""
    if cfg.proxy.url or cfg.proxy.admin_url or cfg.proxy.get("pool_file"):
        yield None
        return
    if cfg.engine.get("start"):
        from nemo_polar.engine.launcher import EngineProcess, EngineSpec, free_port

        with EngineProcess(EngineSpec(model=cfg.engine.model, port=free_port())) as engine:
            yield engine.spec.url
        return
    if not cfg.engine.url:
        raise ValueError(
            "no engine. Pass engine.url=http://HOST:PORT (or set POLAR_ENGINE_URL), start one with `polar engine up`, "
            "use engine=embedded, or name a running proxy (proxy.url=... proxy.admin_url=...)"
        )
    yield cfg.engine.url


@contextlib.contextmanager
def proxy_client(cfg: DictConfig, engine: str | None, record_dir: Path) -> Iterator[ProxyClient | ProxyPool]:
    """The config's proxy: a pool of running workers (``proxy.pool_file``), a running proxy, or one served here."""
    if pool_file := cfg.proxy.get("pool_file"):
        yield load_pool(Path(pool_file), cfg.proxy.admin_token)
        return
    with serve_proxy(
        engine,
        record_dir,
        cfg.model,
        url=cfg.proxy.url,
        admin_url=cfg.proxy.admin_url,
        admin_token=cfg.proxy.admin_token,
    ) as client:
        yield client


@contextlib.contextmanager
def serve_proxy(
    engine: str | None,
    record_dir: Path,
    model: str,
    *,
    url: str | None = None,
    admin_url: str | None = None,
    admin_token: str | None = None,
) -> Iterator[ProxyClient]:
    """A running proxy (``url``: its model API, ``admin_url``: its admin API) or one served in-process in front of
    ``engine`` for as long as the block runs (with a random admin token)."""
    if url or admin_url:
        if not (url and admin_url):
            raise ValueError("a running proxy needs both its model API url and its admin_url (separate listeners)")
        yield ProxyClient(url=url, admin_url=admin_url, **({"admin_token": admin_token} if admin_token else {}))
        return
    if not engine:
        raise ValueError("no policy engine: pass an engine URL or a running proxy's URL")
    check_engine(engine)
    from nemo_polar.proxy.http.config import ProxyConfig
    from nemo_polar.proxy.http.serve import ProxyServer

    with ProxyServer(ProxyConfig(engine_url=engine, record_dir=record_dir, model_aliases=[model])) as server:
        yield server.client()


def load_pool(path: Path, admin_token: str | None = None) -> ProxyPool:
    """A pool file (``polar proxy --pool-file``): the workers' addresses; their token given, else $POLAR_ADMIN_TOKEN."""
    try:
        pool = ProxyPool.model_validate_json(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"proxy.pool_file {path}: not a pool file of `polar proxy --workers` ({exc})") from None
    if admin_token:
        pool = pool.model_copy(
            update={"workers": [w.model_copy(update={"admin_token": admin_token}) for w in pool.workers]}
        )
    return pool


def check_engine(url: str) -> None:
    """Fail before any sandbox starts when the engine is not there, saying what to do."""
    try:
        httpx.get(f"{url.rstrip('/').removesuffix('/v1')}/health", timeout=10).raise_for_status()
    except httpx.HTTPError as exc:
        raise ValueError(
            f"the engine at {url} is not reachable ({exc}); start one with `polar engine up` or pass another URL"
        ) from None


class RolloutSummary(BaseModel):
    env: str
    status: str
    calls: int
    patch_lines: int
    egress_attempts: int
    session_dir: Path
    timings: dict[str, float]


def rollout(cfg: DictConfig) -> SessionResult:
    if not cfg.task:
        raise ValueError("give a task file (task=PATH) or a dataset (dataset=bundled n_samples=4)")
    task = load_task(Path(cfg.task))
    script = task_script(task, cfg.scripted)
    spec = env_spec(cfg)
    harness = get_harness(spec.harness, **spec.harness_options)
    runtime = get_runtime(cfg.runtime.name)
    out = output_dir(cfg, task.instance_id)
    with engine_url(cfg) as engine, proxy_client(cfg, engine, out / "proxy") as proxy:
        return run_session(
            harness,
            task,
            runtime,
            session_proxy(proxy, task.instance_id),
            out,
            script=script,
            session_config=spec.session,
            timeout=float(cfg.timeout),
            model=cfg.model,
        )


def summary(cfg: DictConfig, result: SessionResult) -> RolloutSummary:
    return RolloutSummary(
        env=cfg.env.name,
        status=result.status,
        calls=result.calls,
        patch_lines=len(result.patch.splitlines()),
        egress_attempts=len(result.egress),
        session_dir=result.session_dir,
        timings=result.timings,
    )


# -- datasets: n_samples attempts per instance through the gateway ---------------------------------------------------
def dataset_instances(dataset: DictConfig) -> list[SWEInstance]:
    from nemo_polar.rewards.datasets import select_instances

    limit = int(dataset.limit) if dataset.get("limit") else None
    try:
        formatter = dataset.get("container_formatter")
        formatter = list(formatter) if isinstance(formatter, ListConfig) else formatter
        return select_instances(str(dataset.path), list(dataset.get("instance_ids") or []), limit, formatter)
    except ValueError as exc:
        raise ValueError(f"dataset {dataset.name}: {exc}") from None


class DatasetSummary(BaseModel):
    env: str
    dataset: str
    n_samples: int
    attempts: int
    trainable: int
    masked: int
    resolved: int
    mean_reward: float | None
    traces: int
    per_instance: dict[str, float | None] = Field(description="instance id -> mean reward of its trainable attempts")
    out: Path


def env_spec(cfg: DictConfig) -> PolarEnvSpec:
    """The composed env group with the top-level ``harness_options`` / ``session`` overrides over it."""
    container: dict[str, Any] = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
    overrides = EnvOverrides(harness_options=container["harness_options"], session=container["session"])
    return resolve_env(PolarEnvSpec.model_validate(container["env"]), overrides)


def env_config(cfg: DictConfig, proxy: ProxyClient | ProxyPool, state_dir: Path) -> PolarEnvConfig:
    """The composed config is shaped like :class:`PolarEnvConfig` (``conf/rollout.yaml``): validated as it is."""
    container: dict[str, Any] = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
    return PolarEnvConfig.model_validate({**container, "proxy": proxy, "state_dir": state_dir})


def collect_dataset(cfg: DictConfig, progress: AttemptsProgress | None = None) -> DatasetSummary:
    """Run ``n_samples`` attempts of every dataset instance; write ``results.jsonl`` (one line per attempt) and
    ``traces.jsonl`` (every trace with its reward and advantage) next to the gateway's ``sessions/``."""
    instances = dataset_instances(cfg.dataset)
    if progress is not None:
        progress.start(len(instances) * int(cfg.n_samples))
    out = output_dir(cfg, cfg.dataset.name)
    with engine_url(cfg) as engine, proxy_client(cfg, engine, out / "proxy") as proxy:
        env = PolarEnv(env_config(cfg, proxy, out / "sessions"))
        groups = env.collect(instances, int(cfg.n_samples), on_sample=progress)
    samples = [s for g in groups for s in g.samples]
    write_jsonl((s.model_dump(mode="json", exclude={"traces"}) for s in samples), out / "results.jsonl")
    write_jsonl((t for s in samples for t in s.traces), out / "traces.jsonl")
    rewards = [s.reward for s in samples if s.reward is not None]
    return DatasetSummary(
        env=cfg.env.name,
        dataset=cfg.dataset.name,
        n_samples=int(cfg.n_samples),
        attempts=len(samples),
        trainable=len(rewards),
        masked=len(samples) - len(rewards),
        resolved=sum(1 for s in samples if s.outcome.grade is not None and s.outcome.grade.resolved),
        mean_reward=sum(rewards) / len(rewards) if rewards else None,
        traces=sum(len(s.traces) for s in samples),
        per_instance={g.instance_id: g.mean_reward for g in groups},
        out=out,
    )
