"""Real SWE tasks as SWE-bench 5 publishes them: task directories (examples/tasks/swebench5) built from real
projects' release sdists, each with a real bug fix, graded by `polar grade` in the instance's own image, in docker and
daemonless (bwrap over the image's unpacked rootfs), beside swebench's own harness (``run_instance``) on the same
images: the verdicts must agree on gold, empty and wrong patches, and differ only where the guard undid a hack that
fools swebench's harness (a replaced runner script)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_polar.rewards.datasets import select_instances
from nemo_polar.rewards.grader import GradeResult, grade_many
from nemo_polar.rewards.instance import SWEInstance
from nemo_polar.sandbox.workspace import GIT
from tests.conftest import TASKS, ProxyHandle
from tests.helpers.lanes import lane

pytestmark = pytest.mark.real_image  # the heaviest tests: `pytest -m "not real_image"` leaves them out
TASK_IDS = sorted(d.name for d in (TASKS / "tasks").iterdir() if (d / "task.yaml").exists())


def edit_patch(instance: SWEInstance, tmp_path: Path, path: str, text: str) -> str:
    """The patch that makes ``path`` of the instance's code hold ``text``."""
    tree = tmp_path / "tree"
    shutil.copytree(instance.environment().code("docker"), tree, symlinks=True)
    (tree / path).write_text(text)
    return subprocess.run([*GIT, "diff"], cwd=tree, capture_output=True, text=True, check=True).stdout


def wrong_patch(instance: SWEInstance, tmp_path: Path) -> str:
    """A patch that applies and touches the file the gold patch fixes, without fixing it."""
    from unidiff import PatchSet

    target = next(f.path for f in PatchSet(instance.patch))
    source = (instance.environment().code("docker") / target).read_text()
    return edit_patch(instance, tmp_path, target, source + "\n# a change that fixes nothing\n")


def runner_hack(instance: SWEInstance, tmp_path: Path) -> str:
    """SymPy's runner script replaced by one that prints every graded test as passing (swebench restores only the
    test patch's files, so its own harness is fooled; the guard restores what the test command names)."""
    lines = "".join(f"echo '{name} ok'\n" for name in [*instance.FAIL_TO_PASS, *instance.PASS_TO_PASS])
    return edit_patch(instance, tmp_path, "bin/test", f"#!/bin/sh\n{lines}")


def verdicts(results: list[GradeResult]) -> list[tuple[str, float, bool]]:
    return [(r.status, r.reward, r.mask_sample) for r in results]


def test_task_repo_rows_are_swebench_own(images: dict[str, SWEInstance]) -> None:
    """The rows are what swebench's task-repo reader gives; an image row needs no repo_path."""
    from swebench.task.repo import load_task_repo

    for row in load_task_repo(TASKS):
        ours = images[row["instance_id"]]
        assert ours.eval_script == row["eval_script"] and ours.image == row["image"]
        assert row["FAIL_TO_PASS"] == ours.FAIL_TO_PASS and row["PASS_TO_PASS"] == ours.PASS_TO_PASS
        assert ours.log_parser == row["log_parser"] and ours.repo_path is None
        assert ours.environment().kind == "image"


