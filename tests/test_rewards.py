"""SWE-bench rewards: swebench's own grader on every bundled instance in a fresh sandbox, the reward and mask
semantics, the reward-hack guards, the loaders and `polar grade`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from nemo_polar.env.workspace import git, prepare_workspace
from nemo_polar.rewards import SWEInstance, bundled_instances, grade, load_instances
from nemo_polar.rewards.grader import grade_many
from nemo_polar.rewards.instance import load_hf
from tests.conftest import ProxyHandle

INSTANCES = bundled_instances()
RUNTIMES = ["bwrap", "docker"]
IDS = [i.instance_id for i in INSTANCES]


def test_at_least_eight_bundled_instances() -> None:
    assert len(INSTANCES) >= 8
    for inst in INSTANCES:
        assert inst.FAIL_TO_PASS and inst.PASS_TO_PASS and inst.patch and inst.test_patch
        assert inst.test_files and all(f.startswith("tests/") for f in inst.test_files)
        assert not any(f in inst.test_files for f in _patched_files(inst.patch))  # the gold patch fixes source only


def _patched_files(patch: str) -> list[str]:
    from unidiff import PatchSet

    return [f.path for f in PatchSet(patch)]


def _diff_after(inst: SWEInstance, tmp: Path, edit: dict[str, str]) -> str:
    """A patch against the base, as an agent would leave it: files replaced by the given contents."""
    ws = prepare_workspace(inst.task(), tmp / "agent")
    for rel, text in edit.items():
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(text)
    git(ws, "add", "-A")
    return git(ws, "diff", "--cached", "--binary", "HEAD").decode()


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("inst", INSTANCES, ids=IDS)
def test_gold_resolves_and_empty_or_broken_patches_do_not(inst: SWEInstance, runtime: str, tmp_path: Path) -> None:
    gold = grade(inst, inst.patch, runtime, work_dir=tmp_path)
    assert gold.status == "resolved" and gold.reward == 1.0 and not gold.mask_sample, gold.reason
    assert gold.fail_to_pass == 1.0 and gold.pass_to_pass == 1.0 and gold.resolution == "RESOLVED_FULL"

    empty = grade(inst, "", runtime, work_dir=tmp_path)
    assert (empty.status, empty.reward, empty.mask_sample) == ("empty_patch", 0.0, False)

    target = _patched_files(inst.patch)[0]
    broken = inst.patch.replace(f"a/{target}", "a/does/not/exist.py").replace(f"b/{target}", "b/does/not/exist.py")
    unappliable = grade(inst, broken, runtime, work_dir=tmp_path)
    assert (unappliable.status, unappliable.reward, unappliable.mask_sample) == ("patch_failed", 0.0, False)


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("inst", INSTANCES, ids=IDS)
def test_a_patch_that_rewrites_the_tests_scores_zero(inst: SWEInstance, runtime: str, tmp_path: Path) -> None:
    """The agent 'fixes' the failing tests instead of the code: every FAIL_TO_PASS test replaced by a pass, in
    the test files the instance's tests live in. The grader restores those files and re-applies the test patch."""
    cheat: dict[str, str] = {}
    for test_id in inst.FAIL_TO_PASS:
        path, name = test_id.split("::")[0], test_id.split("::")[-1].split("[")[0]
        cheat[path] = cheat.get(path, "") + f"\n\ndef {name}():\n    assert True\n"
    result = grade(inst, _diff_after(inst, tmp_path, cheat), runtime, work_dir=tmp_path)
    assert (result.status, result.reward, result.mask_sample) == ("unresolved", 0.0, False)
    assert result.fail_to_pass == 0.0


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("base", INSTANCES, ids=IDS)
def test_test_suite_timeout_is_masked(base: SWEInstance, runtime: str, tmp_path: Path) -> None:
    inst = base.model_copy(update={"test_timeout_s": 3.0})
    source = _patched_files(inst.patch)[0]
    original = (inst.repo_path / source).read_text()  # type: ignore[operator]
    hang = _diff_after(inst, tmp_path, {source: original + "\nimport time\n\ntime.sleep(60)\n"})
    result = grade(inst, hang, runtime, work_dir=tmp_path)
    assert result.status == "tests_timeout" and result.mask_sample and result.reward == 0.0
    assert "3 s" in (result.reason or "")


def test_missing_python_env_is_an_error_not_a_reward(tmp_path: Path) -> None:
    inst = INSTANCES[0].model_copy(update={"python_env": tmp_path / "no-env"})
    with pytest.raises(FileNotFoundError, match="make setup"):
        grade(inst, inst.patch, work_dir=tmp_path)


