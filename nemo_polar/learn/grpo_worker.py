"""The trainer of ``polar learn``: NeMo-RL's clipped policy-gradient (GRPO) loss on rows built from the project's
traces, one optimiser step per rollout batch, the new weights written as a checkpoint vLLM reloads in place.

Runs inside the engine virtualenv (torch + transformers), so it imports nothing from ``nemo_polar``. It is a
long-lived process (the optimiser state lives across steps) speaking JSON lines: one request object per stdin line,
one reply per stdout line (``{"ok": true, ...}`` or ``{"ok": false, "error": ...}``); logs go to stderr.

The loss restates ``ClippedPGLossFn`` from NVIDIA-NeMo/RL ``nemo_rl/algorithms/loss_functions.py`` at commit
005a098a5fc04317a0ceb792e66a8b8076804618, token-level (``token_level_loss: true``), with:

- ``mask = token_mask[:, 1:] * sample_mask`` (``sample_mask`` is GRPO's ``loss_multiplier``: 0 drops a sample);
- ``ratios = exp(curr - prev)``, ``clip_loss = max(-A * ratios, -A * clamp(ratios, 1 - clip_min, 1 + clip_max))``,
  optional dual clip ``c`` for ``A < 0``;
- optional importance-sampling correction ``exp(prev - generation)`` (off by default, as in NeMo-RL's GRPO recipes;
  on for async GRPO, whose behaviour policy may be a version behind), optionally truncated as NeMo-RL truncates it
  (``truncated_importance_sampling_type`` in ``nemo_rl/algorithms/loss/loss_functions.py`` at commit
  7ea279abfbeb698b092856d0dab61e7cf39bc909): ``tis`` clamps each token's weight to ``[min or 0, max]``, ``icepop``
  zeroes a token whose weight is outside ``[min, max]``, ``seq-mask-tis`` zeroes every token of a sequence whose
  geometric-mean weight is outside ``[min, max]`` and keeps the others' raw weights;
- ``loss = sum(w * clip_loss * mask) / global_valid_toks`` over the whole batch (micro-batches accumulate);
- no reference-policy KL term (``reference_policy_kl_penalty: 0``).

``prev_logprobs`` are the policy's logprobs under the weights the step starts from. With one optimiser step per
rollout batch they equal ``curr`` detached, so they come from the same forward pass (NeMo-RL computes them in a
separate pass before training; the values are the same). The trainer/engine mismatch NeMo-RL logs is reported:
``token_mult_prob_error = mean(exp(|generation - prev|))`` and ``gen_kl_error`` (k3 of ``prev - generation``).

``polar learn`` runs it in fp32 on the CPU; ``dtype`` and ``device`` run the same step elsewhere (bf16 on a GPU:
``scripts/device_check.py``).
"""

from __future__ import annotations

import json
import math
import resource
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, DynamicCache

TRUNCATIONS = ("tis", "icepop", "seq-mask-tis")


class LossConfig:
    def __init__(
        self,
        clip_min: float = 0.2,
        clip_max: float = 0.2,
        dual_clip: float | None = None,
        importance_sampling: bool = False,
        truncation: str | None = None,
        truncation_max: float | None = None,
        truncation_min: float | None = None,
    ) -> None:
        # NeMo-RL's own checks on the same settings (ClippedPGLossFn.__init__), as errors rather than asserts.
        if truncation is not None:
            if truncation not in TRUNCATIONS:
                raise ValueError(f"truncation must be one of {', '.join(TRUNCATIONS)}, got {truncation!r}")
            if not importance_sampling:
                raise ValueError("truncated importance sampling needs importance_sampling: true")
            if truncation_max is None or truncation_max <= 0:
                raise ValueError("truncation_max must be positive")
            if truncation_min is not None and truncation_min > truncation_max:
                raise ValueError("truncation_min must be <= truncation_max")
            if truncation in ("icepop", "seq-mask-tis") and truncation_min is None:
                raise ValueError(f"truncation {truncation!r} needs truncation_min")
        self.clip_min = clip_min
        self.clip_max = clip_max
        self.dual_clip = dual_clip
        self.importance_sampling = importance_sampling
        self.truncation = truncation
        self.truncation_max = truncation_max
        self.truncation_min = truncation_min


