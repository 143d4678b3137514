"""Recompute each trainable token's logprob under the same weights, as a trainer would, and compare with the
engine's: the training/inference mismatch a user would otherwise discover only as a KL spike.

Runs inside the engine virtualenv (it has torch and transformers), so it imports nothing from ``nemo_polar``:
``python recompute_worker.py MODEL_DIR TRACES.jsonl`` prints one JSON object.

Per trainable token, with r = logp_trainer - logp_engine: |Δ| = |r| and the k3 estimator of
KL(engine || trainer) = exp(r) - 1 - r (unbiased, non-negative, for tokens sampled by the engine).
"""

from __future__ import annotations

import json
import math
import sys


def main(model_dir: str, traces_path: str) -> dict[str, float | int]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
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


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2])))
