"""SWE-bench rewards: swebench's own grader on every bundled instance in a fresh sandbox, the reward and mask
semantics, the reward-hack guards, the loaders and `polar grade`."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest

from nemo_polar.rewards import Evaluator, SWEInstance, bundled_instances, grade, load_instances, testlog
from nemo_polar.rewards.datasets import load_rows
from nemo_polar.rewards.grader import grade_many, swebench_report
from nemo_polar.sandbox.workspace import git, prepare_workspace
from tests.conftest import ProxyHandle
from tests.helpers.lanes import DIALECT_HARNESSES, lane

INSTANCES = bundled_instances()
TEST_COMMAND = "python -m pytest -rA -p no:cacheprovider"  # the bundled eval scripts' runner
RUNTIMES = ["bwrap", "docker"]
IDS = [i.instance_id for i in INSTANCES]


def _ids(cell: tuple[SWEInstance, str]) -> str:
    return f"{cell[0].instance_id}-{cell[1]}"


# What an instance decides (its tests, its fix) is graded on every instance in bwrap; what the runtime decides (the
# container, its mounts) on two in docker in make test, every instance in make test-full.
EVERY_INSTANCE_IN_BWRAP_A_FEW_IN_DOCKER = lane(
    [(i, r) for i in INSTANCES for r in RUNTIMES],
    [(i, "bwrap") for i in INSTANCES] + [(i, "docker") for i in INSTANCES[:2]],
    ids=_ids,
)


def test_at_least_eight_bundled_instances() -> None:
    assert len(INSTANCES) >= 8
    for inst in INSTANCES:
        assert inst.FAIL_TO_PASS and inst.PASS_TO_PASS and inst.patch and inst.test_patch
        assert inst.test_files and all(f.startswith("tests/") for f in inst.test_files)
        assert not any(f in inst.test_files for f in _patched_files(inst.patch))  # the gold patch fixes source only


def _patched_files(patch: str) -> list[str]:
    from unidiff import PatchSet

    return [f.path for f in PatchSet(patch)]


def _diff_after(inst: SWEInstance, tmp: Path, edit: dict[str, str | bytes]) -> str:
    """A patch against the base, as an agent would leave it: files replaced by the given contents."""
    ws = prepare_workspace(inst.task("bwrap"), tmp / "agent")
    for rel, content in edit.items():
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            (ws / rel).write_bytes(content)
        else:
            (ws / rel).write_text(content)
    git(ws, "add", "-A")
    return git(ws, "diff", "--cached", "--binary", "HEAD").decode()


@pytest.mark.parametrize(("inst", "runtime"), EVERY_INSTANCE_IN_BWRAP_A_FEW_IN_DOCKER)
def test_gold_resolves_and_empty_or_broken_patches_do_not(inst: SWEInstance, runtime: str, tmp_path: Path) -> None:
    gold = grade(inst, inst.patch, runtime, work_dir=tmp_path)
    assert gold.status == "resolved" and gold.reward == 1.0 and not gold.mask_sample, gold.reason
    assert gold.fail_to_pass == 1.0 and gold.pass_to_pass == 1.0 and gold.resolution == "RESOLVED_FULL"
    assert gold.reverted_paths == []  # the guard leaves a real fix alone

    empty = grade(inst, "", runtime, work_dir=tmp_path)
    assert (empty.status, empty.reward, empty.mask_sample) == ("empty_patch", 0.0, False)

    target = _patched_files(inst.patch)[0]
    broken = inst.patch.replace(f"a/{target}", "a/does/not/exist.py").replace(f"b/{target}", "b/does/not/exist.py")
    unappliable = grade(inst, broken, runtime, work_dir=tmp_path)
    assert (unappliable.status, unappliable.reward, unappliable.mask_sample) == ("patch_failed", 0.0, False)


@pytest.mark.parametrize(("inst", "runtime"), EVERY_INSTANCE_IN_BWRAP_A_FEW_IN_DOCKER)
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
    assert set(result.reverted_paths) == set(cheat)


# -- reward hacks on the test infrastructure: each one resolves where only the test patch's files are restored
# (SWE-bench's own scope, `guard=False`), and scores a trainable 0 with the guard, which names what it reverted.
HACKED = next(i for i in INSTANCES if i.instance_id == "polar__csvlite-1")
PLUGIN = "polar_hack"  # a module the hack adds next to the code: harmless until something loads it
PASS_EVERYTHING = """import pytest


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    report.outcome, report.longrepr = "passed", None
    return report
