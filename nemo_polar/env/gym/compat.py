"""Every NeMo Gym name the project uses, from one place: where Gym main puts it first, where nemo-gym 0.7.0 has it
second, so that a Gym release that moves a module is one edit here and no import anywhere else.

Moves on Gym main (its docs, 2026-11; no release has them yet): the token-capture API becomes
``nemo_gym.models.token_capture`` (0.7.0: ``nemo_gym.token_id_capture.{records,protocols,store,lineage,builder,
conformance}``) and the environment-server base ``nemo_gym.server_runtime.base_environment_server`` (0.7.0:
``nemo_gym.base_environment_server``). A name found in neither raises an ImportError naming the installed Gym
version and the places looked in. Names resolve when first imported, so each module needs only what it uses (the
agent runs on NeMo-RL's nemo-gym 0.5.1 too). ``tests/test_architecture.py`` keeps every other module off
``nemo_gym``.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import Any

TOKEN_CAPTURE = "nemo_gym.models.token_capture"  # Gym main's public token-capture API
ENVIRONMENT_SERVER = ("nemo_gym.server_runtime.base_environment_server", "nemo_gym.base_environment_server")


def gym_version() -> str:
    try:
        return version("nemo-gym")
    except PackageNotFoundError:
        return "not installed"


def pick(name: str, *modules: str) -> Any:
    """``name`` from the first of ``modules`` that imports and has it."""
    for module in modules:
        try:
            found = importlib.import_module(module)
        except ImportError:
            continue
        if hasattr(found, name):
            return getattr(found, name)
    raise ImportError(f"nemo-gym {gym_version()} has no {name} (looked in {', '.join(modules)})")


def _capture(submodule: str) -> tuple[str, ...]:
    return (TOKEN_CAPTURE, f"nemo_gym.token_id_capture.{submodule}")


# name -> (the modules to look in, in order[, the name there]). Resolved on first import of the name (PEP 562), so a
# module needs only the names it uses: the agent runs on NeMo-RL's nemo-gym 0.5.1, which has no environment servers
# and no token capture.
NAMES: dict[str, tuple[tuple[str, ...], str]] = {
    # token capture
    "TokenEntry": (_capture("records"), "TokenEntry"),
    "ParentResolutionStatus": (_capture("records"), "ParentResolutionStatus"),
    "stamp_lineage": (_capture("records"), "stamp_lineage"),
    "TokenSink": (_capture("protocols"), "TokenSink"),
    "TokenCaptureSnapshot": (_capture("protocols"), "TokenCaptureSnapshot"),
    "TokenCaptureStore": (_capture("store"), "TokenCaptureStore"),
    "validate_rollout_id": (_capture("store"), "validate_rollout_id"),
    "IncrementalLineageStore": (_capture("lineage"), "IncrementalLineageStore"),
    "BuildOutput": (_capture("builder"), "BuildOutput"),
    "gym_prefix_merging": (_capture("builder"), "prefix_merging"),
    # environment servers
    "BaseEnvironmentServer": (ENVIRONMENT_SERVER, "BaseEnvironmentServer"),
    "BaseEnvironmentServerConfig": (ENVIRONMENT_SERVER, "BaseEnvironmentServerConfig"),
    "CleanupContext": (ENVIRONMENT_SERVER, "CleanupContext"),
    "HandledEpisodeError": (ENVIRONMENT_SERVER, "HandledEpisodeError"),
    "BaseEpisodeRequest": (("nemo_gym.episode_types",), "BaseEpisodeRequest"),
    "AgentServerRef": (("nemo_gym.config_types",), "AgentServerRef"),
    "BaseEpisodeResponse": (("nemo_gym.episode_types",), "BaseEpisodeResponse"),
    "EpisodeFailure": (("nemo_gym.episode_types",), "EpisodeFailure"),
    "AggregateMetrics": (("nemo_gym.config_types",), "AggregateMetrics"),
    "AggregateMetricsRequest": (("nemo_gym.config_types",), "AggregateMetricsRequest"),
    "AggregateMetricsMixin": (("nemo_gym.reward_profile",), "AggregateMetricsMixin"),
    "compute_aggregate_metrics": (("nemo_gym.reward_profile",), "compute_aggregate_metrics"),
    # agent servers, rows and responses
    "BaseResponsesAPIAgentConfig": (("nemo_gym.base_responses_api_agent",), "BaseResponsesAPIAgentConfig"),
    "SimpleResponsesAPIAgent": (("nemo_gym.base_responses_api_agent",), "SimpleResponsesAPIAgent"),
    "BaseRunRequest": (("nemo_gym.base_resources_server",), "BaseRunRequest"),
    "BaseVerifyResponse": (("nemo_gym.base_resources_server",), "BaseVerifyResponse"),
    "NeMoGymResponse": (("nemo_gym.openai_utils",), "NeMoGymResponse"),
    "NeMoGymResponseOutputMessageForTraining": (
        ("nemo_gym.openai_utils",),
        "NeMoGymResponseOutputMessageForTraining",
    ),
    "maybe_rollout_id_from_run_body": (("nemo_gym.rollout_correlation",), "maybe_rollout_id_from_run_body"),
    # the standardized trajectory Gym's health checks read (not in NeMo-RL's 0.5.1)
    "TrajectoryRecord": (("nemo_gym.rollout_observability",), "TrajectoryRecord"),
    "GlobalConfigDictParser": (("nemo_gym.global_config",), "GlobalConfigDictParser"),
}


def __getattr__(name: str) -> Any:
    if name not in NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    modules, there = NAMES[name]
    value = pick(there, *modules)
    globals()[name] = value  # resolved once
    return value
