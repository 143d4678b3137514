"""Grading guard: undo what a model patch did to the test infrastructure, as the test files already are.

eval.sh runs it inside the evaluation sandbox with the sandbox's python3, standard library only, in two steps:

    python3 -I guard.py snapshot STATE          before the model patch: the tree, .git and importable names
    python3 -I -S guard.py revert STATE ...     after it, before the test patch: revert what must not change

Changes are found by comparing every path's lstat() with the snapshot, ignored files included; neither git,
.gitignore nor .gitattributes is consulted, so nothing the patch adds can hide a change. ``revert`` runs with
``-I -S``: no site, no .pth, no sitecustomize, nothing from the working tree can run in it. A reverted path is
checked out from HEAD if git tracked it, copied back if it was an untracked base file, else deleted; each is
printed as ``TAG reverted {"path": ..., "reason": ...}``. A patch that wrote into .git (``patch`` does not refuse
it; a core.fsmonitor there would run on the grader's next git call) is reported as ``TAG git_tampered {...}``,
exit status 2, and nothing else is done. ``--tests-only`` is SWE-bench's own scope: the test patch's files only.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import json
import os
import posixpath
import re
import shlex
import shutil
import stat
import subprocess
import sys

GIT = ["git", "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false"]
COPY_LIMIT = 1 << 20  # untracked base files worth restoring are small text files

# Files pytest reads as configuration whatever they hold.
PYTEST_CONFIGS = {"pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml", ".coveragerc"}
# Files with other uses too: reverted only when their pytest/coverage sections or pytest11 entry points differ.
SECTIONED_CONFIGS = {"pyproject.toml", "setup.cfg", "tox.ini"}
# Imported by `site` at interpreter start from anywhere on sys.path (an editable install puts the tree there).
STARTUP_MODULES = {"sitecustomize", "usercustomize"}
# Loaded without (or instead of) their source: an unchecked-hash .pyc, an extension module next to a .py.
COMPILED_SUFFIXES = (".pyc", ".pyo", ".so", ".pyd")
# A *.dist-info on sys.path (the tree is, under `python -m pytest`) declares pytest11 plugins pytest autoloads.
METADATA_SUFFIXES = (".dist-info", ".egg-info", ".egg-link")
GIT_FILES = {".gitattributes", ".gitmodules"}
TEST_DIRS = {"test", "tests"}
SECTION_WORDS = re.compile(r"pytest|coverage", re.IGNORECASE)


# -- the tree ---------------------------------------------------------------------------------------------------
def scan(root: str, top: str = "") -> tuple[dict[str, list[int]], set[str]]:
    """Every non-directory path under ``root/top`` (symlinks not followed) -> its fingerprint, and the directories.
    The top-level .git is left out of a scan of the tree (it is checked on its own)."""
    files: dict[str, list[int]] = {}
    dirs: set[str] = set()
    stack = [top]
    while stack:
        rel = stack.pop()
        with os.scandir(os.path.join(root, rel) if rel else root) as entries:
            for entry in entries:
                path = f"{rel}/{entry.name}" if rel else entry.name
                if path == ".git" and not top:
                    continue
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    dirs.add(path)
                    stack.append(path)
                else:  # a rewrite always changes ctime and inode: the patch tools write a new file
                    files[path] = [st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
    return files, dirs


def scan_git(root: str) -> dict[str, list[int]]:
    path = os.path.join(root, ".git")
    if not os.path.isdir(path) or os.path.islink(path):
        st = os.lstat(path)
        return {".git": [st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]}
    files, dirs = scan(root, ".git")
    return {**files, **{d + "/": [] for d in dirs}}


def git(*args: str, stdin: bytes | None = None) -> bytes:
    return subprocess.run([*GIT, *args], input=stdin, capture_output=True, check=True).stdout


def head_text(path: str) -> str | None:
    done = subprocess.run([*GIT, "cat-file", "blob", f"HEAD:{path}"], capture_output=True)
    return done.stdout.decode("utf-8", "replace") if done.returncode == 0 else None


def read_text(path: str) -> str | None:
    try:
        with open(path, "rb") as fh:
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return None


def module_names(tree: str) -> list[str]:
    """Top-level modules this interpreter finds outside the tree: builtins, stdlib, installed packages."""
    tree = os.path.realpath(tree)
    names = set(sys.builtin_module_names) | set(getattr(sys, "stdlib_module_names", ()))
    suffixes = tuple(importlib.machinery.all_suffixes())
    for entry in sys.path:
        real = os.path.realpath(entry or ".")
        if real == tree or real.startswith(tree + os.sep) or not os.path.isdir(real):
            continue
        for name in os.listdir(real):  # packages (namespace ones too) and modules
            full = os.path.join(real, name)
            if (name.isidentifier() and os.path.isdir(full)) or name.endswith(suffixes):
                names.add(name.split(".")[0])
    return sorted(names)


def importable_names(tree: str) -> list[str]:
    """The module names of the tests' interpreters (``python3`` and ``python`` on PATH), asked before the model
    patch, so no code from the patch can answer."""
    names = set(module_names(tree))
    seen = {(os.path.dirname(os.path.abspath(sys.executable)), os.path.realpath(sys.executable))}
    for exe in filter(None, [shutil.which("python3"), shutil.which("python")]):
        env = (os.path.dirname(os.path.abspath(exe)), os.path.realpath(exe))  # a venv is its bin/, not its binary
        if env not in seen:
            seen.add(env)
            done = subprocess.run([exe, "-I", os.path.abspath(__file__), "names", tree], capture_output=True, text=True)
            names.update(json.loads(done.stdout) if done.returncode == 0 else [])
    return sorted(names)


# -- what counts as test infrastructure -------------------------------------------------------------------------
def infra_by_name(path: str) -> str | None:
    """The reason a path is test infrastructure by its name alone, or None."""
    parts = path.split("/")
    name = parts[-1]
    if ".git" in parts or name in GIT_FILES:
        return "git metadata"
    if name == "conftest.py":
        return "pytest conftest"
    if name in PYTEST_CONFIGS:
        return "pytest configuration"
    if name.endswith(".pth") or any(p.split(".")[0] in STARTUP_MODULES for p in parts):
        return "interpreter startup hook"
    if any(p.endswith(METADATA_SUFFIXES) for p in parts):
        return "package metadata (entry points)"
    if ".pytest_cache" in parts:
        return "pytest cache"
    if "__pycache__" in parts or name.endswith(COMPILED_SUFFIXES):
        return "compiled code"
    return None


def test_sections(name: str, text: str | None) -> object:
    """What of a pyproject.toml / setup.cfg / tox.ini pytest (or coverage) reads; an absent file reads as empty."""
    text = text or ""
    if name == "pyproject.toml":
        try:
            import tomllib
        except ImportError:  # Python < 3.11: compare the whole file
            return text
        try:
            data = tomllib.loads(text)
        except ValueError:
            return text
        tool, project = data.get("tool", {}), data.get("project", {})
        entry_points = project.get("entry-points", {}) if isinstance(project, dict) else {}
        if not isinstance(tool, dict) or not isinstance(entry_points, dict):
            return text
        return [tool.get("pytest"), tool.get("coverage"), entry_points.get("pytest11")]
    # INI: a section starts at a line beginning with "[" (as for pytest's iniconfig); keep the relevant ones whole.
    sections: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("["):
            sections.append([line.strip()])
        elif sections:
            sections[-1].append(line.rstrip())
    return [s for s in sections if SECTION_WORDS.search(s[0]) or any("pytest11" in line for line in s)]


class Rules:
    """Which changed paths the model patch may not keep."""

    def __init__(
        self,
        root: str,
        names: set[str],
        test_files: set[str],
        targets: list[str],
        runner: set[str],
        untracked_copies: dict[str, str],
        infra: bool,
    ) -> None:
        self.root, self.names, self.infra, self.copies = root, names, infra, untracked_copies
        self.test_roots = test_roots(targets) if infra else set()
        self.test_files = test_files | ({t for t in targets if looks_like_test(t, self.test_roots)} if infra else set())
        self.runner = runner if infra else set()

    def reason(self, path: str, new: bool) -> str | None:
        by_name = infra_by_name(path) if self.infra else None
        if by_name:
            return by_name
        if path in self.test_files or any(path == r or path.startswith(r + "/") for r in self.test_roots):
            return "test file"
        if path in self.runner:
            return "named by the test command"
        if not self.infra:
            return None
        name = path.rsplit("/", 1)[-1]
        if name in SECTIONED_CONFIGS and self._sections_differ(path, name):
            return f"pytest section of {name}"
        shadowed = self._shadowed(path) if new else None
        return f"shadows the module {shadowed}" if shadowed else None

    def _sections_differ(self, path: str, name: str) -> bool:
        base = head_text(path) if path not in self.copies else read_text(self.copies[path])
        return test_sections(name, base) != test_sections(name, read_text(os.path.join(self.root, path)))

    def _shadowed(self, path: str) -> str | None:
        """The installed or stdlib module a new module takes the place of: ``python -m pytest`` puts the tree's
        root first on sys.path, pytest's rootdir insertion any directory that is not a package."""
        parts = path.split("/")
        link = os.path.islink(os.path.join(self.root, path))  # e.g. pytest -> some other package's directory
        if not parts[-1].endswith(".py") and not link:  # compiled modules are reverted anyway
            return None
        module, where = parts[-1].split(".")[0], parts[:-1]
        if module == "__init__":
            if not where:
                return None
            module, where = where[-1], where[:-1]
        if module not in self.names:
            return None
        top = not where or not os.path.exists(os.path.join(self.root, *where, "__init__.py"))
        return module if top else None