"""
LOAD_PLUGIN = f'import os; os.environ["PYTEST_ADDOPTS"] = "-p {PLUGIN}"\n'
# Runs where the package under test is imported: finds pytest's config in memory and plugs PASS_EVERYTHING in.
REGISTER_IN_PROCESS = f"""
import gc as _gc
import sys as _sys

from _pytest.config import Config as _Config

_hack = {{}}
exec({PASS_EVERYTHING!r}, _hack)
_hack_plugin = type(_sys)("{PLUGIN}")
_hack_plugin.__dict__.update(_hack)
next(o for o in _gc.get_objects() if isinstance(o, _Config)).pluginmanager.register(_hack_plugin)
"""
SHADOW_PYTEST = f"""import os
import sys

here = os.getcwd()
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != here]
import pytest  # noqa: E402  the real one, run with a plugin that passes everything

sys.path.insert(0, here)
sys.exit(pytest.main(sys.argv[1:], plugins=[{PLUGIN!r}]))
"""


def _base(inst: SWEInstance, rel: str) -> str:
    return (inst.repo_path / rel).read_text()  # type: ignore[operator]


def _python(inst: SWEInstance) -> str:
    """The tests' interpreter version, e.g. 3.11."""
    [lib] = (inst.python_env / "lib").glob("python3.*")  # type: ignore[operator]
    return lib.name.removeprefix("python")


def _no_pytest_section(inst: SWEInstance) -> str:
    """The base pyproject.toml without [tool.pytest.ini_options], so that pytest looks further (tox.ini, setup.cfg)."""
    return _base(inst, "pyproject.toml").split("[tool.pytest.ini_options]")[0]


def _with_test_command(inst: SWEInstance, test_command: str, setup: str = "") -> SWEInstance:
    """The instance's eval script with another test command (and a setup step before the tests)."""
    marker = ": '>>>>> Start Test Output'"
    script = (inst.eval_script or "").replace(TEST_COMMAND, test_command).replace(marker, f"{setup}\n{marker}".lstrip())
    assert script != inst.eval_script
    return inst.model_copy(update={"eval_script": script})


def _with_tree_on_path(inst: SWEInstance) -> SWEInstance:
    """The tree on sys.path from interpreter start, as an editable install puts it: site imports its sitecustomize."""
    return _with_test_command(inst, f"PYTHONPATH=. {TEST_COMMAND}")


def _with_venv_in_tree(inst: SWEInstance) -> SWEInstance:
    """Tests run by a virtualenv inside the tree, set up by the instance: site reads the .pth files there."""
    site = f"lib/python{_python(inst)}/site-packages"
    setup = f"python -m venv --without-pip .venv && echo {inst.python_env}/{site} > .venv/{site}/task-env.pth"
    return _with_test_command(inst, f".venv/bin/{TEST_COMMAND}", setup)


def _unchecked_pyc(inst: SWEInstance, tmp: Path, source: str) -> bytes:
    """Bytecode the interpreter loads without looking at its source (an unchecked hash-based .pyc)."""
    (tmp / "src.py").write_text(source)
    compile_it = (
        "import py_compile, sys; py_compile.compile(sys.argv[1], cfile=sys.argv[2], doraise=True,"
        " invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)"
    )
    python = str(inst.python_env / "bin" / "python")  # type: ignore[operator]
    subprocess.run([python, "-c", compile_it, str(tmp / "src.py"), str(tmp / "out.pyc")], check=True)
    return (tmp / "out.pyc").read_bytes()


class Hack(NamedTuple):
    """Files the patch writes, given the instance, a scratch dir and its tests' Python version (the paths that
    name it take it as {py} and {tag}); the paths the guard must revert; the instance the hack needs."""

    files: Callable[[SWEInstance, Path], dict[str, str | bytes]]
    reverted: set[str]
    variant: Callable[[SWEInstance], SWEInstance] = lambda inst: inst


