"""The task family ``polar learn --harness`` trains on: a setting whose value exists only in a workspace data file.

Each task is a small repository: ``<module>.py`` holds ``<NAME> = 0`` and ``data/<name>.txt`` holds the number the
setting must be. The problem statement names both files but not the number, so the reward needs the harness's own
protocol: read the data file with the CLI's tool, then change the module with it. It is graded as any SWE-bench 5
task (FAIL_TO_PASS: the setting equals the number; PASS_TO_PASS: the module still imports an integer), so a
session that answers the number in prose, or writes a call the CLI cannot run, scores 0.

Tasks are written as a SWE-bench 5 task repo (``sweb.yaml``, ``tasks/<id>/`` with ``task.yaml``, ``repo/``,
``eval.sh``, ``gold.patch``, ``test.patch``, ``tests.json``) and read back with swebench's own reader, like the
bundled tasks. Each carries a script (read the file, edit the module, say so): the teacher that stands in for a
larger model in the warm-up. The ``train`` and ``held_out`` splits come from one seeded draw and share no
(module, setting, value).
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from pathlib import Path
from typing import Literal

import yaml

from nemo_polar.rewards.instance import SWEInstance, load_task_repo

Split = Literal["train", "held_out"]
SETTINGS = (
    "LIMIT", "TIMEOUT", "PORT", "RETRIES", "WORKERS", "BATCH_SIZE", "MAX_DEPTH", "CACHE_SIZE",
    "INTERVAL", "THRESHOLD", "BUFFER", "QUOTA", "WINDOW", "CAPACITY", "DELAY", "PAGE_SIZE",
)  # fmt: skip
MODULES = ("settings", "config", "defaults", "constants")
REPO = "polar/lookup"
TEST_FILE = "tests/test_module.py"
MARK = "EOF_114329324912"  # the heredoc marker SWE-bench's eval scripts use


class LookupTask:
    """One task: ``module.NAME`` must become ``value``, which only ``data/name.txt`` holds."""

    def __init__(self, index: int, module: str, name: str, value: int, split: Split) -> None:
        self.instance_id = f"polar__lookup-{index}"
        self.module, self.name, self.value, self.split = module, name, value, split
        self.data_file = f"data/{name.lower()}.txt"
        self.module_file = f"{module}.py"

    @property
    def problem_statement(self) -> str:
        return (
            f"`{self.name}` in `{self.module_file}` is still 0. Set it to the number stored in `{self.data_file}`; "
            f"the tests check that `{self.module}.{self.name}` equals that number.\n"
        )

    def files(self) -> dict[str, str]:
        return {
            self.module_file: f"{self.name} = 0\n",
            self.data_file: f"{self.value}\n",
            TEST_FILE: (
                f"import {self.module}\n\n\n"
                f"def test_{self.name.lower()}_is_an_integer():\n"
                f"    assert isinstance({self.module}.{self.name}, int)\n"
            ),
        }

    def gold(self) -> dict[str, str]:
        return {self.module_file: f"{self.name} = {self.value}\n"}

    def test_addition(self) -> dict[str, str]:
        return {
            TEST_FILE: self.files()[TEST_FILE]
            + (
                f"\n\ndef test_{self.name.lower()}_matches_the_data_file():\n"
                f"    assert {self.module}.{self.name} == {self.value}\n"
            )
        }

    def script(self) -> list[dict[str, str]]:
        """The teacher's turns: read the data file, edit the module, say what changed."""
        edit = {"old": f"{self.name} = 0", "new": f"{self.name} = {self.value}"}
        return [
            {"kind": "read_file", "path": self.data_file},
            {"kind": "edit_file", "path": self.module_file, **edit},
            {"kind": "final", "text": f"Set {self.name} in {self.module_file} to {self.value}."},
        ]

    def tests(self) -> dict[str, list[str]]:
        low = self.name.lower()
        return {
            "FAIL_TO_PASS": [f"{TEST_FILE}::test_{low}_matches_the_data_file"],
            "PASS_TO_PASS": [f"{TEST_FILE}::test_{low}_is_an_integer"],
        }