def test_roots(targets: list[str]) -> set[str]:
    """The test directories the graded test files live in: the outermost ``tests``/``test`` above each, else its
    own directory when named ``test*``. SWE-bench counts everything there as test code, never as the fix."""
    roots: set[str] = set()
    for target in targets:
        dirs = target.split("/")[:-1]
        hit = next((i for i, d in enumerate(dirs) if d in TEST_DIRS), None)
        if hit is not None:
            roots.add("/".join(dirs[: hit + 1]))
        elif dirs and dirs[-1].startswith("test"):
            roots.add("/".join(dirs))
    return roots


def command_paths(command: str) -> set[str]:
    """Relative paths a shell command names (a runner script such as ``bin/test``, an in-tree interpreter)."""
    try:
        words = shlex.split(command)
    except ValueError:
        return set()
    paths = {posixpath.normpath(w) for w in words if not w.startswith(("-", "/")) and "=" not in w}
    return {p for p in paths if p != "." and not p.startswith("../")}


def looks_like_test(path: str, roots: set[str]) -> bool:
    """A FAIL_TO_PASS/PASS_TO_PASS file that is test code (a doctest target in a source module is not)."""
    name = path.rsplit("/", 1)[-1]
    in_root = any(path.startswith(r + "/") for r in roots)
    return in_root or name.startswith("test") or name.endswith("_test.py")


