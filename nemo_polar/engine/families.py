"""Model families, declared once: what serving, capturing and reconstructing a family's model needs to know.

A family is one :class:`ModelFamily` entry in :data:`FAMILIES`: the vLLM parsers that serve it, the token that ends
its turns, the ids its template adds to a generation prompt only, whether its format is harmony, its stand-in's
name, context length and label. What a vLLM tool-call parser's format needs of the proxy (read in process or by
vLLM's parsers, the call ids it takes, the ids the model writes itself) is one :class:`ToolFormat` in
:data:`TOOL_FORMATS`, keyed by the parser's name, so a user's own model served with a known parser gets the same
handling. The launcher, the proxy, reconstruction, the tests and the bench read these tables; no code outside this
module matches on a family's or a parser's name. A family's stand-in recipe (the pinned tokenizer and template
files) is its entry in ``build_models.STAND_INS``.

Standard library only: ``build_models.py`` runs in the engine's virtualenv, which has no ``nemo_polar``, and
imports this file as its sibling.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

FAMILY_FILE = "polar-family.json"  # in a model directory: its family and the vLLM parsers that serve it

# The call ids a format takes: as the harness sent them, 9 letters and digits (Mistral's template refuses others; the
# proxy's template probe finds that from behaviour), or functions.NAME:INDEX.
CallIdForm = Literal["as_sent", "alnum9", "functions_index"]
# Where a format carries the ids the model wrote for its calls, which vLLM's parser does not hand on:
# Mistral's ``[TOOL_CALLS][{..., "id": "..."}]`` (the parser mints random ones), Kimi K2's call headers.
SampledIds = Literal["none", "mistral_json", "kimi_headers"]


@dataclass(frozen=True)
class ToolFormat:
    """What the proxy must know of the format one vLLM tool-call parser reads."""

    in_process: bool = False  # nemo_polar/proxy/parse/parser.py reads it (no vLLM worker needed)
    call_ids: CallIdForm = "as_sent"
    sampled_ids: SampledIds = "none"


TOOL_FORMATS: dict[str | None, ToolFormat] = {
    None: ToolFormat(in_process=True),  # no tools
    "hermes": ToolFormat(in_process=True),  # <tool_call>{"name", "arguments"}</tool_call>
    "qwen3_coder": ToolFormat(in_process=True),  # <tool_call><function=f><parameter=p>...
    "mistral": ToolFormat(sampled_ids="mistral_json"),
    # The kimi_k2 parser drops a call whose header is not functions.NAME:INDEX, though the template takes any id.
    "kimi_k2": ToolFormat(call_ids="functions_index", sampled_ids="kimi_headers"),
}
IN_PROCESS_REASONING = {None, "qwen3"}  # <think>...</think>, read by nemo_polar/proxy/parse/parser.py
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"  # the tags of that reasoning format


def tool_format(parser: str | None) -> ToolFormat:
    """The format ``parser`` (vLLM's --tool-call-parser name) reads; a parser not declared here is read by vLLM."""
    return TOOL_FORMATS.get(parser, ToolFormat())


def read_in_process(tool_parser: str | None, reasoning_parser: str | None) -> bool:
    return tool_format(tool_parser).in_process and reasoning_parser in IN_PROCESS_REASONING


@dataclass(frozen=True)
class ModelFamily:
    name: str  # the family's name, as its polar-family.json says it
    label: str  # how tables name it
    tool_call_parser: str | None  # vLLM's names; None: the template renders no tools
    reasoning_parser: str | None
    # The one token that closes a sampled turn exactly as the template closes it in history (the proxy continues a
    # conversation from the sampled ids by it); None where there is none (harmony's <|call|>/<|return|> become
    # <|end|>; GLM's turn ends where the next role token begins).
    end_of_turn: str | None
    # vLLM picks its harmony path by the model type, which a stand-in (a Qwen3-shaped model) does not carry.
    harmony: bool = False
    # Id sequences the template appends to a generation prompt but not to the same turn in history (reconstruction
    # names the break they cause; it never merges across them).
    generation_glue: tuple[tuple[int, ...], ...] = ()
    max_model_len: int = 32768  # the stand-in's context
    stand_in_name: str = ""  # where tiny-<name> is taken (tiny-qwen3 is the project's own model)

    @property
    def stand_in(self) -> str:
        return self.stand_in_name or f"tiny-{self.name}"


# "<think>\n\n</think>\n\n" in the Qwen2.5/Qwen3 vocabulary: the generation prompt with thinking disabled.
QWEN_EMPTY_THINK = (151667, 271, 151668, 271)

# A model directory without a family file: the project's ChatML template with hermes tools (tiny-qwen3, SmolLM2).
CHATML = ModelFamily(
    name="chatml",
    label="the project's ChatML + hermes tools (Qwen vocabulary)",
    tool_call_parser="hermes",
    reasoning_parser=None,
    end_of_turn="<|im_end|>",
    generation_glue=(QWEN_EMPTY_THINK,),
    stand_in_name="tiny-qwen3",
)

FAMILIES: dict[str, ModelFamily] = {
    f.name: f
    for f in [
        ModelFamily(
            name="qwen3",
            label="Qwen3 (Qwen3-8B's template)",
            tool_call_parser="hermes",
            reasoning_parser="qwen3",
            end_of_turn="<|im_end|>",
            generation_glue=(QWEN_EMPTY_THINK,),
            stand_in_name="tiny-qwen3_hf",
        ),
        ModelFamily(
            name="qwen3_5",
            label="Qwen3.5 / 3.6 (Qwen3.5-4B's template)",
            tool_call_parser="qwen3_coder",
            reasoning_parser="qwen3",
            end_of_turn="<|im_end|>",
        ),
        ModelFamily(
            name="llama3",
            label="Llama 3.1 / 3.3",
            tool_call_parser="llama3_json",
            reasoning_parser=None,
            end_of_turn="<|eot_id|>",
        ),
        ModelFamily(
            name="gpt_oss",
            label="gpt-oss (harmony)",
            tool_call_parser="openai",
            reasoning_parser="openai_gptoss",
            end_of_turn=None,
            harmony=True,
        ),
        ModelFamily(name="glm", label="GLM-4.7", tool_call_parser="glm47", reasoning_parser="glm45", end_of_turn=None),
        ModelFamily(
            name="mistral",
            label="Mistral NeMo 2407 (Tekken)",
            tool_call_parser="mistral",
            reasoning_parser=None,
            end_of_turn="</s>",
        ),
        ModelFamily(
            name="deepseek",
            label="DeepSeek V3.1 (its template + the model card's tool prompt)",
            tool_call_parser="deepseek_v31",
            reasoning_parser="deepseek_v3",
            end_of_turn="<｜end▁of▁sentence｜>",
        ),
        ModelFamily(
            name="nemotron3_nano",
            label="Nemotron 3 Nano (template only: stand-in tokenizer)",
            tool_call_parser="qwen3_coder",
            reasoning_parser="nemotron_v3",
            end_of_turn="<|im_end|>",
        ),
        ModelFamily(
            name="kimi_k2",
            label="Kimi K2 Instruct 0905 (template only: stand-in tokenizer)",
            tool_call_parser="kimi_k2",
            reasoning_parser=None,
            end_of_turn="<|im_end|>",
        ),
        ModelFamily(
            name="gemma",
            label="Gemma 3 (no tool support)",
            tool_call_parser=None,
            reasoning_parser=None,
            end_of_turn="<end_of_turn>",
        ),
    ]
}


def family_named(name: str | None) -> ModelFamily | None:
    return FAMILIES.get(name or "")


def stand_ins() -> dict[str, ModelFamily]:
    """Every family by its stand-in's name, the project's own model first."""
    return {CHATML.stand_in: CHATML, **{f.stand_in: f for f in FAMILIES.values()}}


def generation_glue() -> list[list[int]]:
    """Every declared family's generation-prompt glue, once each (reconstruction's default)."""
    seen: dict[tuple[int, ...], None] = {}
    for f in [CHATML, *FAMILIES.values()]:
        seen.update(dict.fromkeys(f.generation_glue))
    return [list(g) for g in seen]


def family_file_fields(family: ModelFamily) -> dict[str, Any]:
    """What a stand-in's polar-family.json says of its family (the stand-in recipe adds its own notes)."""
    return {
        "family": family.name,
        "tool_call_parser": family.tool_call_parser,
        "reasoning_parser": family.reasoning_parser,
        "end_of_turn": family.end_of_turn,
        "max_model_len": family.max_model_len,
    }


def read_family_file(path: Path) -> dict[str, Any]:
    """What a model directory's family file says (empty for a directory without one). Its keys win over the family's
    declaration: a user's own directory may name other parsers."""
    file = path / FAMILY_FILE
    return json.loads(file.read_text()) if file.exists() else {}


def served_trait(family_file: dict[str, Any], key: str) -> Any:
    """One trait of a model directory's family: its file's value where it has the key (None included: a template
    without tools names no parser), else the ChatML default's."""
    return family_file[key] if key in family_file else getattr(CHATML, key)


def is_harmony(family_file: dict[str, Any]) -> bool:
    declared = family_named(family_file.get("family"))
    return declared is not None and declared.harmony


if __name__ == "__main__":  # the Makefile's list of family stand-ins to build
    print(" ".join(f.stand_in for f in FAMILIES.values()))
