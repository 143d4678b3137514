"""The trainer side of ``polar learn`` on a GPU, scored against the engine's own logprobs from captured traces.

Given trainer rows written by ``polar learn`` (``batches/step-000.jsonl``: token ids, the policy's token mask and
the logprob vLLM returned for each sampled token) and the model directory the engine served, it reports:

1. ``hf``: the learn trainer's step (``grpo_worker.Trainer``, NeMo-RL's clipped PG loss) in each dtype on the chosen
   device: the trainer/engine mismatch NeMo-RL logs (``token_mult_prob_error``, ``gen_kl_error``) and the mean and
   largest |trainer - engine| logprob over the policy's tokens;
2. ``megatron``: the same rows scored by megatron-core's ``GPTModel`` (the model NeMo-RL's Megatron backend trains),
   built with the local layer spec (no Transformer Engine) and loaded with the served weights; its agreement with
   the engine and with the Hugging Face model in the same dtype.

Needs torch, transformers, safetensors and megatron-core (``--megatron`` off without it). Runs in any Python that
has them, so it imports ``grpo_worker`` by path and nothing else of the project. Never part of CI: the figures are
only meaningful on the hardware a user trains on.

Usage: python scripts/device_check.py --model DIR --batch FILE [--batch FILE ...] [--device cuda] [--out FILE]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

WORKER = Path(__file__).resolve().parents[1] / "nemo_polar" / "learn" / "grpo_worker.py"
DTYPES = ("float32", "bfloat16")


def _worker() -> Any:
    spec = importlib.util.spec_from_file_location("grpo_worker", WORKER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rows(batches: list[Path]) -> list[dict[str, Any]]:
    return [json.loads(line) for b in batches for line in b.read_text().splitlines() if line.strip()]


def agreement(scored: list[list[float]], reference: list[list[float]], rows: list[dict[str, Any]]) -> dict[str, float]:
    """|a - b| over the policy's tokens (position ``t`` scores token ``t + 1``, as the trainer's rows are shifted)."""
    deltas = [
        abs(a - b)
        for s, ref, r in zip(scored, reference, rows, strict=True)
        for a, b, m in zip(s, ref[1:], r["token_mask"][1:], strict=True)
        if m
    ]
    return {
        "tokens": len(deltas),
        "mean_abs_delta": sum(deltas) / len(deltas),
        "max_abs_delta": max(deltas),
        "token_mult_prob_error": sum(math.exp(d) for d in deltas) / len(deltas),
    }


def hf_step(worker: Any, model: Path, batches: list[Path], dtype: str, device: str) -> dict[str, Any]:
    """One learn step as ``polar learn`` runs it, in ``dtype`` on ``device``: the mismatch is measured in the step's
    own forward pass, before the optimiser changes anything."""
    trainer = worker.Trainer(str(model), lr=2e-5, seed=0, loss={}, dtype=dtype, device=device)
    base = trainer.score([r["input_ids"] for r in _rows(batches)])  # before the step: the served weights
    with tempfile.TemporaryDirectory() as tmp:
        batch = Path(tmp) / "batch.jsonl"
        batch.write_text("".join(b.read_text() for b in batches))
        return {"step": trainer.step(str(batch), str(Path(tmp) / "out")), "logprobs": base}


def megatron_logprobs(model: Path, rows: list[dict[str, Any]], dtype: str, device: str) -> list[list[float]]:
    """The rows scored by megatron-core's GPTModel (local spec) holding the served Llama weights."""
    import torch.nn.functional as F
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.transformer_config import TransformerConfig
    from safetensors.torch import load_file

    cfg = json.loads((model / "config.json").read_text())
    if not torch.distributed.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        backend = "nccl" if device.startswith("cuda") else "gloo"
        torch.distributed.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", world_size=1, rank=0)
        parallel_state.initialize_model_parallel(1, 1)
        if device.startswith("cuda"):
            model_parallel_cuda_manual_seed(0)
    heads, groups, head_dim = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    config = TransformerConfig(
        num_layers=cfg["num_hidden_layers"],
        hidden_size=cfg["hidden_size"],
        num_attention_heads=heads,
        num_query_groups=groups,
        kv_channels=head_dim,
        ffn_hidden_size=cfg["intermediate_size"],
        normalization="RMSNorm",
        layernorm_epsilon=cfg["rms_norm_eps"],
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        params_dtype=getattr(torch, dtype),
        bf16=dtype == "bfloat16",
        apply_rope_fusion=False,
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        use_cpu_initialization=True,
        perform_initialization=False,
    )
    gpt = GPTModel(
        config,
        transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
        vocab_size=cfg["vocab_size"],
        max_sequence_length=cfg["max_position_embeddings"],
        share_embeddings_and_output_weights=cfg["tie_word_embeddings"],
        position_embedding_type="rope",
        rotary_base=int(cfg["rope_parameters"]["rope_theta"]),
    )
    missing, unexpected = gpt.load_state_dict(megatron_state(load_file(str(model / "model.safetensors")), cfg), False)
    missing = [k for k in missing if not k.endswith("_extra_state")]
    if missing or unexpected:
        raise RuntimeError(f"megatron state: {missing} left unloaded, {unexpected} not its own")
    gpt = gpt.to(device=device, dtype=getattr(torch, dtype)).eval()
    out = []
    with torch.no_grad():
        for r in rows:
            ids = torch.tensor([r["input_ids"]], device=device)
            positions = torch.arange(ids.shape[1], device=device).unsqueeze(0)
            logits = gpt(ids, positions, attention_mask=None)[:, :-1].float()
            out.append(torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[0, :, 0].tolist())
    return out