def token_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
    """``[B, T-1]``: the logprob of token ``t`` given tokens ``< t``, in float32 (NeMo-RL casts logits first)."""
    logits = model(input_ids=input_ids, attention_mask=attention).logits[:, :-1].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def importance_weights(
    prev: torch.Tensor, generation: torch.Tensor, mask: torch.Tensor, sequence: torch.Tensor, cfg: LossConfig
) -> tuple[torch.Tensor, float]:
    """The off-policy weights ``exp(prev - generation)`` (ones when the correction is off), truncated as ``cfg``
    says, and how many fell outside the bounds: tokens (``tis``, ``icepop``) or sequences (``seq-mask-tis``).
    ``sequence`` gives each position's sequence (row) index."""
    if not cfg.importance_sampling:
        return torch.ones_like(prev), 0.0
    log_ratio = torch.nan_to_num(prev - generation, nan=0.0, posinf=0.0, neginf=0.0)
    weights = torch.nan_to_num(torch.exp(prev - generation), nan=0.0, posinf=0.0, neginf=0.0)
    high, low = cfg.truncation_max, cfg.truncation_min
    if cfg.truncation == "tis":
        low = 0.0 if low is None else low
        oob = float((((weights > high) | (weights < low)).float() * mask).sum())
        return weights.clamp(min=low, max=high), oob
    if cfg.truncation == "icepop":
        kept = (weights >= low) & (weights <= high)
        return torch.where(kept, weights, torch.zeros_like(weights)), float(((~kept).float() * mask).sum())
    if cfg.truncation == "seq-mask-tis":
        n = int(sequence.max()) + 1 if sequence.numel() else 0
        flat = sequence.flatten()
        sums = torch.zeros(n, device=prev.device).index_add_(0, flat, (log_ratio * mask).flatten())
        counts = torch.zeros(n, device=prev.device).index_add_(0, flat, mask.flatten())
        geomean = torch.exp(sums / counts.clamp(min=1.0))
        kept = ((geomean >= low) & (geomean <= high)).float()
        return weights * kept[sequence], float((1.0 - kept)[counts > 0].sum())
    return weights, 0.0