@pytest.fixture(scope="session")
def patches(images: dict[str, SWEInstance], tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    tmp = tmp_path_factory.mktemp("patches")
    return {i: {"gold": inst.patch, "empty": "", "wrong": wrong_patch(inst, tmp / i)} for i, inst in images.items()}


class Grades:
    """Each task's gold, empty and wrong patch graded once per runtime, when a test first asks (the docker grades are
    shared with swebench's cross-check)."""

    def __init__(self, images: dict[str, SWEInstance], patches: dict[str, dict[str, str]], tmp: Path) -> None:
        self.images, self.patches, self.tmp = images, patches, tmp
        self.done: dict[tuple[str, str], dict[str, GradeResult]] = {}

    def __call__(self, instance_id: str, runtime: str) -> dict[str, GradeResult]:
        if (instance_id, runtime) not in self.done:
            by_name = self.patches[instance_id]
            pairs = [(self.images[instance_id], patch) for patch in by_name.values()]
            results = grade_many(pairs, runtime=runtime, log_dir=self.tmp / f"{runtime}-{instance_id}")
            self.done[instance_id, runtime] = dict(zip(by_name, results, strict=True))
        return self.done[instance_id, runtime]


@pytest.fixture(scope="session")
def grades(
    images: dict[str, SWEInstance], patches: dict[str, dict[str, str]], tmp_path_factory: pytest.TempPathFactory
) -> Grades:
    return Grades(images, patches, tmp_path_factory.mktemp("grade-logs"))


SYMPY = "sympy__sympy-20590"  # SymPy's bin/test: the runner script the hack below replaces
MORE_ITERTOOLS = "more-itertools__more-itertools-866"  # the quickest to grade (its tests: seconds; Django's: ~30 s)
# make test: every runner family in docker (swebench's own runtime), two in bwrap (requests' network-reading tests,
# SymPy's runner script); make test-full: every task in both.
GRADED = lane(
    [(r, i) for r in ("docker", "bwrap") for i in TASK_IDS],
    [*[("docker", i) for i in TASK_IDS], ("bwrap", "psf__requests-cve-2023-32681"), ("bwrap", SYMPY)],
    ids=lambda c: "-".join(c),
)


@pytest.mark.parametrize(("runtime", "instance_id"), GRADED)
def test_gold_empty_and_wrong_patches(grades: Grades, runtime: str, instance_id: str) -> None:
    """Each runner family (pytest, Django's runtests.py, SymPy's bin/test, and requests: a network library whose
    tests read the proxy environment and resolve names) in both runtimes."""
    results = grades(instance_id, runtime)
    gold, empty, wrong = results["gold"], results["empty"], results["wrong"]
    assert verdicts([gold, empty, wrong]) == [
        ("resolved", 1.0, False),
        ("empty_patch", 0.0, False),
        ("unresolved", 0.0, False),
    ], (instance_id, [gold.reason, wrong.reason])
    assert gold.fail_to_pass == 1.0 and gold.pass_to_pass == 1.0, instance_id
    assert wrong.fail_to_pass == 0.0 and wrong.pass_to_pass == 1.0, instance_id
    assert gold.log_path is not None and gold.log_path.is_file()  # the evaluation log is kept
    assert gold.log_path != wrong.log_path


@pytest.mark.parametrize("instance_id", lane(TASK_IDS, [SYMPY]))
def test_swebench_run_instance_agrees(
    images: dict[str, SWEInstance], patches: dict[str, dict[str, str]], grades: Grades, instance_id: str, tmp_path: Path
) -> None:
    """swebench's own harness on the same rows and images: the same verdicts on gold, empty and wrong patches, and
    on SymPy one difference, a runner-script hack that fools it and that the guard undoes."""
    # swebench execs the eval script without a TTY and reads its stdout and stderr as two streams, so under load a
    # runner's last stdout lines can reach its log after the end marker (a set -x trace on stderr) and be graded as
    # missing. Such a run says nothing about the verdict: it is run again, each time under a run id of its own.
    code = """
import json, sys
from pathlib import Path
from swebench.harness.run_evaluation import _docker_client, run_instance
from swebench.harness.utils import make_test_spec
from swebench.task.repo import load_task_repo
rows, preds = load_task_repo(sys.argv[1]), json.loads(sys.argv[2])

def reordered(row, run_id, name):
    log = Path("logs/run_evaluation", run_id, name, row["instance_id"], "test_output.txt").read_text()
    after_end = log.split(">>>>> End Test Output", 1)[-1]
    return any(test in after_end for test in [*row["FAIL_TO_PASS"], *row["PASS_TO_PASS"]])

out = {}
for row in (r for r in rows if r["instance_id"] in preds):
    for name, patch in preds[row["instance_id"]].items():
        pred = {"instance_id": row["instance_id"], "model_name_or_path": name, "model_patch": patch}
        for attempt in range(5):
            run_id = f"polar-xcheck-{attempt}"
            done = run_instance(make_test_spec(row), pred, _docker_client(), run_id, timeout=600)
            if not reordered(row, run_id, name):
                break
        else:
            sys.exit(f"{row['instance_id']}/{name}: every run's log had test lines after its end marker")
        out[row["instance_id"] + "/" + name] = bool(done and done[1][row["instance_id"]]["resolved"])
print(json.dumps(out))
"""
    preds = {instance_id: dict(patches[instance_id])}
    if instance_id == SYMPY:
        assert images[SYMPY].log_parser == "parse_log_sympy"
        preds[SYMPY]["hack"] = runner_hack(images[SYMPY], tmp_path / "hack")
    done = subprocess.run(
        [sys.executable, "-c", code, str(TASKS), json.dumps(preds)], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    if instance_id == SYMPY:
        [guarded] = grade_many([(images[SYMPY], preds[SYMPY]["hack"])], runtime="docker")
        assert theirs.pop(f"{SYMPY}/hack") is True  # swebench restores only the test patch's files: fooled
        assert (guarded.status, guarded.reward) == ("unresolved", 0.0) and "bin/test" in guarded.reverted_paths
    ours = {f"{instance_id}/{name}": r.resolved for name, r in grades(instance_id, "docker").items()}
    assert ours == theirs
    assert theirs[f"{instance_id}/gold"] is True


def test_polar_grade_keeps_every_log(images: dict[str, SWEInstance], tmp_path: Path) -> None:
    inst = images[MORE_ITERTOOLS]
    predictions = tmp_path / "preds.jsonl"
    predictions.write_text(json.dumps({"instance_id": inst.instance_id, "model_patch": inst.patch}) + "\n")
    out = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "nemo_polar.cli", "grade", "--instances", str(TASKS / "tasks" / inst.instance_id)]
    done = subprocess.run([*cmd, "--predictions", str(predictions), "--runtime", "docker", "-o", str(out)])
    assert done.returncode == 0
    [result] = json.loads(out.read_text())["results"]
    assert result["status"] == "resolved"
    assert Path(result["log_path"]) == tmp_path / "report.logs" / f"{inst.instance_id}.eval.log"
    assert ">>>>> Start Test Output" in Path(result["log_path"]).read_text()


def test_published_rows_with_bad_fields_are_named(tmp_path: Path) -> None:
    """Unknown or missing fields of a published row: a clear error naming the row, never a traceback."""
    from swebench.task.repo import load_task

    task = TASKS / "tasks" / TASK_IDS[0]
    row = load_task(task)
    cases = {
        "log_parser": ({**row, "log_parser": "parse_log_nothing"}, "unknown log_parser 'parse_log_nothing'"),
        "eval_type": ({**row, "eval_type": "sometimes"}, "unknown eval_type 'sometimes'"),
        "markers": ({**row, "eval_script": "#!/bin/bash\npytest\n"}, "no '>>>>> Start Test Output' line"),
        "problem": ({k: v for k, v in row.items() if k != "problem_statement"}, "problem_statement"),
    }
    for name, (bad, message) in cases.items():
        path = tmp_path / f"{name}.jsonl"
        path.write_text(json.dumps(bad) + "\n")
        with pytest.raises(ValueError, match=rf"{path}:1: not a valid instance") as caught:
            select_instances(path)
        assert message in str(caught.value), name
    nowhere = SWEInstance.model_validate({**row, "image": None})
    with pytest.raises(ValueError, match=f"{row['instance_id']} has neither an image nor a repo_path"):
        nowhere.environment()
    broken = tmp_path / "tasks" / "broken"
    shutil.copytree(task, broken)
    (broken / "tests.json").unlink()
    with pytest.raises(ValueError, match=f"{broken}: not a SWE-bench task directory"):
        select_instances(tmp_path)


RELATIVE_SEEK_FIX = [
    {"kind": "shell", "command": "echo commits=$(git rev-list --all | wc -l)"},
    {"kind": "read_file", "path": "more_itertools/more.py"},
    {
        "kind": "edit_file",
        "path": "more_itertools/more.py",
        "old": "        index = len(self._cache)\n        self.seek(max(index + count, 0))",
        "new": "        if self._index is None:\n            self._index = len(self._cache)\n"
        "        self.seek(max(self._index + count, 0))",
    },
    {
        "kind": "shell",
        "command": "source /opt/miniconda3/bin/activate && conda activate testbed && "
        "python -m pytest -q tests/test_more.py -k relative_seek 2>&1 | tail -2",
    },
    {"kind": "final", "text": "relative_seek now seeks from the current position, not from the end of the cache."},
]


@pytest.mark.engine
@pytest.mark.parametrize("runtime", ["docker", "bwrap"])
def test_a_real_cli_session_inside_the_instance_image(
    images: dict[str, SWEInstance], proxy: ProxyHandle, runtime: str, tmp_path: Path
) -> None:
    """The unchanged CLI (scripted policy) works in a fresh container of the row's image, in its /testbed, one
    commit deep, running the tests with the image's own environment; its patch is graded in another fresh one."""
    from nemo_polar.env.harness import get_harness
    from nemo_polar.env.runtime.episode import run_episode

    inst = images[MORE_ITERTOOLS]
    inst = inst.model_copy(update={"script": RELATIVE_SEEK_FIX})
    episode = run_episode(
        get_harness("pi"), inst, proxy.client(), tmp_path / "ep", runtime=runtime, scripted=True, timeout=300
    )
    assert episode.session is not None, episode.verdict
    assert episode.session.status == "completed", episode.session.error
    assert episode.session.egress == []
    requests = json.dumps([r.request for r in episode.session.records])
    assert "1 passed" in requests  # the image's own pytest, in the agent's sandbox
    assert "commits=1" in requests  # the workspace is one commit deep: no other history reachable
    assert episode.grade is not None and episode.grade.status == "resolved", episode.grade
    assert episode.reward == 1.0


@pytest.fixture(scope="module")
def more_itertools_sif(
    images: dict[str, SWEInstance], tmp_path_factory: pytest.TempPathFactory
) -> tuple[SWEInstance, str]:
    """The more-itertools image as an Apptainer SIF (tests/sif.py), and the container_formatter that names it the
    way Gym's SWE configs do."""
    from nemo_polar.sandbox.images import image_env, image_rootfs
    from tests.sif import make_sif

    inst = images[MORE_ITERTOOLS]
    rootfs = image_rootfs(inst.image)
    sif_dir = tmp_path_factory.mktemp("sif")
    make_sif(rootfs, sif_dir / "sweb.eval.x86_64.more-itertools_1776_more-itertools-866.sif", image_env(rootfs))
    return inst, str(sif_dir / "sweb.eval.x86_64.{instance_id}.sif")


def anyswe_row(inst: SWEInstance, agent: str) -> dict:
    """Gym's anyswe row of a SWE-bench 5 task: its row (eval script and all, no image) in metadata.instance_dict."""
    from nemo_polar.env.gym.rows import example_row

    row = example_row(inst, agent, "anyswe")
    carried = json.loads(row["responses_create_params"]["metadata"]["instance_dict"])
    carried |= {k: getattr(inst, k) for k in ("eval_script", "log_parser", "eval_type")}
    row["responses_create_params"]["metadata"]["instance_dict"] = json.dumps(carried)
    return row


def test_a_sif_of_a_real_image_named_by_a_gym_row_grades_gold_1_and_empty_0_daemonless(
    more_itertools_sif: tuple[SWEInstance, str], tmp_path: Path
) -> None:
    """The SIF, found by Gym's ``container_formatter`` for an anyswe row of the task (its SWE-bench row in
    ``metadata.instance_dict``, no image): unpacked from the SIF and graded in bwrap."""
    from nemo_polar.rewards.datasets import load_rows

    inst, formatter = more_itertools_sif
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(anyswe_row(inst, "polar_pi_agent")) + "\n")
    [loaded] = load_rows(rows, container_formatter=formatter)
    assert loaded.image == formatter.format(instance_id="more-itertools_1776_more-itertools-866")
    assert loaded.eval_script == inst.eval_script
    gold, empty = grade_many([(loaded, inst.patch), (loaded, "")], runtime="bwrap", log_dir=tmp_path / "logs")
    assert verdicts([gold, empty]) == [("resolved", 1.0, False), ("empty_patch", 0.0, False)], gold.reason
    assert gold.fail_to_pass == 1.0 and gold.pass_to_pass == 1.0


