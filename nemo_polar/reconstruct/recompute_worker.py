"""Recompute each trainable token's logprob under the same weights, as a trainer would, and compare with the
engine's: the training/inference mismatch a user would otherwise discover only as a KL spike.

Runs inside the engine virtualenv (it has torch and transformers), so it imports nothing from ``nemo_polar``. It
serves JSON lines, one request per line on stdin and one reply per line on stdout, so that a process checking many
sessions pays torch's and transformers' imports (~6 s of CPU) and each model's load once:
``{"model_dir", "traces"}`` (a JSON-lines file of traces) -> ``{"ok": true, "report": {...}}`` or
``{"ok": false, "error"}``. It writes ``{"ready": true}`` once its imports are done.

Per trainable token, with r = logp_trainer - logp_engine: |Δ| = |r| and the k3 estimator of
KL(engine || trainer) = exp(r) - 1 - r (unbiased, non-negative, for tokens sampled by the engine).
"""

from __future__ import annotations

import json
import math
import os
import sys
import traceback
import warnings
from typing import Any

warnings.simplefilter("ignore")  # torch's and transformers' deprecation notices are not the report

# The protocol owns a private copy of stdout; anything else that writes there (transformers' progress bars, native
# code) goes to stderr, so a log line can never corrupt a reply.
_OUT = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
sys.stdout = sys.stderr

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

_MODELS: dict[str, Any] = {}


def _model(model_dir: str) -> Any:
    """The model's weights as the directory holds them now (loaded again when its files changed: a weight sync)."""
    stamp = max((e.stat().st_mtime_ns for e in os.scandir(model_dir) if e.is_file()), default=0)
    cached = _MODELS.get(model_dir)
    if cached is None or cached[0] != stamp:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        model.eval()
        _MODELS[model_dir] = cached = (stamp, model)
    return cached[1]


def report(model_dir: str, traces_path: str) -> dict[str, float | int]:
    model = _model(model_dir)
    deltas: list[float] = []
    k3: list[float] = []
    with open(traces_path, encoding="utf-8") as fh, torch.no_grad():
        for line in fh:
            trace = json.loads(line)
            ids = trace["prompt_ids"] + trace["response_ids"]
            offset = len(trace["prompt_ids"])
            wanted = [
                (offset + i, lp)
                for i, (mask, lp) in enumerate(zip(trace["loss_mask"], trace["logprobs"], strict=True))
                if mask and lp is not None
            ]
            if not wanted:
                continue
            # Only the rows that predict trainable tokens: full [seq, vocab] logits of a 20k-token agent context
            # would need ~12 GB. The logit at pos-1 predicts the token at pos.
            rows = torch.tensor([pos - 1 for pos, _ in wanted])
            logits = model(torch.tensor([ids]), logits_to_keep=rows).logits[0].float()
            logp = torch.log_softmax(logits, dim=-1)
            for row, (pos, engine_lp) in enumerate(wanted):
                r = float(logp[row, ids[pos]]) - float(engine_lp)
                deltas.append(abs(r))
                k3.append(math.exp(r) - 1 - r)
    n = len(deltas)
    return {
        "tokens": n,
        "mean_abs_logprob_delta": sum(deltas) / n if n else 0.0,
        "max_abs_logprob_delta": max(deltas, default=0.0),
        "kl_k3": sum(k3) / n if n else 0.0,
    }


def serve() -> None:
    _OUT.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        try:
            msg = json.loads(line)
            reply: dict[str, Any] = {"ok": True, "report": report(msg["model_dir"], msg["traces"])}
        except Exception as exc:  # one bad request is that request's error, not the worker's end
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-1500:]}"}
        _OUT.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    serve()
