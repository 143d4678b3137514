"""Legacy rows (SWE-Gym, SWE-bench exports before 5.0: no eval_script, log_parser or image) converted by
`polar convert-rows` with a pre-5.0 swebench's own spec tables, run in its tool venv. The three real tasks of
examples/tasks/swebench5, stripped to legacy rows, come back as the task repo publishes them: Django and SymPy from
swebench 4.1.0's tables, more-itertools (which the tables lack, as they lack SWE-Gym's repositories) and requests 2.30
(a version they lack) from --specs, requests' parser under swebench 5's name for it (4.1 names the function)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_polar.cli import main
from nemo_polar.rewards.datasets import select_instances
from nemo_polar.rewards.legacy import current_parser_name, image_name
from nemo_polar.rewards.testlog import is_pytest_parser, repo_parser_names

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "examples" / "tasks" / "swebench5"
PUBLISHED = ("eval_script", "image", "log_parser", "eval_type")
LOCAL_IMAGE = "nemo-polar/sweb.eval.x86_64.{instance_id}:latest"
SPECS = """\
more-itertools/more-itertools:
  "10.3":
    test_cmd: pytest --no-header -rA --tb=no -p no:cacheprovider
    install: python -m pip install -e .
    log_parser: parse_log_pytest
psf/requests:
  "2.30":
    test_cmd: pytest --no-header -rA --tb=no -p no:cacheprovider
    install: python -m pip install -e .
"""


def task_rows() -> list[dict]:
    from swebench.task.repo import load_task_repo

    return load_task_repo(TASKS)


def legacy_parquet(path: Path, rows: list[dict]) -> Path:
    """The rows as the Hugging Face datasets publish legacy sets: no published fields, test lists as JSON text."""
    import datasets

    legacy = [
        {
            **{k: v for k, v in row.items() if k not in PUBLISHED and k != "datasets"},
            "FAIL_TO_PASS": json.dumps(row["FAIL_TO_PASS"]),
            "PASS_TO_PASS": json.dumps(row["PASS_TO_PASS"]),
        }
        for row in rows
    ]
    datasets.Dataset.from_list(legacy).to_parquet(str(path))
    return path


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("legacy")
    (tmp / "specs.yaml").write_text(SPECS)
    source = legacy_parquet(tmp / "legacy.parquet", task_rows())
    out = tmp / "rows.jsonl"
    assert (
        main(["convert-rows", str(source), "-o", str(out), "--image", LOCAL_IMAGE, "--specs", str(tmp / "specs.yaml")])
        == 0
    )
    return out


def test_converted_rows_are_the_published_ones(converted: Path) -> None:
    """Byte for byte the task repo's eval scripts, its parsers, eval types and images; every other field kept."""
    rows = {r["instance_id"]: r for r in map(json.loads, converted.read_text().splitlines())}
    for task in task_rows():
        row = rows[task["instance_id"]]
        for key in PUBLISHED:
            assert row[key] == task[key], (task["instance_id"], key)
        assert row["base_commit"] == task["base_commit"] and row["test_patch"] == task["test_patch"]
        assert json.loads(row["FAIL_TO_PASS"]) == task["FAIL_TO_PASS"]
    loaded = select_instances(converted)
    assert all(i.environment().kind == "image" and i.repo_path is None for i in loaded)


@pytest.mark.real_image
def test_a_converted_row_is_graded_daemonless(converted: Path, tmp_path: Path) -> None:
    """The converted more-itertools row, gold and empty, through `polar grade` in bwrap over its image."""
    built = subprocess.run(
        ["bash", str(ROOT / "scripts" / "build_swebench5_images.sh")], capture_output=True, text=True
    )
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    [inst] = select_instances(converted, ["more-itertools__more-itertools-866"])
    predictions = tmp_path / "preds.jsonl"
    predictions.write_text(
        "".join(json.dumps({"instance_id": inst.instance_id, "model_patch": p}) + "\n" for p in (inst.patch, ""))
    )
    out = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "nemo_polar.cli", "grade", "--instances", str(converted), "--runtime", "bwrap"]
    assert subprocess.run([*cmd, "--predictions", str(predictions), "-o", str(out)]).returncode == 0
    gold, empty = json.loads(out.read_text())["results"]
    assert (gold["status"], gold["reward"], gold["mask_sample"]) == ("resolved", 1.0, False)
    assert (empty["reward"], empty["mask_sample"]) == (0.0, False)