def clipped_pg_loss(
    curr: torch.Tensor,
    prev: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    global_valid_toks: float,
    cfg: LossConfig,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """The token-level clipped PG loss of one micro-batch, normalised by the whole batch's valid tokens, each token
    weighted by ``weights`` (:func:`importance_weights`; none: 1). All tensors have one shape (position ``t`` scores
    token ``t + 1``)."""
    ratios = torch.exp(curr - prev)
    clamped = ratios.clamp(1.0 - cfg.clip_min, 1.0 + cfg.clip_max)
    clip_loss = torch.max(-advantages * ratios, -advantages * clamped)
    if cfg.dual_clip is not None:
        clip_loss = torch.where(advantages < 0, torch.min(clip_loss, -advantages * cfg.dual_clip), clip_loss)
    weights = torch.ones_like(prev) if weights is None else weights
    return (weights * clip_loss * mask).sum() / global_valid_toks


def _pad(rows: list[dict[str, Any]], key: str, fill: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    width = max(len(r[key]) for r in rows)
    return torch.tensor([r[key] + [fill] * (width - len(r[key])) for r in rows], dtype=dtype, device=device)


def shared_prefix(rows: list[dict[str, Any]]) -> int:
    """How many leading tokens every row of a micro-batch shares and none trains on: their keys and values are
    computed once (with gradient) and reused by every row. It stops one token before the first trainable one, whose
    logprob needs the hidden state of the token before it in the per-row pass."""
    head = rows[0]["input_ids"]
    common = min(len(r["input_ids"]) for r in rows)
    for r in rows[1:]:
        common = next((i for i in range(common) if r["input_ids"][i] != head[i]), common)
    trainable = min(r["token_mask"].index(1) if 1 in r["token_mask"] else len(r["token_mask"]) for r in rows)
    return max(0, min(common, trainable - 1))


class SharedPrefix:
    """The prefix every row of a batch shares and none trains on, computed once per step. Its keys and values are
    detached leaves that every micro-batch attends to and accumulates its gradient into; :meth:`backward` then runs
    the prefix's own backward pass once with the summed gradient: the same gradient as each row computed alone."""

    def __init__(self, model: torch.nn.Module, rows: list[dict[str, Any]], device: torch.device) -> None:
        self.length = shared_prefix(rows)
        self.computed: list[torch.Tensor] = []
        self.leaves: list[torch.Tensor] = []
        if self.length:
            ids = torch.tensor([rows[0]["input_ids"][: self.length]], device=device)
            cache = model.model(input_ids=ids, use_cache=True).past_key_values
            self.computed = [t for layer in cache.layers for t in (layer.keys, layer.values)]
            self.leaves = [t.detach().requires_grad_(True) for t in self.computed]

    def cache(self, batch: int) -> DynamicCache | None:
        """A cache of the prefix for ``batch`` rows (a view per row: their gradients sum into the leaves)."""
        if not self.length:
            return None
        rows = [t.expand(batch, -1, -1, -1) for t in self.leaves]
        return DynamicCache(ddp_cache_data=list(zip(rows[::2], rows[1::2], strict=True)))

    def backward(self) -> None:
        pairs = [(t, leaf.grad) for t, leaf in zip(self.computed, self.leaves, strict=True) if leaf.grad is not None]
        if pairs:
            torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])


