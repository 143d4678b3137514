"""A harness is one module: every list of CLIs derives from the registry (``HARNESSES``), the files Gym and Hydra
read from disk are what the registry generates, and a toy harness registered here, in one place, appears in every
derived list, file and path (its env resolves, its state folder stays out of patches)."""

from __future__ import annotations

import pkgutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import nemo_polar.env.gym as gym
import nemo_polar.env.harness as harness_pkg
from nemo_polar.env.frontends import demo_runs
from nemo_polar.env.frontends.patterns import harness_order, patterns_table
from nemo_polar.env.gym import VARIANTS, environments, gym_root
from nemo_polar.env.gym.files import FILES, config_yaml, readme, write_files
from nemo_polar.env.harness import HARNESSES, EnvOption, GymValues, Harness, Launch, get_harness, register
from nemo_polar.env.specs import PolarEnvSpec, env_dir, env_yaml, resolve_env, write_env_files
from nemo_polar.reconstruct.side_rules import DEFAULT_SIDE_RULES, HARNESS_SIDE_RULES
from nemo_polar.sandbox.workspace import git

# -- the checked-in files are the registry's ----------------------------------------------------------------------


@pytest.mark.parametrize("name", list(HARNESSES))
def test_checked_in_env_and_gym_files_are_what_the_registry_generates(name: str) -> None:
    """Regenerate with ``make generate`` (``python -m nemo_polar.env.gym.files``)."""
    h = HARNESSES[name]
    assert (env_dir() / f"{h.env_name()}.yaml").read_text() == env_yaml(h)
    folder = gym_root() / "environments" / h.env_name()
    for file, render in FILES.items():
        assert (folder / file).read_text() == render(h), file
    for variant, render_variant in VARIANTS.items():
        assert (folder / f"{variant}.yaml").read_text() == render_variant(h.env_name())


def test_no_env_or_gym_environment_without_a_harness() -> None:
    assert sorted(p.stem for p in env_dir().glob("polar_*.yaml")) == list(environments())
    assert sorted(p.name for p in (gym_root() / "environments").iterdir()) == list(environments())


def test_every_adapter_module_registers_one_harness() -> None:
    """Discovery: each public module of the package (the shared ones aside) is one adapter, registered in ``order``."""
    modules = {m.name for m in pkgutil.iter_modules(harness_pkg.__path__) if not m.name.startswith("_")}
    modules -= harness_pkg.SHARED_MODULES
    assert sorted(h.__module__.rsplit(".", 1)[1] for h in HARNESSES.values()) == sorted(modules)
    orders = [h.order for h in HARNESSES.values()]
    assert orders == sorted(orders) and len(set(orders)) == len(orders)
    assert list(HARNESSES)[:4] == ["codex", "claude_code", "qwen_code", "pi"]  # the paper's four first


def test_side_rules_are_keyed_by_registered_harnesses() -> None:
    assert set(HARNESS_SIDE_RULES) <= set(HARNESSES)
    for name, rules in HARNESS_SIDE_RULES.items():
        assert HARNESSES[name].side_rules() == rules and all(r.name.startswith(f"{name}_") for r in rules)
        assert all(r in DEFAULT_SIDE_RULES for r in rules)  # reconstruct's defaults hold every harness's rules
    assert HARNESSES["pi"].side_rules() == ()


# -- a toy harness, declared once -----------------------------------------------------------------------------------


class Toy(Harness):
    name = "toy"
    package = "toy-cli"
    version = "0.0.1"
    bin = "toy"
    order = -1  # before every other CLI
    demo_task = "polar__csvlite-1"
    state_dirs = (".toy",)
    env_options = (EnvOption("speed", 3, "keys per second"), EnvOption("quiet", True, "no banner"))
    gym = GymValues(title="Toy CLI", agent="The toy CLI", api="OpenAI Chat Completions API", timeout=60)

    def __init__(self, speed: int = 1, quiet: bool = False) -> None:
        self.speed, self.quiet = speed, quiet

    def launch(self, instruction: str, endpoint: Any, *, root: str, home: str, workspace: str) -> Launch:
        return Launch(argv=[self.executable(root), instruction])

    def shell(self, command: str) -> tuple[str, dict[str, Any]]:
        return "sh", {"cmd": command}

    def read_file(self, path: str) -> tuple[str, dict[str, Any]]:
        return "cat", {"path": path}

    def edit_file(self, path: str, old: str, new: str) -> tuple[str, dict[str, Any]]:
        return "edit", {"path": path, "old": old, "new": new}