@pytest.mark.parametrize("inst", INSTANCES, ids=IDS)
def test_agent_workspace_holds_no_fix_tests_or_history(inst: SWEInstance, tmp_path: Path) -> None:
    ws = prepare_workspace(inst.task(), tmp_path / "ws")
    log = subprocess.run(["git", "log", "--all", "--format=%H"], cwd=ws, capture_output=True, text=True).stdout
    assert len(log.split()) == 1  # the base only: no future commits, no gold commit
    text = "\n".join(p.read_text(errors="replace") for p in ws.rglob("*") if p.is_file() and ".git" not in p.parts)
    for test_id in inst.FAIL_TO_PASS:
        assert f"def {test_id.split('::')[-1].split('[')[0]}(" not in text  # the hidden tests are not there
    git(ws, "apply", "--check", input=inst.patch.encode())  # nor is the fix: the gold patch still applies


def test_loaders_accept_swebench_rows_and_name_bad_ones(tmp_path: Path) -> None:
    inst = INSTANCES[0]
    row = inst.model_dump(mode="json", exclude={"python_env", "script"})
    row["FAIL_TO_PASS"] = json.dumps(row["FAIL_TO_PASS"])  # as in the Hugging Face datasets
    row["PASS_TO_PASS"] = json.dumps(row["PASS_TO_PASS"])
    path = tmp_path / "instances.jsonl"
    path.write_text(json.dumps(row) + "\n")
    [loaded] = load_instances(path)
    assert loaded.FAIL_TO_PASS == inst.FAIL_TO_PASS and loaded.repo_path == inst.repo_path

    import datasets

    datasets.Dataset.from_list([row]).to_parquet(str(tmp_path / "verified.parquet"))
    [from_hf] = load_hf(tmp_path / "verified.parquet")
    assert from_hf.PASS_TO_PASS == inst.PASS_TO_PASS and from_hf.test_patch == inst.test_patch

    path.write_text(json.dumps(row) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"instances.jsonl:2: not JSON"):
        load_instances(path)
    path.write_text(json.dumps({"instance_id": "x"}) + "\n")
    with pytest.raises(ValueError, match=r"instances.jsonl:1: not a valid instance"):
        load_instances(path)


def test_prewarmed_grading_gives_the_same_results(tmp_path: Path) -> None:
    pairs = [(inst, inst.patch) for inst in INSTANCES[:3]] + [(INSTANCES[0], "")]
    warm = grade_many(pairs, work_dir=tmp_path, prewarm=True)
    cold = grade_many(pairs, work_dir=tmp_path, prewarm=False)
    assert [r.status for r in warm] == [r.status for r in cold] == ["resolved"] * 3 + ["empty_patch"]


def test_polar_grade_cli(tmp_path: Path) -> None:
    from nemo_polar.cli import main

    preds = tmp_path / "preds.jsonl"
    rows = [{"instance_id": i.instance_id, "model_patch": i.patch} for i in INSTANCES]
    rows += [{"instance_id": INSTANCES[0].instance_id, "model_patch": ""}]
    preds.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["grade", "--instances", "bundled", "--predictions", str(preds), "-o", str(tmp_path / "r.json")]) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["summary"]["resolved"] == len(INSTANCES)
    assert report["summary"]["by_status"] == {"resolved": len(INSTANCES), "empty_patch": 1}
    assert [r["reward"] for r in report["results"]] == [1.0] * len(INSTANCES) + [0.0]

    preds.write_text(json.dumps({"instance_id": "nope__nope-1", "model_patch": "x"}) + "\n")
    with pytest.raises(SystemExit, match="unknown instances: nope__nope-1"):
        main(["grade", "--instances", "bundled", "--predictions", str(preds), "-o", str(tmp_path / "r.json")])


@pytest.mark.engine
@pytest.mark.parametrize(
    ("harness", "instance_id"),
    [
        ("codex", "polar__lrucache-1"),
        ("claude_code", "polar__money-1"),
        ("qwen_code", "polar__semverlite-1"),
        ("pi", "polar__textstats-1"),
    ],
)
def test_a_real_cli_solves_a_bundled_task_and_earns_the_reward(
    proxy: ProxyHandle, harness: str, instance_id: str, tmp_path: Path
) -> None:
    """The whole loop on one task: the CLI (scripted policy) reads, edits and runs the tests in its sandbox with the
    task's Python; its patch is graded by swebench in a fresh, prewarmed sandbox."""
    from nemo_polar.env.episode import run_episode
    from nemo_polar.env.harness import get_harness
    from nemo_polar.env.session import ProxyClient

    inst = next(i for i in INSTANCES if i.instance_id == instance_id)
    episode = run_episode(
        get_harness(harness), inst, ProxyClient(url=proxy.url), tmp_path / "ep", scripted=True, timeout=300
    )
    assert episode.session.status == "completed", episode.session.error
    assert episode.session.egress == []
    assert episode.grade is not None and episode.grade.status == "resolved", episode.grade
    assert episode.reward == 1.0
    # The agent really ran the visible tests with the task's pytest inside its sandbox.
    assert "passed" in json.dumps(episode.session.records[-1].request)
    assert json.loads((tmp_path / "ep" / "grade.json").read_text())["reward"] == 1.0