def megatron_state(hf: dict[str, torch.Tensor], cfg: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Hugging Face Llama names and layouts to megatron-core's: q, k and v fused per query group (each group's
    query heads, then its key head, then its value head), gate and up stacked into fc1."""
    heads, groups, head_dim = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    hidden = cfg["hidden_size"]
    state = {
        "embedding.word_embeddings.weight": hf["model.embed_tokens.weight"],
        "decoder.final_layernorm.weight": hf["model.norm.weight"],
    }
    if not cfg["tie_word_embeddings"]:
        state["output_layer.weight"] = hf["lm_head.weight"]
    for i in range(cfg["num_hidden_layers"]):
        src, dst = f"model.layers.{i}.", f"decoder.layers.{i}."
        q = hf[src + "self_attn.q_proj.weight"].view(groups, heads // groups * head_dim, hidden)
        k = hf[src + "self_attn.k_proj.weight"].view(groups, head_dim, hidden)
        v = hf[src + "self_attn.v_proj.weight"].view(groups, head_dim, hidden)
        state[dst + "self_attention.linear_qkv.weight"] = torch.cat([q, k, v], dim=1).reshape(-1, hidden)
        state[dst + "self_attention.linear_proj.weight"] = hf[src + "self_attn.o_proj.weight"]
        state[dst + "input_layernorm.weight"] = hf[src + "input_layernorm.weight"]
        state[dst + "pre_mlp_layernorm.weight"] = hf[src + "post_attention_layernorm.weight"]
        gate, up = hf[src + "mlp.gate_proj.weight"], hf[src + "mlp.up_proj.weight"]
        state[dst + "mlp.linear_fc1.weight"] = torch.cat([gate, up], dim=0)
        state[dst + "mlp.linear_fc2.weight"] = hf[src + "mlp.down_proj.weight"]
    return state


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="the model directory the engine served")
    parser.add_argument("--batch", type=Path, action="append", required=True, help="trainer rows from polar learn")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", action="append", choices=DTYPES, help="default: both")
    parser.add_argument("--no-megatron", dest="megatron", action="store_false")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    rows, worker = _rows(args.batch), _worker()
    engine = [r["generation_logprobs"] for r in rows]
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "torch": torch.__version__,
        "rows": len(rows),
        "policy_tokens": sum(sum(r["token_mask"][1:]) for r in rows),
    }
    for dtype in args.dtype or DTYPES:
        hf = hf_step(worker, args.model, args.batch, dtype, args.device)
        entry: dict[str, Any] = {"hf_step": hf["step"], "hf_vs_engine": agreement(hf["logprobs"], engine, rows)}
        if args.megatron:
            mlp = megatron_logprobs(args.model, rows, dtype, args.device)
            entry["megatron_vs_engine"] = agreement(mlp, engine, rows)
            entry["megatron_vs_hf"] = agreement(mlp, [[0.0, *h] for h in hf["logprobs"]], rows)
        report[dtype] = entry
        print(json.dumps({dtype: entry}), flush=True)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