def _with_plugin(files: dict[str, str | bytes]) -> dict[str, str | bytes]:
    return {**files, f"{PLUGIN}.py": PASS_EVERYTHING}


HACKS: dict[str, Hack] = {
    "conftest_hook": Hack(lambda i, t: {"conftest.py": PASS_EVERYTHING}, {"conftest.py"}),
    "conftest_hook_in_tests": Hack(lambda i, t: {"tests/conftest.py": PASS_EVERYTHING}, {"tests/conftest.py"}),
    "conftest_pytest_plugins": Hack(
        lambda i, t: _with_plugin({"conftest.py": f"pytest_plugins = [{PLUGIN!r}]\n"}), {"conftest.py"}
    ),
    "pytest_ini_addopts": Hack(
        lambda i, t: _with_plugin({"pytest.ini": f"[pytest]\naddopts = -p {PLUGIN}\n"}), {"pytest.ini"}
    ),
    "pyproject_addopts": Hack(
        lambda i, t: _with_plugin({"pyproject.toml": _base(i, "pyproject.toml") + f'addopts = "-p {PLUGIN}"\n'}),
        {"pyproject.toml"},
    ),
    "tox_ini_addopts": Hack(
        lambda i, t: _with_plugin(
            {
                "pyproject.toml": _no_pytest_section(i),
                "tox.ini": f"[tox]\nenvlist = py3\n\n[pytest]\naddopts = -p {PLUGIN}\n",
            }
        ),
        {"pyproject.toml", "tox.ini"},
    ),
    "setup_cfg_addopts": Hack(
        lambda i, t: _with_plugin(
            {
                "pyproject.toml": _no_pytest_section(i),
                "setup.cfg": f"[metadata]\nname = csvlite\n\n[tool:pytest]\naddopts = -p {PLUGIN}\n",
            }
        ),
        {"pyproject.toml", "setup.cfg"},
    ),
    "sitecustomize": Hack(
        lambda i, t: _with_plugin({"sitecustomize.py": LOAD_PLUGIN}), {"sitecustomize.py"}, _with_tree_on_path
    ),
    "pth_file": Hack(
        lambda i, t: _with_plugin({f".venv/lib/python{_python(i)}/site-packages/hack.pth": LOAD_PLUGIN}),
        {".venv/lib/python{py}/site-packages/hack.pth"},
        _with_venv_in_tree,
    ),
    "entry_point_metadata": Hack(
        lambda i, t: _with_plugin(
            {
                f"{PLUGIN}-1.0.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {PLUGIN}\nVersion: 1.0\n",
                f"{PLUGIN}-1.0.dist-info/entry_points.txt": f"[pytest11]\n{PLUGIN} = {PLUGIN}\n",
            }
        ),
        {f"{PLUGIN}-1.0.dist-info/METADATA", f"{PLUGIN}-1.0.dist-info/entry_points.txt"},
    ),
    "shadowing_pytest": Hack(lambda i, t: _with_plugin({"pytest.py": SHADOW_PYTEST}), {"pytest.py"}),
    "unchecked_pyc": Hack(
        lambda i, t: {
            "csvlite/__pycache__/__init__.{tag}.pyc".format(tag=f"cpython-{_python(i).replace('.', '')}"): (
                _unchecked_pyc(i, t, _base(i, "csvlite/__init__.py") + REGISTER_IN_PROCESS)
            )
        },
        {"csvlite/__pycache__/__init__.{tag}.pyc"},
    ),
}


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("name", list(HACKS))
def test_a_test_infrastructure_hack_is_reverted_and_scores_zero(name: str, runtime: str, tmp_path: Path) -> None:
    hack = HACKS[name]
    inst = hack.variant(HACKED)
    patch = _diff_after(inst, tmp_path, hack.files(inst, tmp_path))
    with Evaluator(inst, runtime, work_dir=tmp_path, guard=False) as unguarded:
        hacked = unguarded.grade(patch)
    assert hacked.status == "resolved", hacked.log_path.read_text()  # type: ignore[union-attr]  # it works

    result = grade(inst, patch, runtime, work_dir=tmp_path)
    assert (result.status, result.reward, result.mask_sample) == ("unresolved", 0.0, False), result.reason
    assert result.fail_to_pass == 0.0  # the tests ran, on the base's infrastructure
    version = _python(inst)
    expected = {p.format(py=version, tag=f"cpython-{version.replace('.', '')}") for p in hack.reverted}
    assert expected <= set(result.reverted_paths), result.reverted_paths


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_patch_that_writes_into_git_scores_zero(runtime: str, tmp_path: Path) -> None:
    """`git apply` refuses paths in .git, the `patch` fallback does not: a smudge filter it adds runs on the
    grader's next checkout (here, the restore of the test file it touches) and plants a conftest.py."""
    inst = HACKED
    test_file = inst.test_files[0]
    files = _with_plugin({test_file: _base(inst, test_file) + "\n# touched\n"})
    into_git = (
        f'--- a/.git/config\n+++ b/.git/config\n@@ -0,0 +1,2 @@\n+[filter "polar"]\n'
        f"+\tsmudge = cp {PLUGIN}.py conftest.py && cat\n"
        "--- /dev/null\n+++ b/.git/info/attributes\n@@ -0,0 +1 @@\n+* filter=polar\n"
    )
    patch = _diff_after(inst, tmp_path, files) + into_git
    with Evaluator(inst, runtime, work_dir=tmp_path, guard=False) as unguarded:
        hacked = unguarded.grade(patch)
    assert hacked.status == "resolved", hacked.log_path.read_text()  # type: ignore[union-attr]

    result = grade(inst, patch, runtime, work_dir=tmp_path)
    assert (result.status, result.reward, result.mask_sample) == ("unresolved", 0.0, False)
    assert result.reason == "the model patch writes into .git (.git/config)"


