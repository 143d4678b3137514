"""``polar rollout``: compose the Hydra config, run one harness session, write its session directory."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from pydantic import BaseModel, Field

from nemo_polar.env.harness import get_harness
from nemo_polar.env.runtime import get_runtime
from nemo_polar.env.script import Action
from nemo_polar.env.session import ProxyClient, SessionResult, run_session
from nemo_polar.env.workspace import Task


def conf_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "conf"


def compose(overrides: list[str], config_name: str = "rollout") -> DictConfig:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        return hydra_compose(config_name=config_name, overrides=overrides)


class TaskFile(Task):
    script: list[Action] | None = Field(default=None, description="scripted policy turns, for the tiny models")


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


@contextlib.contextmanager
def engine_url(cfg: DictConfig) -> Iterator[str]:
    if cfg.engine.get("start"):
        from nemo_polar.engine.launcher import EngineProcess, EngineSpec, free_port

        with EngineProcess(EngineSpec(model=cfg.engine.model, port=free_port())) as engine:
            yield engine.spec.url
        return
    if not cfg.engine.url:
        raise SystemExit(
            "polar rollout: no engine. Pass engine.url=http://HOST:PORT (or set POLAR_ENGINE_URL), "
            "start one with `polar engine up`, or use engine=embedded"
        )
    yield cfg.engine.url


@contextlib.contextmanager
def proxy_client(cfg: DictConfig, engine: str, record_dir: Path) -> Iterator[ProxyClient]:
    if cfg.proxy.url:
        yield ProxyClient(url=cfg.proxy.url, admin_token=cfg.proxy.admin_token)
        return
    from nemo_polar.proxy.app import ProxyConfig, create_app
    from nemo_polar.proxy.serve import BackgroundServer

    app = create_app(ProxyConfig(engine_url=engine, record_dir=record_dir, model_aliases=[cfg.model]))
    with BackgroundServer(app) as server:
        yield ProxyClient(url=server.url)


class RolloutSummary(BaseModel):
    env: str
    status: str
    calls: int
    patch_lines: int
    egress_attempts: int
    session_dir: Path
    timings: dict[str, float]


def rollout(cfg: DictConfig) -> SessionResult:
    task = load_task(Path(cfg.task))
    harness = get_harness(cfg.env.harness, **OmegaConf.to_container(cfg.env.harness_options))  # type: ignore[arg-type]
    runtime = get_runtime(cfg.runtime.name)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(cfg.out) if cfg.out else Path("runs") / cfg.env.name / f"{task.instance_id}-{stamp}"
    session: dict[str, Any] = OmegaConf.to_container(cfg.env.session)  # type: ignore[assignment]
    with engine_url(cfg) as engine, proxy_client(cfg, engine, out / "proxy") as proxy:
        return run_session(
            harness,
            task,
            runtime,
            proxy,
            out,
            script=task.script,
            session_config=session,
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