# -- the two steps ----------------------------------------------------------------------------------------------
def snapshot(state: str) -> None:
    root = os.getcwd()
    files, dirs = scan(root)
    tracked = set(os.fsdecode(p) for p in git("ls-tree", "-r", "-z", "--name-only", "HEAD").split(b"\0") if p)
    copies: dict[str, str] = {}
    for i, path in enumerate(sorted(p for p in files if p not in tracked and infra_by_name(p))):
        full = os.path.join(root, path)
        if os.path.isfile(full) and not os.path.islink(full) and os.path.getsize(full) <= COPY_LIMIT:
            copies[path] = os.path.join(state, f"copy-{i}")
            shutil.copy2(full, copies[path])
    record = {
        "files": files,
        "dirs": sorted(dirs),
        "git": scan_git(root),
        "tracked": sorted(tracked),
        "copies": copies,
        "names": importable_names(root),
    }
    with open(os.path.join(state, "snapshot.json"), "w") as fh:
        json.dump(record, fh)


def remove(full: str) -> None:
    if os.path.isdir(full) and not os.path.islink(full):
        shutil.rmtree(full)
    elif os.path.lexists(full):
        os.unlink(full)


def clear_way(root: str, path: str) -> None:
    """Make every parent of ``path`` a real directory or absent: nothing written back may go through a symlink."""
    parts = path.split("/")[:-1]
    for i in range(1, len(parts) + 1):
        full = os.path.join(root, *parts[:i])
        if os.path.lexists(full) and (os.path.islink(full) or not os.path.isdir(full)):
            os.unlink(full)


