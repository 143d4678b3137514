"""The Polar agent server for NeMo Gym: one ``/run`` = one episode of a real coding CLI on a SWE task
(:mod:`.episodes`), behind Gym's ``legacy_agent`` relay; rows the agent cannot run are answered with a 422 naming the
problem. :mod:`.environment_server` serves the same episodes as a native Gym environment server. Needs ``nemo-gym``
(``make gym``).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from fastapi import Body, FastAPI, HTTPException
from pydantic import Field, PrivateAttr

from nemo_polar.env.gym.compat import BaseResponsesAPIAgentConfig, NeMoGymResponse, SimpleResponsesAPIAgent
from nemo_polar.env.gym.episodes import (
    EpisodeRunner,
    PolarEpisodes,
    PolarRunRequest,
    PolarSettings,
    PolarVerifyResponse,
    close_on_shutdown,
)
from nemo_polar.env.gym.rows import RowError
from nemo_polar.env.runtime.episode import run_episode

__all__ = ["PolarAgent", "PolarAgentConfig", "PolarRunRequest", "PolarVerifyResponse"]


class PolarAgentConfig(PolarSettings, BaseResponsesAPIAgentConfig):
    """The agent server's instance config: the Polar settings over Gym's agent fields."""


class PolarAgent(SimpleResponsesAPIAgent):
    ray_enabled: ClassVar[bool | None] = False  # episodes run in threads; no Ray cluster for run_webserver to start
    config: PolarAgentConfig
    episode_runner: EpisodeRunner = Field(default=run_episode, exclude=True)

    _episodes: PolarEpisodes | None = PrivateAttr(default=None)

    @property
    def episodes(self) -> PolarEpisodes:
        if self._episodes is None:
            self._episodes = PolarEpisodes(self.config, self.config.name, self.episode_runner)
        return self._episodes

    def setup_webserver(self) -> FastAPI:
        return close_on_shutdown(super().setup_webserver(), self.close)

    async def responses(self, body: Annotated[dict[str, Any] | None, Body()] = None) -> NeMoGymResponse:
        # Any body gets the explanation (a schema error about a route that never runs would only mislead).
        raise HTTPException(
            status_code=501,
            detail="the Polar agent runs a black-box coding CLI per task and serves only POST /run (a dataset row: "
            "responses_create_params + SWE-bench instance fields); it has no model-level /v1/responses",
        )

    async def run(self, body: PolarRunRequest) -> PolarVerifyResponse:
        try:
            return await self.episodes.run(body)
        except RowError as exc:
            raise HTTPException(status_code=422, detail=str(exc)) from None

    def close(self) -> None:
        if self._episodes is not None:
            self._episodes.close()
