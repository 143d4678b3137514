"""SWE-bench / SWE-Gym instances as they are published, and where their environment comes from.

The fields are SWE-bench's own (list fields may also be JSON strings, as in the Hugging Face datasets). A SWE-bench
5 row carries its ``image``, its ``eval_script`` and its ``log_parser``: the image is its environment for the agent
and for the grader, and the eval script is how it is graded. Rows come as JSONL, parquet, ``save_to_disk``
directories, SWE-bench 5 task directories (``tasks/<id>/``, read with ``swebench.task.repo``) or the bundled tasks.
Where the environment comes from is decided in one place: :meth:`SWEInstance.environment`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator
from unidiff import PatchSet

from nemo_polar.paths import cache_dir
from nemo_polar.rewards.environment import InstanceEnvironment
from nemo_polar.rewards.testlog import known_log_parsers, split_eval_script, swebench_version
from nemo_polar.sandbox.workspace import Task

DEFAULT_TEST_COMMAND = "python -m pytest -rA -p no:cacheprovider"


class SWEInstance(BaseModel):
    instance_id: str
    repo: str = Field(description="owner/name, as in SWE-bench")
    base_commit: str | None = None
    problem_statement: str
    patch: str = Field(default="", description="the gold patch (never shown to the agent)")
    test_patch: str = ""
    FAIL_TO_PASS: list[str] = Field(default_factory=list)
    PASS_TO_PASS: list[str] = Field(default_factory=list)
    version: str = ""
    environment_setup_commit: str | None = None
    # Where the environment comes from (see environment()).
    image: str | None = Field(default=None, description="the instance's image, the repository at /testbed")
    repo_path: Path | None = Field(default=None, description="local directory or git repository with the code")
    python_env: Path | None = Field(
        default=None, description="a virtualenv (or the name of one in $POLAR_CACHE/envs) mounted read-only, on PATH"
    )
    # How it is graded: the row's own eval script, or (rows without one) the test command on the test files.
    eval_script: str | None = Field(default=None, description="SWE-bench 5's eval.sh: test patch, then the tests")
    eval_type: str = Field(default="pass_and_fail", description="swebench's EvalType")
    setup_command: str | None = Field(default=None, description="run in the evaluation sandbox before the tests")
    test_command: str = DEFAULT_TEST_COMMAND
    log_parser: str = "parse_log_pytest"
    test_timeout_s: float = 300.0
    script: list[dict[str, Any]] | None = Field(default=None, description="scripted policy turns that solve it")

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _json_list(cls, value: Any) -> Any:
        return json.loads(value) if isinstance(value, str) else value

    @field_validator("log_parser")
    @classmethod
    def _known_parser(cls, value: str) -> str:
        if value not in known_log_parsers():
            raise ValueError(f"unknown log_parser {value!r}: swebench {swebench_version()} has no such parser")
        return value

    @field_validator("eval_type")
    @classmethod
    def _known_eval_type(cls, value: str) -> str:
        from swebench.harness.constants import EvalType

        if value not in {t.value for t in EvalType}:
            raise ValueError(f"unknown eval_type {value!r} (swebench knows {', '.join(t.value for t in EvalType)})")
        return value

    @field_validator("eval_script")
    @classmethod
    def _has_markers(cls, value: str | None) -> str | None:
        if value is not None:
            split_eval_script(value)  # raises, naming what is missing
        return value

    def environment(self) -> InstanceEnvironment:
        """Where this instance's code and system come from, for the agent's runtime and the grader alike: the
        image when the row has one (its /testbed is the code), else the local checkout with its Python."""
        if self.image is None and self.repo_path is None:
            raise ValueError(f"instance {self.instance_id} has neither an image nor a repo_path: nothing to run in")
        return InstanceEnvironment(
            instance_id=self.instance_id,
            image=self.image,
            repo=None if self.image else self.repo_path,
            base_commit=self.base_commit,
            python_env=None if self.image else self.python_env,
        )

    @property
    def test_files(self) -> list[str]:
        """Files the test patch touches: restored to the base and re-patched over whatever the agent did."""
        return [f.path for f in PatchSet(self.test_patch)] if self.test_patch.strip() else []

    def task(self, runtime: str) -> Task:
        """What the agent works on: the environment's code, as the runtime ``runtime`` finds it."""
        return self.environment().task(self.problem_statement, runtime)


def _rows_from_jsonl(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield f"{path}:{lineno}", json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not JSON: {exc}") from None


def validate_row(where: str, row: dict[str, Any], base: Path) -> SWEInstance:
    try:
        inst = SWEInstance.model_validate(row)
    except ValidationError as exc:
        raise ValueError(f"{where}: not a valid instance: {exc}") from None
    if inst.repo_path is not None and not inst.repo_path.is_absolute():
        inst.repo_path = (base / inst.repo_path).resolve()
    if inst.python_env is not None and not inst.python_env.is_absolute():
        # a bare name is an environment `make task-env` built; any other relative path is the file's
        named = len(inst.python_env.parts) == 1
        inst.python_env = cache_dir() / "envs" / inst.python_env if named else (base / inst.python_env).resolve()
    return inst


def read_rows(path: Path, split: str = "test") -> list[tuple[str, dict[str, Any]]]:
    """The raw rows of a JSONL file or of local Hugging Face dataset files (parquet/json, or a ``save_to_disk``
    directory, e.g. a downloaded SWE-bench Verified or SWE-Gym; no hub access needed), each with where it is
    (``file:line`` or ``file[i]``) for error messages."""
    if not path.exists():
        raise FileNotFoundError(f"instances file {path} does not exist")
    if path.suffix == ".jsonl":
        return list(_rows_from_jsonl(path))
    import datasets

    if path.is_dir() and (path / "dataset_info.json").exists():
        ds = datasets.load_from_disk(str(path))
    elif path.is_dir() and any(path.glob("**/*.parquet")):
        ds = datasets.load_dataset("parquet", data_files=[str(p) for p in sorted(path.glob("**/*.parquet"))])
    else:
        kind = "parquet" if path.suffix == ".parquet" else "json"
        ds = datasets.load_dataset(kind, data_files=str(path))
    if isinstance(ds, datasets.DatasetDict):
        ds = ds[split] if split in ds else ds[next(iter(ds))]
    return [(f"{path}[{i}]", dict(row)) for i, row in enumerate(ds)]


def load_task_repo(path: Path) -> list[SWEInstance]:
    """A SWE-bench 5 task repo (``tasks/<id>/``) or one task directory of it, read by swebench's own reader."""
    from swebench.task import repo as task_repo

    dirs = task_repo.task_dirs(path) if (path / task_repo.TASKS_SUBDIR).is_dir() else [path]
    instances = []
    for d in dirs:
        try:
            row = task_repo.load_task(d)
        except (OSError, ValueError, yaml.YAMLError) as exc:  # a missing file, bad JSON or YAML: name the task
            raise ValueError(f"{d}: not a SWE-bench task directory: {exc}") from None
        instances.append(validate_row(str(d), row, d))
    return instances


def is_task_dir(path: Path) -> bool:
    """A SWE-bench 5 task directory (it has ``task.yaml``) or a task repo holding them."""
    return (path / "tasks").is_dir() or (path / "task.yaml").is_file()


# -- bundled instances: a task repo, examples/tasks/swe/tasks/<id>/ (each with its checkout in repo/) ---------------
def bundled_dir() -> Path:
    from nemo_polar.paths import bundled_tasks_dir

    return bundled_tasks_dir()


def bundled_instances() -> list[SWEInstance]:
    return load_task_repo(bundled_dir())
