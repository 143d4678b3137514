"""One Polar episode per Gym row, served by the Polar agent (:mod:`.agent`) and the Polar environment server
(:mod:`.environment_server`) alike.

Episodes go through a rollout gateway (``staging: gateway``, the default): concurrent runs share its INIT, RUN and
POSTRUN pools, so preparing workspaces and grading overlap the harness runs that keep the engine busy. The CLI
talks to the Polar proxy (which records the exact token ids), its patch is graded by swebench in a fresh sandbox,
and the recorded calls are merged into the main chain, which becomes ``response.output``: one prefix-contiguous,
token-bearing item per model call, the shape NeMo-RL's Gym post-processing asserts. Anything that makes the reward
or the tokens untrustworthy (infrastructure failure, timeout, harness error, no main chain, a broken main chain)
sets ``mask_sample`` with ``failure_kind``/``failure_reason``; a row that cannot run raises :class:`RowError`, each
server answering it in its own protocol (a 422, a terminal episode failure). Needs ``nemo-gym``.
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import httpx
from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from nemo_polar.env.gateway import GatewayConfig, GatewayThread, SessionRequest
from nemo_polar.env.gym.compat import (
    BaseRunRequest,
    BaseVerifyResponse,
    NeMoGymResponse,
    NeMoGymResponseOutputMessageForTraining,
    maybe_rollout_id_from_run_body,
)
from nemo_polar.env.gym.rows import RowError, instance_from_row, instruction, validation_message
from nemo_polar.env.gym.trajectory import trajectory, usage
from nemo_polar.env.harness import HARNESSES, get_harness
from nemo_polar.env.harness.script import script_adapter
from nemo_polar.env.runtime.attempt import AttemptDir
from nemo_polar.env.runtime.episode import Episode, run_episode
from nemo_polar.env.runtime.session import close_quietly
from nemo_polar.env.runtime.verdict import Verdict, VerdictPolicy
from nemo_polar.env.specs import EnvOverrides, PolarEnvSpec, UnknownEnv, get_env, resolve_env
from nemo_polar.paths import cache_dir
from nemo_polar.proxy.http.client import ProxyClient
from nemo_polar.proxy.store.records import CallRecord
from nemo_polar.reconstruct.builders import per_request, prefix_merging
from nemo_polar.reconstruct.envelope import Envelope, training_traces
from nemo_polar.reconstruct.gym import gym_output_items
from nemo_polar.rewards.gym_rows import swe_fields
from nemo_polar.rewards.instance import SWEInstance

# ``staging: direct`` calls it like ``run_episode(harness, instance, proxy, session_dir, runtime=, scripted=,
# timeout=, session_config=, policy=)``; injectable for fault injection.
EpisodeRunner = Callable[..., Episode]
BUILDERS = {"prefix_merging": prefix_merging, "per_request": per_request}
OnStart = Callable[[str, Callable[[], Awaitable[Any]]], Any]


class PolarSettings(BaseModel):
    """What a Polar episode server is configured with, as a Gym agent or as an environment server."""

    env: str = Field(description="the Polar env (conf/env/<name>.yaml): harness, its options, proxy session config")
    harness: str | None = Field(default=None, description="overrides the env's harness")
    harness_options: dict[str, Any] = Field(default_factory=dict, description="merged over the env's")
    session: dict[str, Any] = Field(default_factory=dict, description="proxy SessionConfig fields, over the env's")
    runtime: Literal["bwrap", "docker", "local"] = "bwrap"
    scripted: bool = Field(default=False, description="drive the CLI with the instance's scripted policy turns")
    timeout: float = Field(default=600.0, gt=0, description="seconds for the CLI run; its process group is killed")
    model: str = Field(default="local-model", description="the policy's model name (an alias the proxy accepts)")
    openai_base_url: str | list[str] | None = Field(
        default=None, description="the policy engine(s) (vLLM); one in-process proxy is started per engine"
    )
    proxy_url: str | None = Field(
        default=None, description="a running `polar proxy`'s model API; used instead of engines"
    )
    proxy_admin_url: str | None = Field(default=None, description="that proxy's admin API (its own listener)")
    proxy_admin_token: str | None = None
    work_dir: Path | None = Field(default=None, description="session directories; default <cache>/gym")
    keep_sessions: bool = Field(default=True, description="keep each session directory (records, patch, logs)")
    concurrency: int = Field(default=8, ge=1, description="harness sessions run at once (the gateway's run slots)")
    staging: Literal["gateway", "direct"] = Field(
        default="gateway",
        description="gateway: episodes go through a rollout gateway (INIT/RUN/POSTRUN pools, so preparing and grading "
        "overlap the harness runs); direct: each /run prepares, runs and grades in turn",
    )
    gateway: dict[str, Any] = Field(
        default_factory=dict, description="GatewayConfig fields over the defaults (init_workers, post_workers, ...)"
    )
    container_formatter: str | list[str] | None = Field(
        default=None,
        description="the instance image of a row that names none, as Gym's SWE agents take it: a template with "
        "{instance_id}, a .sif path (the first existing, id as is, then __ as _1776_ or _s_) or an image name "
        "(docker://swebench/sweb.eval.x86_64.{instance_id}: __ as _1776_, lower case), or a list tried in order",
    )
    delivery: Literal["main_chain", "all_traces"] = Field(
        default="main_chain",
        description="main_chain: response.output only; all_traces: also every trace of the rollout as the "
        "training_traces envelope (Gym PR #3212, NeMo-RL grpo.gym_multi_trace)",
    )
    builder: Literal["prefix_merging", "per_request"] = Field(
        default="prefix_merging", description="how all_traces cuts the rollout's calls into traces"
    )
    mask_main_chain_breaks: bool = Field(
        default=True,
        description="mask a rollout whose main chain broke into segments: the delivered one does not cover the "
        "trajectory the reward grades",
    )

    @field_validator("env")
    @classmethod
    def _known_env(cls, name: str) -> str:
        get_env(name)
        return name

    @field_validator("harness")
    @classmethod
    def _known_harness(cls, name: str | None) -> str | None:
        if name is not None and name not in HARNESSES:
            raise ValueError(f"unknown harness {name!r}; choose one of {', '.join(HARNESSES)}")
        return name

    @model_validator(mode="after")
    def _has_policy(self) -> PolarSettings:
        if not self.proxy_url and not self.openai_base_url:
            raise ValueError("set proxy_url (a running polar proxy) or openai_base_url (the policy engine)")
        if self.proxy_url and not self.proxy_admin_url:
            raise ValueError("proxy_url needs proxy_admin_url: the proxy's admin API is a separate listener")
        return self

    @model_validator(mode="after")
    def _builder_needs_all_traces(self) -> PolarSettings:
        if self.builder == "per_request" and self.delivery != "all_traces":  # Gym's rule: the main chain is merged
            raise ValueError("builder per_request needs delivery all_traces (main_chain delivers the merged chain)")
        return self

    def engine_urls(self) -> list[str]:
        urls = [self.openai_base_url] if isinstance(self.openai_base_url, str) else list(self.openai_base_url or [])
        # Gym hands out OpenAI base URLs (.../v1); the proxy wants the engine's root.
        return [u.rstrip("/").removesuffix("/v1") for u in urls]


class PolarRunRequest(BaseRunRequest):
    """A Gym row: ``responses_create_params`` plus the SWE-bench instance fields (kept as extras)."""

    model_config = ConfigDict(extra="allow")

    polar_env: str | None = Field(default=None, description="run this row in another Polar env than the agent's")


class PolarVerifyResponse(BaseVerifyResponse):
    """The verify response plus the episode's metrics (top-level, so Gym's aggregate metrics see them).

    The mask is declared here, not inherited: nemo-gym 0.5.1 (NeMo-RL's Gym) has no ``mask_sample`` on
    ``BaseVerifyResponse`` and pydantic would drop it. NeMo-RL reads it from ``instance_config``
    (``nemo_rl/experience/rollouts.py::_extract_mask_sample_flags`` at NVIDIA-NeMo/RL 7ea279ab), Gym 0.7.0's own
    consumers from the top level, so it is carried in both places.
    """

    mask_sample: bool = False
    failure_kind: str | None = None
    failure_reason: str | None = None
    instance_config: dict[str, Any] = Field(
        default_factory=dict, description="mask_sample, failure_kind, failure_reason where NeMo-RL reads them"
    )
    instance_id: str
    polar_env: str
    harness: str
    session_id: str | None = None
    session_status: str | None = Field(default=None, description="None when the episode itself raised")
    grade_status: str | None = None
    resolved: bool | None = None
    fail_to_pass: float | None = None
    pass_to_pass: float | None = None
    calls: int = 0
    failed_calls: int = 0
    traces: int = 0
    main_segments: int = 0
    subagent_chains: int = 0
    compaction_chains: int = 0
    side_chains: int = 0
    break_reasons: dict[str, int] = Field(default_factory=dict)
    delivered_calls: int = 0
    delivered_fraction: float = 0.0
    trainable_tokens: int = 0
    policy_versions: list[int] = Field(default_factory=list)
    egress_refused: int = 0
    timings: dict[str, float] = Field(default_factory=dict)
    stage_times: dict[str, float] = Field(
        default_factory=dict, description="gateway stage -> wall-clock time entered (staging: gateway)"
    )
    session_dir: str | None = None
    training_traces: dict[str, Any] | None = Field(
        default=None, description="delivery all_traces: every trace of the rollout (reconstruct/envelope.py)"
    )
    training_traces_masked: dict[str, str] = Field(
        default_factory=dict, description="calls or traces kept out of training_traces, and why"
    )
    # Left out when None: Gym builds an empty trajectory from a null one (nemo_gym/rollout_collection.py:2631-2637).
    ng_trajectory: dict[str, Any] | None = Field(
        default=None,
        exclude_if=lambda v: v is None,
        description="the session as Gym 0.7's standardized trajectory, what its health checks read (gym/trajectory.py)",
    )


def close_on_shutdown(app: FastAPI, close: Callable[[], None]) -> FastAPI:
    """``app`` with ``close`` run when it shuts down: the gateway's sessions and the proxies end with the server."""
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[Any]:
        async with inner(app) as state:
            yield state
        close()

    app.router.lifespan_context = lifespan
    return app


class PolarEpisodes:
    """The episodes of one server: its proxies (started on first use), its gateway, its run slots."""

    def __init__(self, config: PolarSettings, name: str, episode_runner: EpisodeRunner = run_episode) -> None:
        self.config = config
        self.name = name  # the server's name, in each session's metadata
        self.episode_runner = episode_runner
        self._semaphore: asyncio.Semaphore | None = None
        self._lock = threading.Lock()
        self._proxies: list[Any] = []
        self._turn = itertools.count()
        self._gateway_host: GatewayThread | None = None

    async def run(self, body: PolarRunRequest) -> PolarVerifyResponse:
        """The row's episode as a verify response; :class:`RowError` for a row that cannot run."""
        return (await self.episode(body))[0]

    async def episode(
        self, body: PolarRunRequest, on_start: OnStart | None = None
    ) -> tuple[PolarVerifyResponse, Verdict]:
        """The verify response and the verdict it was made from. ``on_start(name, stop)`` is told how to stop the
        session once it is queued (idempotent; a no-op once it has finished)."""
        try:
            env, instance, session_dir = await asyncio.to_thread(self._plan, body)  # may run a tool (eval script)
        except (UnknownEnv, ValueError) as exc:  # RowError among them
            raise RowError(str(exc)) from None
        t0 = time.monotonic()
        attempt = AttemptDir(session_dir)
        if self.config.staging == "gateway":
            request = SessionRequest(
                request_id=attempt.name,
                harness=env.harness,
                harness_options=env.harness_options,
                instance=instance,
                scripted=self.config.scripted,
                session_config=self._session_config(body, env),
                proxy=self._proxy_client(),
            )
            gateway = self._gateway(attempt.root.parent)

            async def stop() -> None:
                await asyncio.to_thread(gateway.cancel, request.request_id)

            if on_start is not None:
                on_start("polar session", stop)
            try:
                outcome = await gateway.run(request)
            except asyncio.CancelledError:
                if on_start is None:  # no cleanup context to stop it: a caller that stopped waiting stops the session
                    await asyncio.shield(stop())
                raise
            episode = Episode(
                verdict=outcome.verdict, grade=outcome.grade, output=outcome.output, metrics=outcome.metrics
            )
            stage_times = outcome.stage_times
        else:
            if self._semaphore is None:
                self._semaphore = asyncio.Semaphore(self.config.concurrency)
            async with self._semaphore:
                episode = await asyncio.to_thread(self._episode, body, env, instance, attempt)
            stage_times = {}
        return await asyncio.to_thread(self._result, body, env, instance, attempt, episode, stage_times, t0)

    # -- planning: everything a row can get wrong, before anything runs -----------------------------------------
    def _plan(self, body: PolarRunRequest) -> tuple[PolarEnvSpec, SWEInstance, Path]:
        c = self.config
        overrides = EnvOverrides(
            harness=None if body.polar_env else c.harness, harness_options=c.harness_options, session=c.session
        )
        env = resolve_env(body.polar_env or c.env, overrides)
        row = {**(body.model_extra or {}), "responses_create_params": self._params(body)}
        instance = instance_from_row(row, container_formatter=self.config.container_formatter)
        if self.config.scripted:
            if not instance.script:
                raise RowError(f"{instance.instance_id}: the agent is scripted but the instance has no script")
            try:
                script_adapter.validate_python(instance.script)
            except ValidationError as exc:
                raise RowError(f"{instance.instance_id}: invalid script: {validation_message(exc)}") from None
        rollout_id = maybe_rollout_id_from_run_body(body)  # raises ValueError on a malformed _ng_rollout_id
        work_dir = self.config.work_dir or cache_dir() / "gym"
        return env, instance, work_dir / f"{rollout_id or instance.instance_id}-{uuid.uuid4().hex[:8]}"

    @staticmethod
    def _params(body: PolarRunRequest) -> dict[str, Any]:
        """``responses_create_params`` as the row sent it (Gym's model keeps ``metadata`` as an extra)."""
        return body.responses_create_params.model_dump(exclude_none=True)

    def _session_config(self, body: PolarRunRequest, env: PolarEnvSpec) -> dict[str, Any]:
        session_config = {**env.session}
        metadata = {**session_config.get("metadata", {}), "gym_agent": self.name}
        if rollout_id := maybe_rollout_id_from_run_body(body):
            metadata["rollout_id"] = rollout_id
        session_config["metadata"] = metadata
        return session_config

    def _policy(self) -> VerdictPolicy:
        """What ``staging: direct`` judges by: the same choices the gateway is given (see :meth:`_gateway`)."""
        c = self.config
        return VerdictPolicy.model_validate({"mask_main_chain_breaks": c.mask_main_chain_breaks, **c.gateway})

    # -- one episode (blocking: runs in a worker thread) ----------------------------------------------------------
    def _episode(self, body: PolarRunRequest, env: PolarEnvSpec, instance: SWEInstance, attempt: AttemptDir) -> Episode:
        """``staging: direct``: prepare, run and grade in this thread."""
        try:
            return self.episode_runner(
                get_harness(env.harness, **env.harness_options),
                instance,
                self._proxy_client(),
                attempt.root,
                runtime=self.config.runtime,
                scripted=self.config.scripted,
                timeout=self.config.timeout,
                session_config=self._session_config(body, env),
                policy=self._policy(),
            )
        except Exception as exc:  # an infrastructure failure is a masked sample, never a 500 for the whole batch
            return Episode.failed("run_failed", f"{type(exc).__name__}: {exc}")

    def _result(
        self,
        body: PolarRunRequest,
        env: PolarEnvSpec,
        instance: SWEInstance,
        attempt: AttemptDir,
        episode: Episode,
        stage_times: dict[str, float],
        t0: float,
    ) -> tuple[PolarVerifyResponse, Verdict]:
        """The episode's verdict, main chain and metrics as the verify response (whichever way it ran), and the
        verdict it stands on."""
        metrics = {k: v for k, v in episode.metrics.items() if k in PolarVerifyResponse.model_fields}
        metrics |= {
            "instance_id": instance.instance_id,
            "polar_env": env.name,
            "harness": env.harness,
            "session_dir": str(attempt.root),
            "stage_times": stage_times,
            "timings": {**episode.metrics.get("timings", {}), "episode_s": time.monotonic() - t0},
        }
        verdict = episode.verdict
        wants_all = self.config.delivery == "all_traces"
        records = attempt.read_records()
        if wants_all:
            try:
                envelope = self._envelope(body, attempt, records)
                metrics["training_traces"] = envelope.training_traces.model_dump(mode="json")
                metrics["training_traces_masked"] = envelope.masked
            except ValueError as exc:  # our traces broke the envelope's rules: never deliver them as something else
                verdict = Verdict(kind="reconstruction_failed", reason=f"training_traces: {exc}", reward=verdict.reward)
        if not self.config.keep_sessions:
            shutil.rmtree(attempt.root, ignore_errors=True)
            metrics["session_dir"] = None
        reward = verdict.reward if verdict.trainable and verdict.reward is not None else 0.0
        response = self._respond(body, episode.output, reward, verdict, metrics, records)
        rollout_id = maybe_rollout_id_from_run_body(body) or attempt.name  # the ids Gym gives the rollout
        response.ng_trajectory = trajectory(records, instance.instance_id, rollout_id, self.config.model)
        return response, verdict

    def _envelope(self, body: PolarRunRequest, attempt: AttemptDir, records: list[CallRecord]) -> Envelope:
        """Every trace of the episode as the ``training_traces`` envelope, by the configured builder."""
        build = BUILDERS[self.config.builder](records)
        rollout_id = maybe_rollout_id_from_run_body(body) or attempt.name
        return training_traces(rollout_id, self.config.builder, build.traces)

    def _respond(
        self,
        body: PolarRunRequest,
        items: list[dict[str, Any]],
        reward: float,
        verdict: Verdict,
        metrics: dict[str, Any],
        records: list[CallRecord],
    ) -> PolarVerifyResponse:
        failure_kind = verdict.gym_failure_kind
        failure_reason = verdict.reason if verdict.mask_sample else None
        if failure_kind is not None and not any(i.get("generation_token_ids") for i in items):
            items = self._generation_items(body, records)
        output = [NeMoGymResponseOutputMessageForTraining.model_validate(item) for item in items]
        response = NeMoGymResponse(
            id=f"resp_{metrics.get('session_id') or uuid.uuid4().hex}",
            created_at=int(time.time()),
            model=self.config.model,
            object="response",
            output=output,
            parallel_tool_calls=True,
            tool_choice="auto",
            tools=[],
            usage=usage(records),
        )
        return PolarVerifyResponse(
            responses_create_params=body.responses_create_params,
            response=response,
            reward=reward,
            mask_sample=failure_kind is not None,
            failure_kind=failure_kind,
            failure_reason=failure_reason,
            instance_config={
                "mask_sample": failure_kind is not None,
                "failure_kind": failure_kind,
                "failure_reason": failure_reason,
            },
            **metrics,
        )

    def _generation_items(self, body: PolarRunRequest, records: list[CallRecord]) -> list[dict[str, Any]]:
        """Real generation data for a masked result. NeMo-RL raises on a result without any ("NeMo Gym returned a
        result with no generation data", ``nemo_rl/environments/nemo_gym.py`` at 7ea279ab) and nothing catches it,
        so one failed episode would end the batch; with an item it is masked instead. The item is the first call the
        engine completed in the episode or, when none was made, one minimal engine call for the row's prompt."""
        first = next((r for r in records if r.complete and r.sampled_token_ids), None) or self._probe_call(body)
        if first is None:  # the engine itself is unreachable: nothing real to send
            return []
        [trace] = per_request([first]).traces
        return gym_output_items(trace, {first.call_id: first})

    def _probe_call(self, body: PolarRunRequest) -> CallRecord | None:
        """One token for the row's prompt through a proxy session (so it is recorded like any call), or None."""
        row = {**(body.model_extra or {}), "responses_create_params": self._params(body)}
        text = instruction(row["responses_create_params"]) or str(swe_fields(row).get("problem_statement") or ".")
        request = {"model": self.config.model, "messages": [{"role": "user", "content": text}]}
        try:
            proxy = self._proxy_client()
            session_id, key = proxy.create_session(
                {"sampling_overrides": {"max_tokens": 1}, "metadata": {"gym_agent": self.name, "probe": True}}
            )
        except (ConnectionError, RuntimeError, OSError):
            return None
        try:
            httpx.post(
                f"{proxy.url}/v1/chat/completions",
                json=request,
                headers={"authorization": f"Bearer {key}"},
                timeout=120,
            )
            records = proxy.records(session_id)
        except (httpx.HTTPError, ConnectionError, RuntimeError):
            return None
        finally:
            close_quietly(proxy, session_id)
        return next((r for r in records if r.complete and r.sampled_token_ids), None)

    # -- the proxy the CLI talks to -----------------------------------------------------------------------------
    def _proxy_client(self) -> ProxyClient:
        if self.config.proxy_url:
            assert self.config.proxy_admin_url is not None
            token = self.config.proxy_admin_token
            return ProxyClient(  # no token configured: $POLAR_ADMIN_TOKEN (Gym passes configs on argv)
                url=self.config.proxy_url,
                admin_url=self.config.proxy_admin_url,
                **({"admin_token": token} if token else {}),
            )
        with self._lock:
            if not self._proxies:
                self._start_proxies()
            server = self._proxies[next(self._turn) % len(self._proxies)]
        return server.client()

    def _start_proxies(self) -> None:
        from nemo_polar.proxy.http.config import ProxyConfig
        from nemo_polar.proxy.http.serve import ProxyServer

        record_dir = (self.config.work_dir or cache_dir() / "gym") / "records"
        aliases = list(dict.fromkeys([self.config.model, "local-model"]))  # run_session names its model local-model
        for url in self.config.engine_urls():
            # NeMo-RL's vLLM server lists no models: it serves the policy under the agent's model name.
            config = ProxyConfig(
                engine_url=url, record_dir=record_dir, model_aliases=aliases, served_model=self.config.model
            )
            self._proxies.append(ProxyServer(config).__enter__())

    def _gateway(self, state_dir: Path) -> GatewayThread:
        default_proxy = self._proxy_client()  # before the lock: it takes the lock itself
        with self._lock:
            if self._gateway_host is None:
                c = self.config
                config = GatewayConfig.model_validate(
                    {
                        "state_dir": state_dir,
                        "runtime": c.runtime,
                        "run_slots": c.concurrency,
                        "agent_budget_s": c.timeout,
                        "session_budget_s": c.timeout + 1800,  # INIT and grading on top of the agent's run
                        "mask_main_chain_breaks": c.mask_main_chain_breaks,
                        **c.gateway,
                    }
                )
                self._gateway_host = GatewayThread(config, default_proxy)
            return self._gateway_host

    def close(self) -> None:
        with self._lock:
            if self._gateway_host is not None:
                self._gateway_host.close()
                self._gateway_host = None
            for server in self._proxies:
                server.__exit__(None, None, None)
            self._proxies.clear()