@pytest.fixture
def toy() -> Iterator[type[Toy]]:
    before = dict(HARNESSES)
    register(Toy)
    try:
        yield Toy
    finally:
        HARNESSES.clear()
        HARNESSES.update(before)


def test_a_toy_harness_is_in_every_list(toy: type[Toy]) -> None:
    assert next(iter(HARNESSES)) == "toy" and harness_order()["toy"] == -1
    assert "polar_toy" in environments() and "polar_toy" in gym.ENVIRONMENTS
    assert next(iter(demo_runs.demo_tasks())) == "polar_toy" and demo_runs.TASKS["polar_toy"] == "polar__csvlite-1"
    assert get_harness("pi").excludes()[0] == ".toy"  # every CLI's state is excluded, whoever ran
    assert toy.side_rules() == ()


def test_a_toy_harness_gets_its_env_and_gym_files(toy: type[Toy], tmp_path: Path) -> None:
    [conf] = [p for p in write_env_files(tmp_path) if p.stem == "polar_toy"]
    spec = PolarEnvSpec.model_validate(yaml.safe_load(conf.read_text()))
    assert spec == PolarEnvSpec(
        name="polar_toy", harness="toy", harness_options={"speed": 3, "quiet": True}, session={"mode": "continuation"}
    )
    resolved = resolve_env(spec)  # a registered harness: the env resolves and the adapter takes its options
    adapter = get_harness(resolved.harness, **resolved.harness_options)
    assert isinstance(adapter, Toy) and (adapter.speed, adapter.quiet) == (3, True)
    assert "  speed: 3  # keys per second\n" in conf.read_text()

    written = write_files(tmp_path)
    assert tmp_path / "environments" / "polar_toy" / "config.yaml" in written
    config = yaml.safe_load((tmp_path / "environments" / "polar_toy" / "config.yaml").read_text())
    agent = config["polar_toy_agent"]["responses_api_agents"]["polar_agent"]
    assert agent["env"] == "polar_toy" and agent["timeout"] == 60 and agent["description"].startswith("Toy CLI ")
    assert next(d["jsonl_fpath"] for d in agent["datasets"]) == "environments/polar_toy/data/train.jsonl"
    assert config["polar_toy_native"]["environment_servers"]["polar_env"]["timeout"] == 60
    assert config["polar_toy_environment_server"]["environment_servers"]["legacy_agent"]["agent_server"] == {
        "type": "responses_api_agents",
        "name": "polar_toy_agent",
    }
    assert readme(toy).startswith("# polar_toy\n\nThe toy CLI (harness `toy`, OpenAI Chat Completions API) runs")
    assert config_yaml(toy) != config_yaml(HARNESSES["pi"])


def test_a_toy_harness_leads_the_patterns_table(toy: type[Toy], tmp_path: Path) -> None:
    for cli in ("pi", "toy", "codex"):
        (tmp_path / "subagent").mkdir(exist_ok=True)
        (tmp_path / "subagent" / f"{cli}.yaml").write_text(f"about: no subagent tool in {cli}\nunsupported: true\n")
    (tmp_path / "results").mkdir()
    table, problems = patterns_table(tmp_path, tmp_path / "results")
    assert table.splitlines()[0] == "| scenario | toy | codex | pi |" and problems == []


def test_a_toy_harness_state_stays_out_of_the_patch(toy: type[Toy], tmp_path: Path) -> None:
    from nemo_polar.sandbox.workspace import extract_patch

    (tmp_path / "app.py").write_text("x = 1\n")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-q", "-m", "base")
    (tmp_path / "app.py").write_text("x = 2\n")
    (tmp_path / ".toy").mkdir()
    (tmp_path / ".toy" / "session.json").write_text("{}\n")
    patch = extract_patch(tmp_path, get_harness("codex").excludes())
    assert "app.py" in patch and ".toy" not in patch


def test_the_toy_is_gone_after_its_test_and_a_bad_declaration_is_refused() -> None:
    assert "toy" not in HARNESSES and "polar_toy" not in environments()
    before = list(HARNESSES.items())
    undeclared = {"name": "undeclared", "package": "u", "version": "1", "bin": "u", "order": 50}
    with pytest.raises(TypeError, match="Undeclared does not declare demo_task, gym"):
        register(type("Undeclared", (Harness,), undeclared))
    with pytest.raises(TypeError, match="takes the name or order of Pi"):
        register(type("SamePlace", (Toy,), {"name": "same_place", "order": HARNESSES["pi"].order}))
    with pytest.raises(TypeError, match="takes the name or order of Pi"):
        register(type("SameName", (Toy,), {"name": "pi", "order": 50}))
    assert list(HARNESSES.items()) == before
