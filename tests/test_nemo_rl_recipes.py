"""The NeMo-RL GRPO recipes in examples/nemo_rl/: each loads with NeMo-RL's inheritance rule, trains Qwen3.5-4B
with Megatron and async GRPO, and points env.nemo_gym.config_paths at a shipped Polar environment whose agent
config validates (merged by nemo-gym's own parser) once NeMo-RL supplies the policy's base URL. Broken copies of
a recipe fail the check with a message naming the problem."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

pytest.importorskip("nemo_gym", reason="nemo-gym is not installed (make gym)")

from nemo_polar.env.gym import ENVIRONMENTS, agent_name, gym_root
from nemo_polar.env.gym.recipes import RecipeError, check_recipe, load_recipe
from nemo_polar.env.specs import get_env
from tests.conftest import ENV_HARNESSES
from tests.helpers.doc_blocks import doc_block, run_block
from tests.helpers.lanes import FULL

RECIPES = Path(__file__).resolve().parents[1] / "examples" / "nemo_rl"
README = RECIPES / "README.md"
CLIS = ENV_HARNESSES


@pytest.fixture(autouse=True)
def polar_gym_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLAR_GYM_ROOT", str(gym_root()))


def write(path: Path, data: dict | list) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def child_of(tmp_path: Path, cli: str, override: dict) -> Path:
    """A broken copy: a recipe that inherits the shipped one and overrides some keys."""
    return write(tmp_path / "bad.yaml", {"defaults": str(RECIPES / f"grpo_polar_{cli}.yaml"), **override})


def test_there_is_one_recipe_per_polar_environment() -> None:
    assert {p.name for p in RECIPES.glob("*.yaml")} == {"grpo_polar_base.yaml", "grpo_polar_codex_multi_trace.yaml"} | {
        f"grpo_polar_{cli}.yaml" for cli in CLIS
    }
    assert {f"polar_{cli}" for cli in CLIS} == set(ENVIRONMENTS)


@pytest.mark.parametrize("cli", CLIS)
def test_recipe_trains_qwen35_4b_with_megatron_and_async_grpo_on_its_environment(cli: str) -> None:
    summary = check_recipe(RECIPES / f"grpo_polar_{cli}.yaml")
    assert summary.model == "Qwen/Qwen3.5-4B"
    assert (summary.training_backend, summary.generation_backend) == ("megatron", "vllm")
    assert summary.async_grpo and not summary.colocated and summary.http_server
    assert (summary.group_size, summary.prompts_per_step) == (16, 8)
    [agent] = summary.agents
    env = f"polar_{cli}"
    assert (agent.instance, agent.env, agent.mode) == (agent_name(env), env, "chat_prefix")
    assert agent.harness == get_env(env).harness
    assert agent.config_path == gym_root() / "environments" / env / "config.yaml"
    data = gym_root() / "environments" / env / "data"
    assert summary.data_paths == [data / "train.jsonl", data / "validation.jsonl"]  # Gym's splits, disjoint

    config = load_recipe(RECIPES / f"grpo_polar_{cli}.yaml")
    assert config.env.nemo_gym.config_paths == [f"environments/{env}/config.yaml"]  # relative: Gym's search roots
    assert "defaults" not in config and config.policy.dtensor_cfg.enabled is False
    assert config.policy.megatron_cfg.enabled is True and config.grpo.async_grpo.enabled is True


def test_the_multi_trace_recipe_trains_on_every_trace_and_its_rules_hold(tmp_path: Path) -> None:
    """grpo.gym_multi_trace (NeMo-RL PR #4078): synchronous, Megatron, token-level loss, agents delivering the
    training_traces envelope; each rule broken in a child recipe is named."""
    recipe = RECIPES / "grpo_polar_codex_multi_trace.yaml"
    summary = check_recipe(recipe)
    assert summary.multi_trace and not summary.async_grpo and summary.training_backend == "megatron"
    assert [a.delivery for a in summary.agents] == ["all_traces"]
    assert not check_recipe(RECIPES / "grpo_polar_codex.yaml").multi_trace
    broken = {
        "async": ({"grpo": {"async_grpo": {"enabled": True}}}, "grpo.async_grpo.enabled must be false"),
        "dtensor": (
            {"policy": {"megatron_cfg": {"enabled": False}, "dtensor_cfg": {"enabled": True}}},
            "policy.megatron_cfg.enabled must be true",
        ),
        "seq_ratios": ({"loss_fn": {"sequence_level_importance_ratios": True}}, "sequence_level_importance_ratios"),
        "main_chain": (
            {"polar": {"agent": {"delivery": "main_chain", "builder": "prefix_merging"}}},
            "polar_codex_agent must set delivery: all_traces",
        ),
        "per_request_alone": (
            {"polar": {"agent": {"delivery": "main_chain", "builder": "per_request"}}},
            "builder per_request needs delivery all_traces",
        ),
    }
    for name, (override, message) in broken.items():
        child = write(tmp_path / f"{name}.yaml", {"defaults": str(recipe), **override})
        with pytest.raises(RecipeError, match=message):
            check_recipe(child)


def test_agent_needs_the_base_url_nemo_rl_injects() -> None:
    """The environment file takes openai_base_url from ${policy_base_url}; without one the agent cannot run."""
    recipe = RECIPES / "grpo_polar_codex.yaml"
    with pytest.raises(RecipeError, match=r"set proxy_url .* or openai_base_url"):
        check_recipe(recipe, base_urls=())
    urls = ("http://10.0.0.1:7001/v1", "http://10.0.0.2:7001/v1")  # one per vLLM data-parallel rank
    assert check_recipe(recipe, base_urls=urls).agents[0].env == "polar_codex"


def test_unknown_environment_in_config_paths_is_named(tmp_path: Path) -> None:
    bad = child_of(tmp_path, "codex", {"env": {"nemo_gym": {"config_paths": ["environments/polar_nope/config.yaml"]}}})
    with pytest.raises(RecipeError, match=r"'environments/polar_nope/config.yaml' is not in the Polar Gym root"):
        check_recipe(bad)


def test_other_gym_components_in_config_paths_are_left_to_gym(tmp_path: Path) -> None:
    """A recipe may list Gym's own configs next to the Polar environment; Gym resolves those from its install."""
    paths = [
        "responses_api_models/vllm_model/configs/vllm_model_for_training.yaml",
        "environments/polar_pi/config.yaml",
    ]
    summary = check_recipe(child_of(tmp_path, "pi", {"env": {"nemo_gym": {"config_paths": paths}}}))
    assert [a.instance for a in summary.agents] == ["polar_pi_agent"]
    nowhere = ["resources_servers/nowhere/configs/nowhere.yaml", "environments/polar_pi/config.yaml"]
    with pytest.raises(RecipeError, match=r"nemo-gym rejects env.nemo_gym: .*nowhere.yaml' was not found"):
        check_recipe(child_of(tmp_path, "pi", {"env": {"nemo_gym": {"config_paths": nowhere}}}))


def test_agent_naming_an_unknown_polar_env_is_rejected(tmp_path: Path) -> None:
    bad = child_of(tmp_path, "pi", {"polar": {"agent": {"env": "polar_nope"}}})
    with pytest.raises(RecipeError, match=r"polar_pi_agent: unknown Polar env 'polar_nope'; choose one of"):
        check_recipe(bad)


def test_continuation_mode_cannot_talk_to_nemo_rl_vllm_server(tmp_path: Path) -> None:
    bad = child_of(tmp_path, "qwen_code", {"polar": {"agent": {"session": {"mode": "continuation"}}}})
    with pytest.raises(RecipeError, match=r"'continuation' needs /v1/completions"):
        check_recipe(bad)


def test_sampling_not_pinned_to_the_trainers_is_rejected(tmp_path: Path) -> None:
    bad = child_of(tmp_path, "claude_code", {"polar": {"agent": {"session": {"sampling_overrides": {"top_p": 0.95}}}}})
    with pytest.raises(RecipeError, match=r"sampling_overrides.top_p is 0.95 but policy.generation.top_p is 1.0"):
        check_recipe(bad)
    # Moving the trainer's temperature moves the pinned one with it (an interpolation), so that stays valid.
    ok = child_of(tmp_path, "claude_code", {"policy": {"generation": {"temperature": 0.8}}})
    assert check_recipe(ok).agents[0].env == "polar_claude_code"


def test_generation_backend_without_the_vllm_http_server_is_rejected(tmp_path: Path) -> None:
    bad = child_of(tmp_path, "codex", {"policy": {"generation": {"backend": "megatron"}}})
    with pytest.raises(RecipeError, match="backend is 'megatron'"):
        check_recipe(bad)


def test_rows_must_route_to_the_recipes_agent(tmp_path: Path) -> None:
    rows = gym_root() / "environments" / "polar_pi" / "data" / "example.jsonl"
    data = tmp_path / "rows.jsonl"
    data.write_text(rows.read_text())  # polar_pi rows, given to the codex recipe
    bad = child_of(tmp_path, "codex", {"data": {"train": {"data_path": str(data)}}})
    with pytest.raises(RecipeError, match=r"rows.jsonl:1 routes to agent_ref.name 'polar_pi_agent'"):
        check_recipe(bad)
    missing = child_of(tmp_path, "codex", {"data": {"train": {"data_path": str(tmp_path / "none.jsonl")}}})
    with pytest.raises(RecipeError, match=r"data.train data_path .*none.jsonl does not exist"):
        check_recipe(missing)


def test_unresolvable_recipes_say_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(RecipeError, match=r"does not resolve: .*config_paths"):
        check_recipe(RECIPES / "grpo_polar_base.yaml")  # the base names no environment: not runnable alone
    monkeypatch.delenv("POLAR_GYM_ROOT")
    with pytest.raises(RecipeError, match=r"export POLAR_GYM_ROOT=\$\(polar gym-root\)"):
        check_recipe(RECIPES / "grpo_polar_pi.yaml")
    with pytest.raises(RecipeError, match=r"defaults names nowhere\.yaml, which is not a file"):
        load_recipe(write(tmp_path / "orphan.yaml", {"defaults": "nowhere.yaml"}))
    broken = tmp_path / "broken.yaml"
    broken.write_text("policy: {model_name: [\n")
    with pytest.raises(RecipeError, match=r"broken\.yaml: not valid YAML"):
        load_recipe(broken)
    with pytest.raises(RecipeError, match="a recipe must be a mapping"):
        load_recipe(write(tmp_path / "list.yaml", ["a", "b"]))


def test_load_recipe_follows_nemo_rls_inheritance_rule(tmp_path: Path) -> None:
    """nemo_rl.utils.config.load_config: parents relative to the file, merged depth-first in order, the file last;
    a top-level section with ``_override_: true`` replaces the inherited one; ``???`` keeps the inherited value."""
    (tmp_path / "sub").mkdir()
    write(tmp_path / "grand.yaml", {"a": {"x": 1, "y": 1}, "b": {"keep": True, "n": 0}, "c": 1})
    write(tmp_path / "sub" / "p1.yaml", {"defaults": "../grand.yaml", "a": {"y": 2}, "d": ["p1"]})
    write(tmp_path / "p2.yaml", {"a": {"x": 3}, "d": ["p2"], "c": 7})
    child = write(
        tmp_path / "child.yaml",
        {"defaults": ["sub/p1.yaml", "p2.yaml"], "b": {"_override_": True, "n": 5}, "c": "???", "e": {"x": "${a.x}"}},
    )
    config = load_recipe(child)
    assert config.a == {"x": 3, "y": 2}  # grandparent <- p1 <- p2 (later parent wins)
    assert config.d == ["p2"]  # lists are replaced, not concatenated
    assert config.b == {"n": 5}  # _override_: the inherited section is dropped, the marker removed
    assert config.c == 7  # ??? in the child keeps the inherited value
    assert config.e.x == 3 and "defaults" not in config  # interpolations resolve after merging
    # NeMo-RL reads each top-level value of the file before merging: a scalar interpolating an inherited key fails.
    with pytest.raises(RecipeError, match="does not merge over its defaults: Interpolation key 'c' not found"):
        load_recipe(write(tmp_path / "scalar.yaml", {"defaults": "grand.yaml", "f": "${c}"}))


def readme_block(name: str) -> str:
    """The bash block after ``<!-- nemo-rl: NAME -->`` in examples/nemo_rl/README.md, for this checkout."""
    return doc_block(README, "nemo-rl", name).replace("/shared/nemo_polar", str(RECIPES.parents[1]))


@FULL
def test_the_readmes_check_commands_run_as_written(tmp_path: Path) -> None:
    """The README's pre-flight block after its exports (the wheel's line aside: tests/test_gym_install.py builds it):
    the recipe's summary, and Gym's own dry validation of the environment's config."""
    exports = "\n".join(line for line in readme_block("exports").splitlines() if "--wheel" not in line)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POLAR_GYM_", "NEMO_GYM_"))}
    done = run_block(exports + "\n" + readme_block("check"), tmp_path, env, timeout=300)
    summary = json.loads(done.stdout[: done.stdout.index("\n}\n") + 2])
    assert summary["model"] == "Qwen/Qwen3.5-4B" and [a["instance"] for a in summary["agents"]] == ["polar_codex_agent"]
    assert [Path(p).name for p in summary["data_paths"]] == ["train.jsonl", "validation.jsonl"]
    assert "Config is valid" in done.stdout


def test_polar_gym_recipe_names_the_problem(tmp_path: Path) -> None:
    from nemo_polar.cli import main as polar

    bad = child_of(tmp_path, "codex", {"data": {"train": {"data_path": str(tmp_path / "none.jsonl")}}})
    with pytest.raises(SystemExit, match=r"^polar gym-recipe: .*bad\.yaml: data\.train data_path .* does not exist"):
        polar(["gym-recipe", str(bad)])
