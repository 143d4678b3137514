"""Task workspaces: a fresh git checkout with a single base commit, and the patch a harness left in it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from pydantic import BaseModel, Field

GIT = ["git", "-c", "user.name=polar", "-c", "user.email=polar@localhost", "-c", "init.defaultBranch=main"]


class Task(BaseModel):
    """What a harness session works on. The SWE-bench instance model extends this with grading fields."""

    instance_id: str
    problem_statement: str
    repo: Path = Field(description="a local directory or git repository holding the code")
    base_commit: str | None = Field(default=None, description="checked out when repo is a git repository")
    whole_tree: bool = Field(
        default=False, description="copy the tree as it is (build outputs, untracked files) rather than a commit"
    )


def git(cwd: Path, *args: str, input: bytes | None = None) -> bytes:
    done = subprocess.run([*GIT, *args], cwd=cwd, input=input, capture_output=True)
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed in {cwd}: {done.stderr.decode(errors='replace')[-1000:]}")
    return done.stdout


def prepare_workspace(task: Task, dest: Path) -> Path:
    """Copy the task's tree at its base commit into ``dest`` as a new one-commit repository, so no other commit
    (the fix, future history) is reachable from the agent's workspace."""
    if not task.repo.is_dir():
        raise FileNotFoundError(f"task {task.instance_id}: repository {task.repo} does not exist")
    dest.mkdir(parents=True, exist_ok=True)
    if (task.repo / ".git").exists() and not task.whole_tree:
        tree = git(task.repo, "archive", "--format=tar", task.base_commit or "HEAD")
        subprocess.run(["tar", "-x", "-C", str(dest)], input=tree, check=True)
    else:  # never the history: the top-level .git stays behind
        shutil.copytree(task.repo, dest, symlinks=True, dirs_exist_ok=True, ignore=_top_level_git(task.repo))
    git(dest, "init", "-q")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "--allow-empty", "-m", f"base for {task.instance_id}")
    return dest


def _top_level_git(root: Path):  # shutil's ignore callable
    return lambda directory, names: [".git"] if Path(directory) == root else []


def extract_patch(workspace: Path, excludes: tuple[str, ...]) -> str:
    """``git add -A && git diff --cached --binary`` against the base, minus harness, cache and env paths."""
    git(workspace, "add", "-A")
    specs = [f":(exclude,glob)**/{p}" for p in excludes] + [f":(exclude,glob)**/{p}/**" for p in excludes]
    return git(workspace, "diff", "--cached", "--binary", "HEAD", "--", ".", *specs).decode("utf-8", "replace")
