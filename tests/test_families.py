"""A model family is one declaration (nemo_polar/engine/families.py): a toy family declared in one place here
reaches every reader (the launcher, the model builder, the proxy's parsers and template probe, reconstruction, the
bench), and no code outside the declaration matches on a family's, parser's or stand-in's name."""

from __future__ import annotations

import ast
import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from nemo_polar.engine import build_models, families
from nemo_polar.engine.families import FAMILY_FILE, ModelFamily, ToolFormat

ROOT = Path(__file__).resolve().parents[1]
TOY = ModelFamily(
    name="toy",
    label="Toy 1 (a test's family)",
    tool_call_parser="toy_calls",
    reasoning_parser="toy_think",
    end_of_turn="<|toy_end|>",
    harmony=True,
    generation_glue=((7, 8, 9),),
    max_model_len=4096,
)
TOY_CALLS = ToolFormat(call_ids="functions_index", sampled_ids="kimi_headers")


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The toy family declared (its entry and its parser's format), and a model directory the way its stand-in
    recipe would write it; the directory is returned."""
    monkeypatch.setitem(families.FAMILIES, TOY.name, TOY)
    monkeypatch.setitem(families.TOOL_FORMATS, TOY.tool_call_parser, TOY_CALLS)
    model = tmp_path / "models" / TOY.stand_in
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / FAMILY_FILE).write_text(json.dumps(families.family_file_fields(TOY)))
    monkeypatch.setenv("POLAR_CACHE", str(tmp_path))
    return model


def test_a_toy_family_reaches_the_launcher_and_the_model_builder(toy: Path) -> None:
    from nemo_polar.engine.launcher import EngineSpec, known_models, resolve_model

    assert known_models()[TOY.stand_in] == 4096
    assert resolve_model(TOY.stand_in) == (toy, TOY.stand_in, 4096)
    cmd, _ = EngineSpec(model=TOY.stand_in).command()
    assert cmd[cmd.index("--tool-call-parser") + 1] == "toy_calls"
    assert cmd[cmd.index("--reasoning-parser") + 1] == "toy_think"
    assert cmd[cmd.index("--max-model-len") + 1] == "4096"
    # Its stand-in recipe is the one other entry: the builder then knows the model, and stamps what it reads.
    recipe = build_models.StandIn(family="toy", files={}, config={"vocab_size": 64}, stop_ids=(3,))
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(build_models.STAND_INS, "toy", recipe)
        assert TOY.stand_in in build_models.builders()
        assert build_models._recipe(TOY.stand_in)["end_of_turn"] == "<|toy_end|>"
    assert TOY.stand_in not in build_models.builders()


def test_a_toy_family_reaches_the_proxy_reconstruction_and_the_bench(toy: Path) -> None:
    from bench.families import FamilyResult, table
    from nemo_polar.proxy.engine_client import EngineInfo
    from nemo_polar.proxy.parse.family_parser import FamilyFormat, family_format, sampled_call_ids
    from nemo_polar.proxy.render.renderer import probe_template
    from nemo_polar.reconstruct.builders import BuilderConfig

    info = EngineInfo("m", 4096, None, root=str(toy), family=families.read_family_file(toy))
    assert family_format(info, None, None) == FamilyFormat(str(toy), "toy_calls", "toy_think", harmony=True)
    assert families.served_trait(info.family, "end_of_turn") == "<|toy_end|>"
    header = "<|tool_call_begin|>functions.ls:0<|tool_call_argument_begin|>{}<|tool_call_end|>"
    assert sampled_call_ids("toy_calls", header) == ["functions.ls:0"]

    class TakesAnything:  # a template that renders every probe conversation, so the parser's form decides the ids
        name = "any"

        async def render(self, messages: list[dict[str, Any]], tools: Any, kwargs: Any, cache: Any = None) -> list[int]:
            return [len(json.dumps([messages, tools]))]

    assert asyncio.run(probe_template(TakesAnything(), "toy_calls")).call_ids == "functions_index"
    assert asyncio.run(probe_template(TakesAnything(), "hermes")).call_ids == "as_sent"
    assert [7, 8, 9] in BuilderConfig().generation_glue
    row = FamilyResult(
        model=TOY.stand_in, parsers="toy_calls", requests=0, accepted=0, refused={}, render_equal=0, sessions=[],
        tool_calls_scripted=0, tool_calls_returned=0, render_ms_64k=None, render_how="-",
    )  # fmt: skip
    assert f"| {TOY.label} | `{TOY.stand_in}` |" in table([row])


def test_the_makefile_builds_every_declared_family() -> None:
    out = subprocess.run(["make", "-n", "families"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    only = [w for line in out.splitlines() for w in line.split() if w.startswith("tiny-")]
    assert only == [f.stand_in for f in families.FAMILIES.values()]


def test_every_family_has_a_stand_in_recipe_and_its_directory_says_what_it_declares() -> None:
    assert set(build_models.STAND_INS) == set(families.FAMILIES)
    fields = families.family_file_fields(families.FAMILIES["llama3"])
    assert fields == {
        "family": "llama3",
        "tool_call_parser": "llama3_json",
        "reasoning_parser": None,
        "end_of_turn": "<|eot_id|>",
        "max_model_len": 32768,
    }


def _names() -> set[str]:
    declared = [families.CHATML, *families.FAMILIES.values()]
    names = {f.name for f in declared} | set(families.stand_ins()) | {n for n in families.TOOL_FORMATS if n}
    return names | {p for f in declared for p in (f.tool_call_parser, f.reasoning_parser) if p}


def _strings(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Set | ast.Tuple | ast.List):
        return [s for e in node.elts for s in _strings(e)]
    return []


def _matched(node: ast.AST) -> list[str]:
    """The string constants ``node`` matches on: compared with, a dict's keys, looked up with ``.get``."""
    if isinstance(node, ast.Compare):
        return [s for side in [node.left, *node.comparators] for s in _strings(side)]
    if isinstance(node, ast.Dict):
        return [s for k in node.keys if k is not None for s in _strings(k)]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
        return [s for a in node.args[:1] for s in _strings(a)]
    return []


def test_no_code_outside_the_declaration_matches_on_a_family_or_parser_name() -> None:
    """The product, the bench and the examples read traits, not names (the stand-in recipes in build_models.py are
    the declaration's other half). A CLI may share a parser's name (the Hermes agent, hermes tools): within the
    harness code (nemo_polar/env) a registered harness's name is its own."""
    from nemo_polar.env.harness import HARNESSES

    names = _names()
    harness_names = set(HARNESSES)
    files = [p for d in ("nemo_polar", "bench", "examples") for p in sorted((ROOT / d).rglob("*.py"))]
    found = []
    for path in files:
        if path.name in ("families.py", "build_models.py") and path.parent.name == "engine":
            continue
        in_env = "nemo_polar/env/" in path.as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            hits = [s for s in _matched(node) if s in names and not (in_env and s in harness_names)]
            found += [f"{path.relative_to(ROOT)}:{node.lineno} matches {hits}" for _ in hits[:1]]
    assert not found, "\n".join(found)
    assert "hermes" in names and "kimi_k2" in names and "tiny-gemma" in names  # the scan looks for the real names


def test_the_scan_finds_a_match_on_a_family_name(tmp_path: Path) -> None:
    tree = ast.parse('if info.family.get("family") == "gpt_oss":\n    x = {"kimi_k2": 1}.get("mistral")\n')
    hits = sorted(s for node in ast.walk(tree) for s in _matched(node) if s in _names())
    assert hits == ["gpt_oss", "kimi_k2", "mistral"]