def test_image_names_as_the_projects_publish_them() -> None:
    assert image_name("swebench", "django__django-11333") == "swebench/sweb.eval.x86_64.django_1776_django-11333:latest"
    assert (
        image_name("swe-gym", "Project-MONAI__MONAI-6969")
        == "xingyaoww/sweb.eval.x86_64.project-monai_s_monai-6969:latest"
    )
    assert image_name("reg.local/{instance_id}:v1", "a__b-1") == "reg.local/a__b-1:v1"


def test_bad_legacy_rows_are_named_and_nothing_is_written(tmp_path: Path) -> None:
    """Each bad input: exit with one line naming the row (or option), no traceback, no output file."""
    rows = [{k: v for k, v in r.items() if k not in PUBLISHED} for r in task_rows()]
    django = next(r for r in rows if r["repo"] == "django/django")
    (tmp_path / "float.yaml").write_text("more-itertools/more-itertools:\n  10.3: {test_cmd: pytest}\n")
    cases = {
        "no_spec": (
            [django, rows[1]],
            "swebench",
            [],
            ":2 (more-itertools__more-itertools-866): swebench 4.1.0 "
            "has no spec for more-itertools/more-itertools 10.3",
        ),
        "missing": ([{**django, "base_commit": ""}], "swebench", [], ":1: a legacy row needs base_commit"),
        "version": ([{**django, "version": 5.1}], "swebench", [], ":1: version 5.1 must be a string"),
        "image": ([django], "swebnech", [], "--image 'swebnech': not a preset"),
        "specs": ([django], "swebench", ["--specs", str(tmp_path / "float.yaml")], "version 10.3 must be a quoted"),
        "unknown_version": (
            [{**django, "version": "9.9"}],
            "swebench",
            [],
            "has no spec for django/django 9.9 (versions it",
        ),
    }
    for name, (bad, image, extra, message) in cases.items():
        source, out = tmp_path / f"{name}.jsonl", tmp_path / f"{name}.out.jsonl"
        source.write_text("".join(json.dumps(r) + "\n" for r in bad))
        with pytest.raises(SystemExit) as caught:
            main(["convert-rows", str(source), "-o", str(out), "--image", image, *extra])
        assert str(caught.value).startswith("polar convert-rows: ") and message in str(caught.value), name
        assert not out.exists() and not list(tmp_path.glob(f".{name}*")), name


def test_parser_names_are_swebench_5s() -> None:
    """swebench 5 names a repository's parser by its table's alias; the names read from its tables are each bound
    to the very function its table holds, and a 4.x name of the same function becomes 5's."""
    from swebench.harness.log_parsers import PARSER_REGISTRY
    from swebench.harness.log_parsers.python import MAP_REPO_TO_PARSER_PY

    names = repo_parser_names()
    assert names["psf/requests"] == "parse_log_requests" and names["django/django"] == "parse_log_django"
    for repo, parser in MAP_REPO_TO_PARSER_PY.items():
        assert PARSER_REGISTRY[names[repo]] is parser, repo
    assert current_parser_name("psf/requests", "parse_log_pytest_options") == "parse_log_requests"
    assert current_parser_name("psf/requests", "parse_log_pytest") == "parse_log_pytest"  # another function: kept
    assert current_parser_name("example/unknown", "parse_log_pytest_options") == "parse_log_pytest_options"


def test_every_name_of_a_pytest_parser_is_graded_as_pytest() -> None:
    """Only pytest's own final report is graded for a pytest log, whatever name the row gives its parser."""
    from swebench.harness.log_parsers import PARSER_REGISTRY
    from swebench.harness.log_parsers.python import parse_log_pytest, parse_log_pytest_options, parse_log_pytest_v2

    pytest_parsers = (parse_log_pytest, parse_log_pytest_options, parse_log_pytest_v2)
    for name, parser in PARSER_REGISTRY.items():
        assert is_pytest_parser(name) == (parser in pytest_parsers), name
    assert is_pytest_parser("parse_log_requests") and not is_pytest_parser("parse_log_sympy")
