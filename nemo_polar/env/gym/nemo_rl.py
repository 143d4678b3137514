"""What NeMo-RL makes of a Gym ``/run`` result, restated so that ``polar learn`` trains on exactly the rows NeMo-RL
would. NVIDIA-NeMo/RL main at 7ea279ab, ``nemo_rl/environments/nemo_gym.py``
``NemoGym._postprocess_nemo_gym_to_nemo_rl_result`` walks the output items with a non-empty ``generation_token_ids``
in order, asserts each prompt extends everything seen so far ("Non-contiguous messages found!"), makes each a
(context delta, generation) pair, and raises "NeMo Gym returned a result with no generation data" when none has
tokens. ``extract_reward_components`` / ``validate_reward_components_match_scalar`` (same file) check optional
``reward_components`` against the scalar reward. The mask is ``full_result["instance_config"]["mask_sample"]``
(``nemo_rl/experience/rollouts.py::_extract_mask_sample_flags``; ``rollout_manager.py::_result_to_completion`` pops
it when ``mask_env_flagged_samples`` is off), which ``grpo.py::_apply_mask_sample_filter`` turns into a zero
``loss_multiplier``; a top-level ``mask_sample`` is not read. Nothing here imports nemo-gym or NeMo-RL.
"""

from __future__ import annotations

import math
from typing import Any


def nemo_rl_sample(result: dict[str, Any], mask_flagged_samples: bool = True) -> dict[str, Any]:
    """The ``message_log`` (user context deltas and assistant generations with their logprobs), the reward and the
    ``loss_multiplier`` NeMo-RL builds from one Gym result."""
    seen: list[int] = []
    message_log: list[dict[str, Any]] = []
    for item in result["response"]["output"]:
        if not item.get("generation_token_ids"):
            continue
        assert item["prompt_token_ids"][: len(seen)] == seen, "Non-contiguous messages found!"
        message_log.append({"role": "user", "token_ids": item["prompt_token_ids"][len(seen) :]})
        message_log.append(
            {
                "role": "assistant",
                "token_ids": item["generation_token_ids"],
                "generation_logprobs": item["generation_log_probs"],
            }
        )
        assert len(item["generation_token_ids"]) == len(item["generation_log_probs"])
        seen = item["prompt_token_ids"] + item["generation_token_ids"]
    if not message_log:
        raise ValueError("NeMo Gym returned a result with no generation data")
    reward = float(result["reward"])
    if result.get("reward_components"):
        assert math.isclose(reward, sum(result["reward_components"].values()), rel_tol=1e-5, abs_tol=1e-6)
    masked = mask_flagged_samples and bool((result.get("instance_config") or {}).get("mask_sample", False))
    return {"message_log": message_log, "reward": reward, "loss_multiplier": 0.0 if masked else 1.0}


def trainer_row(sample: dict[str, Any], advantage: float) -> dict[str, Any]:
    """One NeMo-RL sample as the trainer's row: the message log's tokens end to end, the assistant's as the loss
    mask (NeMo-RL's ``token_loss_mask``), their generation logprobs, the advantage and the ``loss_multiplier``."""
    row: dict[str, Any] = {"input_ids": [], "token_mask": [], "generation_logprobs": []}
    for message in sample["message_log"]:
        ids = message["token_ids"]
        generated = message["role"] == "assistant"
        row["input_ids"] += ids
        row["token_mask"] += [int(generated)] * len(ids)
        row["generation_logprobs"] += message["generation_logprobs"] if generated else [0.0] * len(ids)
    return row | {"advantage": advantage, "sample_mask": int(sample["loss_multiplier"])}
