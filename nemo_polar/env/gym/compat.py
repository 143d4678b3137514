"""Every NeMo Gym name the project uses, from one place: where Gym main puts it first, where nemo-gym 0.7.0 has it
second, so that a Gym release that moves a module is one edit here and no import anywhere else.

Moves on Gym main (its docs, 2026-11; no release has them yet): the token-capture API becomes
``nemo_gym.models.token_capture`` (0.7.0: ``nemo_gym.token_id_capture.{records,protocols,store,lineage,builder,
conformance}``) and the environment-server base ``nemo_gym.server_runtime.base_environment_server`` (0.7.0:
``nemo_gym.base_environment_server``). A name found in neither raises an ImportError naming the installed Gym
version and the places looked in. ``tests/test_architecture.py`` keeps every other module off ``nemo_gym``.
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


def _capture(name: str, submodule: str) -> Any:
    return pick(name, TOKEN_CAPTURE, f"nemo_gym.token_id_capture.{submodule}")


# -- token capture ----------------------------------------------------------------------------------------------------
TokenEntry = _capture("TokenEntry", "records")
ParentResolutionStatus = _capture("ParentResolutionStatus", "records")
stamp_lineage = _capture("stamp_lineage", "records")
TokenSink = _capture("TokenSink", "protocols")
TokenCaptureSnapshot = _capture("TokenCaptureSnapshot", "protocols")
TokenCaptureStore = _capture("TokenCaptureStore", "store")
validate_rollout_id = _capture("validate_rollout_id", "store")
IncrementalLineageStore = _capture("IncrementalLineageStore", "lineage")
BuildOutput = _capture("BuildOutput", "builder")
gym_prefix_merging = _capture("prefix_merging", "builder")

# -- environment servers --------------------------------------------------------------------------------------------
BaseEnvironmentServer = pick("BaseEnvironmentServer", *ENVIRONMENT_SERVER)
BaseEnvironmentServerConfig = pick("BaseEnvironmentServerConfig", *ENVIRONMENT_SERVER)
CleanupContext = pick("CleanupContext", *ENVIRONMENT_SERVER)
HandledEpisodeError = pick("HandledEpisodeError", *ENVIRONMENT_SERVER)
BaseEpisodeRequest = pick("BaseEpisodeRequest", "nemo_gym.episode_types")
BaseEpisodeResponse = pick("BaseEpisodeResponse", "nemo_gym.episode_types")
EpisodeFailure = pick("EpisodeFailure", "nemo_gym.episode_types")
AggregateMetrics = pick("AggregateMetrics", "nemo_gym.config_types")
AggregateMetricsRequest = pick("AggregateMetricsRequest", "nemo_gym.config_types")
AggregateMetricsMixin = pick("AggregateMetricsMixin", "nemo_gym.reward_profile")
compute_aggregate_metrics = pick("compute_aggregate_metrics", "nemo_gym.reward_profile")

# -- agent servers, rows and responses ------------------------------------------------------------------------------
BaseResponsesAPIAgentConfig = pick("BaseResponsesAPIAgentConfig", "nemo_gym.base_responses_api_agent")
SimpleResponsesAPIAgent = pick("SimpleResponsesAPIAgent", "nemo_gym.base_responses_api_agent")
BaseRunRequest = pick("BaseRunRequest", "nemo_gym.base_resources_server")
BaseVerifyResponse = pick("BaseVerifyResponse", "nemo_gym.base_resources_server")
NeMoGymResponse = pick("NeMoGymResponse", "nemo_gym.openai_utils")
NeMoGymResponseOutputMessageForTraining = pick("NeMoGymResponseOutputMessageForTraining", "nemo_gym.openai_utils")
maybe_rollout_id_from_run_body = pick("maybe_rollout_id_from_run_body", "nemo_gym.rollout_correlation")
GlobalConfigDictParser = pick("GlobalConfigDictParser", "nemo_gym.global_config")