def revert(state: str, tag: str, test_files: list[str], targets: list[str], runner: str, infra: bool) -> int:
    root = os.getcwd()
    with open(os.path.join(state, "snapshot.json")) as fh:
        base = json.load(fh)
    git_now = scan_git(root)
    tampered = sorted(p for p in set(git_now) | set(base["git"]) if git_now.get(p) != base["git"].get(p))
    if infra and tampered:
        print(f"{tag} git_tampered {json.dumps({'path': tampered[0].rstrip('/')})}", flush=True)
        return 2
    files, _ = scan(root)
    before: dict[str, list[int]] = base["files"]
    tracked, copies = set(base["tracked"]), base["copies"]
    rules = Rules(root, set(base["names"]), set(test_files), targets, command_paths(runner), copies, infra)
    changed = sorted(p for p in set(files) | set(before) if files.get(p) != before.get(p))
    reverts = [(p, r) for p in changed if (r := rules.reason(p, new=p not in before))]
    for path, _ in reverts:
        clear_way(root, path)
        remove(os.path.join(root, path))
    for path, _ in reverts:
        if path in copies:
            os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
            shutil.copy2(copies[path], os.path.join(root, path))
    checkout = [p for p, _ in reverts if p in tracked and p not in copies]
    if checkout:
        specs = b"\0".join(os.fsencode(p) for p in checkout)
        git("--literal-pathspecs", "checkout", "HEAD", "--pathspec-from-file=-", "--pathspec-file-nul", stdin=specs)
    base_dirs = set(base["dirs"])
    for path, _ in reverts:  # directories only the patch made, left empty (a bare pytest/, a *.dist-info/)
        parent = os.path.dirname(path)
        while parent and parent not in base_dirs and os.path.isdir(os.path.join(root, parent)):
            if os.listdir(os.path.join(root, parent)):
                break
            os.rmdir(os.path.join(root, parent))
            parent = os.path.dirname(parent)
    for path, reason in reverts:
        print(f"{tag} reverted {json.dumps({'path': path, 'reason': reason})}", flush=True)
    return 0


def lines(path: str | None) -> list[str]:
    if not path:
        return []
    with open(path) as fh:
        return [line.rstrip("\n") for line in fh if line.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="step", required=True)
    sub.add_parser("snapshot").add_argument("state")
    sub.add_parser("names").add_argument("tree")  # asked of the tests' other interpreters by snapshot
    rev = sub.add_parser("revert")
    rev.add_argument("state")
    rev.add_argument("--tag", required=True, help="prefix of every line printed (the grader's one-time tag)")
    rev.add_argument("--test-files", help="file listing the test patch's files (always restored)")
    rev.add_argument("--targets", help="file listing the graded test files (FAIL_TO_PASS/PASS_TO_PASS)")
    rev.add_argument("--test-command", help="file holding the test command: what it names is restored too")
    rev.add_argument("--tests-only", action="store_true", help="SWE-bench's own scope: the test patch's files only")
    args = parser.parse_args(argv)
    if args.step == "snapshot":
        snapshot(args.state)
        return 0
    if args.step == "names":
        print(json.dumps(module_names(args.tree)))
        return 0
    targets = [] if args.tests_only else lines(args.targets)
    runner = "\n".join(lines(args.test_command))
    return revert(args.state, args.tag, lines(args.test_files), targets, runner, infra=not args.tests_only)


if __name__ == "__main__":
    sys.exit(main())