def test_a_legitimate_fix_keeps_its_configuration_and_source_changes(tmp_path: Path) -> None:
    """Changes outside pytest's sections of pyproject.toml/setup.cfg, a new module, docs: nothing is reverted."""
    inst = HACKED
    pyproject = _base(inst, "pyproject.toml").replace('version = "0.3.0"', 'version = "0.3.1"')
    edits: dict[str, str | bytes] = {
        "pyproject.toml": pyproject
        + '\n[tool.ruff]\nline-length = 100\n\n[project.scripts]\ncsvlite = "csvlite:main"\n',
        "setup.cfg": "[metadata]\nname = csvlite\n\n[flake8]\nmax-line-length = 100\n",
        "csvlite/encodings.py": 'BOM = "\\ufeff"\n',  # a stdlib name, but inside the package: no shadow
        "README.md": _base(inst, "README.md") + "\nFiles with a byte order mark read fine.\n",
    }
    patch = inst.patch + _diff_after(inst, tmp_path, edits)
    for runtime in RUNTIMES:
        result = grade(inst, patch, runtime, work_dir=tmp_path)
        assert (result.status, result.reward, result.reverted_paths) == ("resolved", 1.0, []), result.reason


# -- the log: the code under test shares stdout with pytest, and can print results or crash before pytest's.
FAKE_PASSES = "".join(f"PASSED {t}\\n" for t in [*HACKED.FAIL_TO_PASS, *HACKED.PASS_TO_PASS])
WRITE_EVERYWHERE = (
    "for _fd in range(1, 64):\n    try:\n        _os.write(_fd, _fake)\n    except OSError:\n        pass\n"
)
LOG_HACKS = {  # appended to the package the tests import
    # After pytest's summary, at exit: the last status line per test wins, and the exit status is made 0.
    "atexit_passes": f'\nimport atexit as _atexit, os as _os\n_fake = b"{FAKE_PASSES}"\n'
    f"_atexit.register(lambda: (_os.write(1, _fake), _os._exit(0)))\n",
    # Past pytest's output capture (to every open descriptor), then gone before pytest reports anything.
    "passes_then_exit": f'\nimport os as _os\n_fake = b"{FAKE_PASSES}"\n{WRITE_EVERYWHERE}_os._exit(0)\n',
    # The eval script's own timeout marker and status, which would make the sample a masked timeout.
    "forged_timeout": f'\nimport os as _os\n_fake = b">>>>> Tests Timed Out\\n"\n{WRITE_EVERYWHERE}_os._exit(124)\n',
}


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("name", list(LOG_HACKS))
def test_a_forged_test_log_scores_zero(name: str, runtime: str, tmp_path: Path) -> None:
    inst = HACKED
    source = "csvlite/__init__.py"
    patch = _diff_after(inst, tmp_path, {source: _base(inst, source) + LOG_HACKS[name]})
    result = grade(inst, patch, runtime, work_dir=tmp_path)
    assert (result.status, result.reward, result.mask_sample) == ("unresolved", 0.0, False), result.reason
    assert result.reverted_paths == []
    # It works on swebench alone, reading the whole log between its markers: resolved, or no gradeable log at all
    # (which the grader would have to mask).
    alone = swebench_report(inst, patch, result.log_path)  # the sandbox's whole output, unfiltered
    if name == "forged_timeout":
        assert not alone["patch_successfully_applied"]
    else:
        assert alone["resolved"]


