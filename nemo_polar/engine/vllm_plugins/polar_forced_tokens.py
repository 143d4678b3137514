"""A vLLM logits processor that lets a request sample only a given token sequence, then only a stop token.

The scripted policy's exact tokens: the engine still runs the model and samples, and its logprobs are the model's
raw ones (vLLM's default ``logprobs_mode``), but every other token is masked. Unlike a structured-outputs regex over
text, this pins the ids themselves, special tokens included (a harmony ``<|channel|>`` or Llama's ``<|python_tag|>``
that a grammar would spell out in plain-text pieces). A request names its ids in ``vllm_xargs``:
``{"polar_forced_ids": [..]}``, and optionally ``"polar_then_stop": id``, the stop token to end on where the model
has several (GLM ends a tool call with ``<|observation|>``, a reply with ``<|user|>``); requests without them are
untouched.

Loaded with ``--logits-processors polar_forced_tokens:ForcedTokens`` (the launcher adds it).
"""

from __future__ import annotations

from typing import Any

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

KEY = "polar_forced_ids"
THEN_STOP = "polar_then_stop"


def _forced(params: SamplingParams) -> list[int] | None:
    ids: Any = (params.extra_args or {}).get(KEY)
    if ids is None:
        return None
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and i >= 0 for i in ids):
        raise ValueError(f"{KEY} must be a non-empty list of token ids")
    return ids


class ForcedTokens(AdapterLogitsProcessor):
    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        _forced(sampling_params)

    def is_argmax_invariant(self) -> bool:
        return False

    def new_req_logits_processor(self, params: SamplingParams) -> Any:
        ids = _forced(params)
        if ids is None:
            return None
        stops = sorted(params.all_stop_token_ids)
        then = (params.extra_args or {}).get(THEN_STOP)
        if then in stops:
            stops = [then]

        def force(output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
            n = len(output_ids)
            allowed = [ids[n]] if n < len(ids) else stops
            if not allowed:  # no stop token to end on (ignore_eos): the model goes on freely until max_tokens
                return logits
            keep = logits[allowed].clone()
            logits.fill_(float("-inf"))
            logits[allowed] = keep
            return logits

        return force