@pytest.mark.engine
def test_the_gym_agent_runs_a_gym_row_of_a_real_task_in_its_sif(
    more_itertools_sif: tuple[SWEInstance, str], proxy: ProxyHandle, tmp_path: Path
) -> None:
    """The Gym agent, configured like Gym's SWE agents (container_formatter naming .sif files), takes an anyswe row
    of the real task: the unchanged CLI works in the SIF's root filesystem (daemonless), and the patch is graded."""
    from fastapi.testclient import TestClient

    from tests.helpers.gym import make_agent

    inst, formatter = more_itertools_sif
    agent = make_agent(
        "polar_pi", proxy_url=proxy.url, proxy_admin_url=proxy.admin_url, proxy_admin_token=proxy.admin_token,
        work_dir=tmp_path, scripted=True, timeout=300, runtime="bwrap", container_formatter=formatter,
    )  # fmt: skip
    row = {**anyswe_row(inst, "polar_pi_agent"), "script": RELATIVE_SEEK_FIX}
    with TestClient(agent.setup_webserver()) as client:
        result = client.post("/run", json=row).json()
    assert (result["reward"], result["mask_sample"], result["grade_status"]) == (1.0, False, "resolved"), result
    assert result["instance_id"] == inst.instance_id and result["session_status"] == "completed"