def draw(seed: int, train: int, held_out: int) -> list[LookupTask]:
    """``train + held_out`` tasks from one seeded draw: distinct (module, setting) pairs and values, so no
    held-out task repeats a training task's file layout or number."""
    pairs = [(m, n) for m in MODULES for n in SETTINGS]
    total = train + held_out
    if total > len(pairs):
        raise ValueError(f"at most {len(pairs)} lookup tasks (modules x settings), asked for {total}")
    rng = random.Random(seed)
    chosen = rng.sample(pairs, total)
    values = rng.sample(range(100, 10_000), total)
    return [
        LookupTask(i, module, name, value, "held_out" if i >= train else "train")
        for i, ((module, name), value) in enumerate(zip(chosen, values, strict=True))
    ]


def _git(cwd: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "polar", "GIT_AUTHOR_EMAIL": "polar@localhost", "HOME": str(cwd)}
    env |= {"GIT_COMMITTER_NAME": "polar", "GIT_COMMITTER_EMAIL": "polar@localhost"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def _diff(repo: Path, changes: dict[str, str]) -> str:
    """The unified diff git writes for ``changes`` over the committed checkout (which is left as it was)."""
    for rel, text in changes.items():
        (repo / rel).write_text(text)
    diff = _git(repo, "diff", "--no-color", "--no-ext-diff")
    _git(repo, "checkout", "--", ".")
    return diff


def eval_script(test_patch: str) -> str:
    """SWE-bench 5's shape: restore the test file, apply the test patch, run the tests between the markers,
    restore it again (what the agent wrote to the test file never counts)."""
    return (
        "#!/bin/bash\nset -uxo pipefail\n"
        f"git checkout HEAD {TEST_FILE}\n"
        f"git apply -v - <<'{MARK}'\n{test_patch}{MARK}\n"
        ": '>>>>> Start Test Output'\n"
        f"python -m pytest -rA -p no:cacheprovider {TEST_FILE}\n"
        ": '>>>>> End Test Output'\n"
        f"git checkout HEAD {TEST_FILE}\n"
    )


def write_task(task: LookupTask, tasks_dir: Path) -> Path:
    root = tasks_dir / task.instance_id
    repo = root / "repo"
    for rel, text in task.files().items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    gold, test_patch = _diff(repo, task.gold()), _diff(repo, task.test_addition())
    shutil.rmtree(repo / ".git")  # the runtime makes its own history
    (root / "gold.patch").write_text(gold)
    (root / "test.patch").write_text(test_patch)
    (root / "eval.sh").write_text(eval_script(test_patch))
    (root / "tests.json").write_text(json.dumps(task.tests(), indent=2) + "\n")
    (root / "problem_statement.md").write_text(task.problem_statement)
    meta = {
        "datasets": ["polar-lookup"],
        "eval_type": "pass_and_fail",
        "instance_id": task.instance_id,
        "log_parser": "parse_log_pytest",
        "python_env": "py3-pytest",
        "repo": REPO,
        "repo_path": "repo",
        "split": task.split,
        "version": "1.0",
        "script": task.script(),
    }
    (root / "task.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    return root


def write_task_repo(out: Path, seed: int, train: int, held_out: int) -> dict[Split, list[SWEInstance]]:
    """Write the family as a SWE-bench 5 task repo under ``out`` (replacing one there) and read it back with
    swebench's reader: the instances of each split."""
    shutil.rmtree(out, ignore_errors=True)
    tasks_dir = out / "tasks"
    tasks_dir.mkdir(parents=True)
    (out / "sweb.yaml").write_text(yaml.safe_dump({"datasets": ["polar-lookup"], "splits": ["train", "held_out"]}))
    drawn = draw(seed, train, held_out)
    for task in drawn:
        write_task(task, tasks_dir)
    by_id = {i.instance_id: i for i in load_task_repo(out)}
    return {split: [by_id[t.instance_id] for t in drawn if t.split == split] for split in ("train", "held_out")}
