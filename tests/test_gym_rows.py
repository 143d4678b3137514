"""NeMo Gym's SWE rows as Gym ships them: its own example rows (read from the installed nemo-gym's anyswe and
swe_agents agents) and the bundled tasks in each of Gym's shapes read as the SWE-bench instances they carry; images
named by a ``container_formatter`` as Gym's agents name them (anyswe's own function run beside ours); bad rows named
in one line, through ``polar rollout``'s reader as through the Gym agent."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nemo_polar.env.gym.rows import SHAPES, example_row, example_rows
from nemo_polar.rewards.datasets import load_rows
from nemo_polar.rewards.gym_rows import RowError, container_for, instance_from_row, swe_fields
from nemo_polar.rewards.instance import bundled_instances

GYM_FORMATTER = "docker://swebench/sweb.eval.x86_64.{instance_id}"


def gym_example_rows(agent: str) -> list[dict[str, Any]]:
    """Gym's own example rows for its ``agent`` (``responses_api_agents/<agent>/data/example.jsonl``)."""
    agents = pytest.importorskip("responses_api_agents", reason="nemo-gym is not installed (make gym)")
    path = Path(next(iter(agents.__path__))) / agent / "data" / "example.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("shape", SHAPES)
def test_the_bundled_tasks_in_each_gym_shape_are_the_bundled_instances(shape: str, tmp_path: Path) -> None:
    rows = example_rows("polar_pi_agent", shape)  # type: ignore[arg-type]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert load_rows(path) == bundled_instances()  # the reader of `polar rollout` / `polar generate`
    if shape != "polar":
        assert all(r["responses_create_params"]["input"] == [] for r in rows)  # the task text is the metadata's
    from nemo_gym.base_resources_server import BaseRunRequest

    for row in rows:
        parsed = BaseRunRequest.model_validate(row)  # Gym accepts the row, metadata and all
        assert parsed.responses_create_params.metadata == row["responses_create_params"].get("metadata")


@pytest.mark.parametrize("agent", ["anyswe_agent", "swe_agents"])
def test_gyms_own_example_rows_read_as_the_swe_bench_rows_they_carry(agent: str) -> None:
    """Each of Gym's example rows (SWE-bench Verified rows from before 5.0: no eval script) becomes the instance its
    ``instance_dict`` holds, its image named as anyswe names it, its eval script written by swebench's own tables."""
    from responses_api_agents.anyswe_agent.app import AnySweAgent

    rows = gym_example_rows(agent)
    for row in rows[:2]:
        metadata = row["responses_create_params"]["metadata"]
        carried = json.loads(metadata["instance_dict"])
        inst = instance_from_row(row, container_formatter=GYM_FORMATTER)
        assert inst.instance_id == carried["instance_id"] == metadata["instance_id"]
        assert json.loads(carried["FAIL_TO_PASS"]) == inst.FAIL_TO_PASS and inst.patch == carried["patch"]
        assert (inst.base_commit, inst.test_patch) == (carried["base_commit"], carried["test_patch"])
        assert inst.problem_statement == metadata["problem_statement"]  # `input` is empty: the metadata's text
        assert inst.image == AnySweAgent._sandbox_image({**metadata, "container_formatter": GYM_FORMATTER})
        assert inst.log_parser == "parse_log_astropy" and inst.eval_script is not None
        assert f"git checkout {carried['base_commit']}" in inst.eval_script  # swebench's script, not a generic one
        assert inst.test_files and all(f in inst.eval_script for f in inst.test_files)


def test_the_two_gym_shapes_of_one_instance_agree() -> None:
    anyswe = {r["responses_create_params"]["metadata"]["instance_id"]: r for r in gym_example_rows("anyswe_agent")}
    for row in gym_example_rows("swe_agents"):
        ours = swe_fields(row)
        theirs = swe_fields(anyswe[ours["instance_id"]])
        shared = set(ours) & set(theirs) - {"problem_statement"}
        assert shared >= {"instance_id", "repo", "base_commit", "patch", "test_patch", "FAIL_TO_PASS", "version"}
        assert {k: ours[k] for k in shared} == {k: theirs[k] for k in shared}