def trainable_logprobs(
    model: torch.nn.Module, rows: list[dict[str, Any]], device: torch.device, prefix: SharedPrefix | None = None
) -> dict[str, Any]:
    """The logprobs of a micro-batch's trainable tokens only, flattened in row order, with the row index and the
    position of each. The rows start after ``prefix`` (shared by the whole batch, see :class:`SharedPrefix`); the
    output head and the softmax run only where a token is trained (a 2k-token harness row with a 49k vocabulary
    would otherwise be ~0.4 GB of fp32 logits)."""
    start = prefix.length if prefix else 0
    tails = [{"input_ids": r["input_ids"][start:], "token_mask": r["token_mask"][start:]} for r in rows]
    for t in tails:
        t["attention"] = [1] * len(t["input_ids"])
    ids = _pad(tails, "input_ids", 0, torch.long, device)
    attention = _pad(tails, "attention", 0, torch.long, device)
    cache = prefix.cache(len(rows)) if prefix else None
    if cache is not None:
        attention = torch.cat([attention.new_ones(len(rows), start), attention], dim=1)
    hidden = model.model(input_ids=ids, attention_mask=attention, past_key_values=cache, use_cache=False)
    hidden = hidden.last_hidden_state
    # Position t of a tail predicts its token t + 1: select the positions whose next token is trained.
    target = _pad(tails, "token_mask", 0, torch.long, device)[:, 1:].bool()
    rows_at, pos_at = target.nonzero(as_tuple=True)
    logits = model.lm_head(hidden[rows_at, pos_at]).float()  # NeMo-RL casts logits to fp32 first
    tokens = ids[rows_at, pos_at + 1]
    logprobs = torch.log_softmax(logits, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return {"logprobs": logprobs, "row": rows_at, "position": pos_at + 1 + start}


class Trainer:
    def __init__(
        self,
        model_dir: str,
        lr: float,
        seed: int,
        loss: dict[str, Any],
        micro_batch: int = 4,
        train_embeddings: bool = False,
        dtype: str = "float32",
        device: str = "cpu",
    ) -> None:
        torch.manual_seed(seed)
        self.model_dir = Path(model_dir)
        self.dtype, self.device = getattr(torch, dtype), torch.device(device)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=self.dtype).to(self.device)
        self.model.train()
        if not train_embeddings:
            # vLLM 0.32's in-place reload (CPU) leaves a tied output head on its load-time copy: after an
            # embedding-only change the engine's logprobs differ from the checkpoint's by ~2.5e-4 (3e-6 for any other
            # parameter). Frozen embeddings keep what the engine serves equal to what was trained.
            self.model.get_input_embeddings().weight.requires_grad_(False)
        self.optimizer(lr)
        self.loss = LossConfig(**loss)
        self.micro_batch = micro_batch

    def optimizer(self, lr: float) -> None:
        """A fresh optimiser (a new training stage, as GRPO starting from an SFT checkpoint): NeMo-RL's recipes'
        AdamW, no weight decay on this scale, the gradient norm clipped at 1.0 in each step."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optim = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)

    def _batch(self, batch: str) -> tuple[list[dict[str, Any]], int]:
        """The batch's rows that train (``sample_mask`` 1), sorted so that rows sharing a prefix share a micro-batch,
        and the batch's count of trainable tokens (the token-level loss's denominator)."""
        rows = [json.loads(line) for line in Path(batch).read_text().splitlines() if line.strip()]
        rows = sorted((r for r in rows if r["sample_mask"]), key=lambda r: r["input_ids"])
        valid = sum(sum(r["token_mask"][1:]) for r in rows)
        if valid == 0:
            raise ValueError("no trainable token in the batch")
        return rows, valid

    def step(self, batch: str, out_dir: str) -> dict[str, Any]:
        """One GRPO step: the clipped PG loss over the batch's trainable tokens, one optimiser step, a checkpoint."""
        started = time.monotonic()
        rows, valid = self._batch(batch)
        totals = {"loss": 0.0, "mult_prob_error": 0.0, "gen_kl": 0.0, "abs_delta": 0.0, "max_abs_delta": 0.0}
        totals |= {"oob": 0.0, "is_weight": 0.0}
        self.optim.zero_grad(set_to_none=True)
        prefix = SharedPrefix(self.model, rows, self.device)
        for i in range(0, len(rows), self.micro_batch):
            mb = rows[i : i + self.micro_batch]
            out = trainable_logprobs(self.model, mb, self.device, prefix)
            curr, at = out["logprobs"], list(zip(out["row"].tolist(), out["position"].tolist(), strict=True))
            generation = torch.tensor([mb[r]["generation_logprobs"][t] for r, t in at], device=self.device)
            advantages = torch.tensor([float(mb[r]["advantage"]) for r, _ in at], device=self.device)
            prev = curr.detach()
            mask = torch.ones_like(prev)
            weights, oob = importance_weights(prev, generation, mask, out["row"] + i, self.loss)
            loss = clipped_pg_loss(curr, prev, advantages, mask, float(valid), self.loss, weights)
            loss.backward()
            with torch.no_grad():
                totals["oob"] += oob
                totals["is_weight"] += float(weights.sum())
                delta = (generation - prev).abs()
                totals["loss"] += float(loss)
                totals["mult_prob_error"] += float(torch.exp(delta).sum())
                log_ratio = prev - generation  # k3 estimator of KL(generation || trainer), as NeMo-RL's gen_kl_error
                totals["gen_kl"] += float((torch.exp(log_ratio) - log_ratio - 1).sum())
                totals["abs_delta"] += float(delta.sum())
                totals["max_abs_delta"] = max(totals["max_abs_delta"], float(delta.max()))
        prefix.backward()
        return self._update(out_dir, totals["loss"], valid, rows, prefix.length, started) | {
            "token_mult_prob_error": totals["mult_prob_error"] / valid,
            "gen_kl_error": totals["gen_kl"] / valid,
            "mean_abs_logprob_delta": totals["abs_delta"] / valid,
            "max_abs_logprob_delta": totals["max_abs_delta"],
            # NeMo-RL's is_oob_ratio: out-of-bounds tokens per valid token, or sequences per sequence (seq-mask-tis)
            "is_oob_ratio": totals["oob"] / (len(rows) if self.loss.truncation == "seq-mask-tis" else valid),
            "mean_is_weight": totals["is_weight"] / valid,
        }

    def sft_step(self, batch: str, out_dir: str) -> dict[str, Any]:
        """One supervised step on the batch's trainable tokens (their mean negative log-likelihood): the warm-up on
        accepted sessions, NeMo-RL's SFT ``NLLLoss`` over the same rows and the same forward pass as GRPO."""
        started = time.monotonic()
        rows, valid = self._batch(batch)
        total = 0.0
        self.optim.zero_grad(set_to_none=True)
        prefix = SharedPrefix(self.model, rows, self.device)
        for i in range(0, len(rows), self.micro_batch):
            out = trainable_logprobs(self.model, rows[i : i + self.micro_batch], self.device, prefix)
            loss = -out["logprobs"].sum() / valid
            loss.backward()
            total += float(loss)
        prefix.backward()
        return self._update(out_dir, total, valid, rows, prefix.length, started)

    def _update(
        self, out_dir: str, loss: float, valid: int, rows: list[dict[str, Any]], prefix: int, started: float
    ) -> dict[str, Any]:
        """Clip the gradient norm, step, write the checkpoint; what the step computed and what it cost."""
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.optim.param_groups[0]["params"], max_norm=1.0))
        self.optim.step()
        compute_s = time.monotonic() - started
        self.save(out_dir)
        return {
            "loss": loss,
            "grad_norm": grad_norm if math.isfinite(grad_norm) else None,
            "tokens": int(valid),
            "samples": len(rows),
            "row_tokens": sum(len(r["input_ids"]) for r in rows),
            "shared_prefix_tokens": prefix,
            "compute_s": compute_s,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }

    def save(self, out_dir: str) -> None:
        """A checkpoint vLLM can reload in place: the safetensors and the config beside the base model's tokenizer
        files (the engine keeps its own tokenizer; a user can still serve the directory as a model)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(out, safe_serialization=True)
        for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
            if (self.model_dir / name).exists():
                shutil.copy2(self.model_dir / name, out / name)

    @torch.no_grad()
    def score(self, sequences: list[list[int]], model_dir: str | None = None) -> list[list[float]]:
        """Per-token logprobs (position ``t`` scores token ``t + 1``) under the current weights, or under the
        checkpoint in ``model_dir``."""
        model = (
            AutoModelForCausalLM.from_pretrained(model_dir, dtype=self.dtype).to(self.device)
            if model_dir
            else self.model
        )
        model.eval()
        try:
            return [
                token_logprobs(
                    model,
                    torch.tensor([s], device=self.device),
                    torch.ones(1, len(s), dtype=torch.long, device=self.device),
                )[0].tolist()
                for s in sequences
            ]
        finally:
            self.model.train()


def serve() -> None:
    trainer: Trainer | None = None
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            op = req.pop("op")
            if op == "init":
                trainer = Trainer(**req)
                reply: dict[str, Any] = {}
            elif trainer is None:
                raise RuntimeError("send {'op': 'init', ...} first")
            elif op == "step":
                reply = trainer.step(**req)
            elif op == "optimizer":
                trainer.optimizer(**req)
                reply = {}
            elif op == "sft_step":
                reply = trainer.sft_step(**req)
            elif op == "save":
                trainer.save(**req)
                reply = {}
            elif op == "score":
                reply = {"logprobs": trainer.score(**req)}
            else:
                raise ValueError(f"unknown op {op!r}")
            out = {"ok": True, **reply}
        except Exception as exc:  # one bad request answers an error; the trainer and its optimiser state live on
            out = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    serve()