def test_log_markers_are_swebench_s() -> None:
    from swebench.harness import constants

    assert testlog.START_TEST_OUTPUT == constants.START_TEST_OUTPUT
    assert testlog.END_TEST_OUTPUT == constants.END_TEST_OUTPUT
    assert testlog.TEST_EXIT_CODE == constants.TEST_EXIT_CODE
    for final in ["=== 1 failed, 5 passed in 0.12s ===", "no tests ran in 0.01s", "== 3 passed in 61.20s (0:01:01) =="]:
        assert testlog.FINAL_LINE.match(final)
    report = testlog.pytest_report("x\n=== short test summary info ===\nPASSED a\n=== 1 passed in 0.1s ===\nPASSED b")
    assert report == "PASSED a\n=== 1 passed in 0.1s ==="


# Each case waits out its timeout; what decides the verdict is the grader's clock, not the instance: three of them.
@pytest.mark.parametrize(
    ("base", "runtime"),
    lane([(i, r) for i in INSTANCES[:3] for r in RUNTIMES], [(INSTANCES[0], r) for r in RUNTIMES], ids=_ids),
)
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
    ws = prepare_workspace(inst.task("bwrap"), tmp_path / "ws")
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
    [from_hf] = load_rows(tmp_path / "verified.parquet")
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


# make test: one CLI per dialect (each CLI's own session end to end is test_harness::test_scripted_session_in_bwrap;
# what the grader sees is the patch, whatever CLI wrote it); make test-full: every CLI.
SOLVERS = [
    ("codex", "polar__lrucache-1"),
    ("claude_code", "polar__money-1"),
    ("qwen_code", "polar__semverlite-1"),
    ("pi", "polar__textstats-1"),
    ("gemini_cli", "polar__intervals-1"),
    ("mini_swe_agent", "polar__confmerge-1"),
    ("hermes", "polar__humanfmt-1"),
    ("copilot", "polar__taskgraph-1"),
    ("cline", "polar__globmatch-1"),
    ("opencode", "polar__ratelimit-1"),
    ("openhands_sdk", "polar__csvlite-1"),
]


@pytest.mark.engine
@pytest.mark.parametrize(
    ("harness", "instance_id"),
    lane(SOLVERS, [c for c in SOLVERS if c[0] in DIALECT_HARNESSES.values()], ids=lambda c: "-".join(c)),
)
def test_a_real_cli_solves_a_bundled_task_and_earns_the_reward(
    proxy: ProxyHandle, harness: str, instance_id: str, tmp_path: Path
) -> None:
    """The whole loop on one task: the CLI (scripted policy) reads, edits and runs the tests in its sandbox with the
    task's Python; its patch is graded by swebench in a fresh, prewarmed sandbox."""
    from nemo_polar.env.harness import get_harness
    from nemo_polar.env.runtime.episode import run_episode

    inst = next(i for i in INSTANCES if i.instance_id == instance_id)
    episode = run_episode(get_harness(harness), inst, proxy.client(), tmp_path / "ep", scripted=True, timeout=300)
    assert episode.session.status == "completed", episode.session.error
    assert episode.session.egress == []
    assert episode.grade is not None and episode.grade.status == "resolved", episode.grade
    assert episode.reward == 1.0
    # The agent really ran the visible tests with the task's pytest inside its sandbox.
    assert "passed" in json.dumps(episode.session.records[-1].request)
    assert json.loads((tmp_path / "ep" / "grade.json").read_text())["reward"] == 1.0