def test_a_sif_formatter_finds_the_file_as_gyms_swe_agents_does(tmp_path: Path) -> None:
    """Restated from nemo-gym 0.7.0 ``responses_api_agents/swe_agents/app.py::_find_container`` (unchanged at
    Gym 07d6b0d; its module needs packages Gym does not install, so it is not run here): the id as it is, then
    ``__`` as ``_1776_`` and ``_s_`` (as written, then lower case), then a ``*<id>*.sif`` in the directory."""
    sif = str(tmp_path / "sweb.eval.x86_64.{instance_id}.sif")
    django = str(tmp_path / "sweb.eval.x86_64.django_1776_django-1.sif")
    (tmp_path / "sweb.eval.x86_64.django_1776_django-1.sif").touch()
    (tmp_path / "sweb.eval.x86_64.Django__Django-2.sif").touch()
    (tmp_path / "sweb.eval.x86_64.project-monai_s_monai-3.sif").touch()
    (tmp_path / "other-prefix-sympy__sympy-4-v2.sif").touch()
    assert container_for(sif, "django__django-1") == django
    assert container_for(sif, "Django__Django-2") == str(tmp_path / "sweb.eval.x86_64.Django__Django-2.sif")
    assert container_for(sif, "Project-MONAI__MONAI-3") == str(
        tmp_path / "sweb.eval.x86_64.project-monai_s_monai-3.sif"
    )
    assert container_for(sif, "sympy__sympy-4") == str(tmp_path / "other-prefix-sympy__sympy-4-v2.sif")
    assert container_for(sif, "flask__flask-5") is None
    missing = str(tmp_path / "none" / "{instance_id}.sif")
    assert container_for([missing, sif], "django__django-1") == str(
        tmp_path / "sweb.eval.x86_64.django_1776_django-1.sif"
    )


def test_an_image_formatter_names_the_image_as_anyswe_does() -> None:
    from responses_api_agents.anyswe_agent.app import AnySweAgent

    templates = [GYM_FORMATTER, "registry.local:5000/sweb.eval.x86_64.{instance_id}:v2", "img/{instance_id}"]
    for template in templates:
        for instance_id in ("django__django-11333", "Project-MONAI__MONAI-6969", "plain-1"):
            theirs = AnySweAgent._sandbox_image({"instance_id": instance_id, "container_formatter": template})
            assert container_for(template, instance_id) == theirs, (template, instance_id)


def test_bad_gym_rows_are_one_line_naming_the_row_and_the_field(tmp_path: Path) -> None:
    inst = bundled_instances()[0]
    anyswe = example_row(inst, "a", "anyswe")
    swe_agents = example_row(inst, "a", "swe_agents")

    def with_meta(row: dict[str, Any], **update: Any) -> dict[str, Any]:
        params = row["responses_create_params"]
        return {**row, "responses_create_params": {**params, "metadata": {**params["metadata"], **update}}}

    legacy = {"instance_id": "acme__widget-1", "repo": "acme/widget", "version": "1.0", "base_commit": "a" * 40,
              "test_patch": "", "FAIL_TO_PASS": '["t::a"]', "problem_statement": "p"}  # fmt: skip
    cases: dict[str, tuple[dict[str, Any], dict[str, Any], str]] = {
        "not_json": (with_meta(anyswe, instance_dict="{bad"), {}, "metadata.instance_dict is not JSON"),
        "not_object": (with_meta(anyswe, instance_dict="[1]"), {}, "metadata.instance_dict must be an object"),
        "two_ids": (
            with_meta(swe_agents, instance_id="other__x-1"),
            {},
            f"the row names two instances: instance_id={inst.instance_id!r}, metadata.instance_dict.instance_id=",
        ),
        "no_id": ({"responses_create_params": {"input": "fix"}}, {}, "the row has no instance_id"),
        "no_text": (
            {
                "responses_create_params": {"input": []},
                "instance_id": "x__y-1",
                "image": "i",
                "repo": "x/y",
                "FAIL_TO_PASS": "[]",
            },
            {},
            "x__y-1: no task text",
        ),
        "no_sif": (
            with_meta(anyswe, instance_id="acme__widget-1", instance_dict=json.dumps(legacy)),
            {"container_formatter": str(tmp_path / "{instance_id}.sif")},
            "names no existing file for it",
        ),
        "unknown": (
            with_meta(anyswe, instance_id="acme__widget-1", instance_dict=json.dumps(legacy)),
            {},
            "'acme__widget-1' is not a bundled instance",
        ),
        "no_spec": (
            with_meta(anyswe, instance_id="acme__widget-1", instance_dict=json.dumps(legacy)),
            {"container_formatter": GYM_FORMATTER},
            "no eval_script, and swebench's spec tables give none",
        ),
    }
    for name, (row, kw, needle) in cases.items():
        with pytest.raises(RowError) as caught:
            instance_from_row(row, **kw)
        assert needle in str(caught.value) and "\n" not in str(caught.value), (name, str(caught.value))
        path = tmp_path / f"{name}.jsonl"
        path.write_text("\n" + json.dumps(row) + "\n")  # line 1 blank
        with pytest.raises(RowError, match=f"^{path}:2: "):  # the reader names the file and the line
            load_rows(path, **kw)