@pytest.mark.engine
def test_polar_rollout_runs_a_swe_agents_row_of_a_real_task_from_its_sif(
    more_itertools_sif: tuple[SWEInstance, str], proxy: ProxyHandle, engine_url: str, tmp_path: Path, capsys
) -> None:  # type: ignore[no-untyped-def]
    """``polar rollout dataset=gym``: a swe_agents row of the real task (SWE-bench fields at the top level, no
    image), its image found by ``dataset.container_formatter`` as a SIF; the CLI works in the SIF's root filesystem
    and the attempt is graded, reconstructed and written like any dataset run."""
    from nemo_polar.cli import main
    from nemo_polar.env.gym.rows import example_row

    inst, formatter = more_itertools_sif
    row = example_row(inst, "polar_pi_agent", "swe_agents")
    assert "image" not in row and "instance_dict" in row["responses_create_params"]["metadata"]
    row |= {k: getattr(inst, k) for k in ("eval_script", "log_parser", "eval_type")} | {"script": RELATIVE_SEEK_FIX}
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(row) + "\n")
    argv = [
        "rollout", "env=polar_pi", "runtime=bwrap", "dataset=gym", f"dataset.path={rows}",
        f"dataset.container_formatter='{formatter}'",  # quoted: Hydra's grammar reads braces
        "dataset.scripted=true", "n_samples=1", "timeout=300",
        f"proxy.url={proxy.url}", f"proxy.admin_url={proxy.admin_url}", f"proxy.admin_token={proxy.admin_token}",
        f"engine.url={engine_url}", f"out={tmp_path / 'out'}",
    ]  # fmt: skip
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["attempts"], summary["trainable"], summary["resolved"]) == (1, 1, 1), summary
    [result] = [json.loads(x) for x in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert (result["instance_id"], result["reward"]) == (inst.instance_id, 1.0)
    traces = [json.loads(x) for x in (tmp_path / "out" / "traces.jsonl").read_text().splitlines()]
    assert traces and all(t["reward"] == 1.0 for t in traces)
