"""The grading environment is the image's own, as swebench's harness runs it: proof by diff.

One probe, run as a test process (the test command of a row over the network family's image), sees its
environment, /etc, ids, hostname, umask, cwd, locale, limits, capabilities and network. It runs once through
swebench's own ``run_instance`` (its container, its exec, its eval script) and once through ``polar grade`` in each
runtime; the views must be equal but for the differences docs/grading_environment.md lists, each asserted here
to be exactly what it says.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nemo_polar.rewards.grader import grade
from nemo_polar.rewards.instance import SWEInstance
from tests.conftest import TASKS

pytestmark = pytest.mark.real_image
NETWORK_TASK = "psf__requests-cve-2023-32681"
TAG = "polar-probe:"

PROBE = r"""
import errno, json, locale, os, resource, socket, subprocess, time

def attempt(fn):
    t0 = time.monotonic()
    try:
        fn()
        out = "ok"
    except OSError as exc:
        code = exc.errno if isinstance(exc.errno, int) and exc.errno > 0 else None
        out = type(exc).__name__ + (":" + errno.errorcode[code] if code in errno.errorcode else "")
    return {"outcome": out, "at_once": time.monotonic() - t0 < 4}  # a resolver or connect timeout waits 5 s

def connect(address):
    with socket.create_connection(address, timeout=5):
        pass

def writable(path):
    try:
        with open(os.path.join(path, ".polar-probe"), "w"):
            pass
        os.unlink(os.path.join(path, ".polar-probe"))
        return True
    except OSError:
        return False

def read(path):
    try:
        with open(path) as fh:
            return fh.read()
    except OSError as exc:
        return "unreadable: " + type(exc).__name__

host = socket.gethostname()
status = dict(line.split(":\t", 1) for line in read("/proc/self/status").splitlines() if ":\t" in line)
mask = os.umask(0)
os.umask(mask)
locale.setlocale(locale.LC_ALL, "")
view = {
    "env": {k: ("<hostname>" if v == host else v) for k, v in os.environ.items()},
    "etc": {name: read("/etc/" + name).replace(host, "<hostname>") for name in
            ("hosts", "resolv.conf", "hostname", "passwd", "group", "nsswitch.conf")},
    "ids": {"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "groups": sorted(os.getgroups())},
    "hostname_shape": "docker" if len(host) == 12 and all(c in "0123456789abcdef" for c in host) else host,
    "umask": oct(mask),
    "cwd": os.getcwd(),
    "locale": [locale.setlocale(locale.LC_ALL), locale.getpreferredencoding(False)],
    "limits": {name: resource.getrlimit(getattr(resource, name)) for name in sorted(dir(resource))
               if name.startswith("RLIMIT_")},
    "status": {k: status[k].strip() for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs",
                                            "Seccomp") if k in status},
    "interfaces": sorted(name for _, name in socket.if_nameindex()),
    "net": {
        "lookup": attempt(lambda: socket.getaddrinfo("doesnotexist.google.com", 80)),
        "connect_out": attempt(lambda: connect(("10.255.255.1", 80))),
        "connect_loopback": attempt(lambda: connect(("127.0.0.1", 1))),
    },
    "writable": {p: writable(p) for p in
                 ("/testbed", os.path.expanduser("~"), "/tmp", "/opt", "/usr/local", "/etc", "/")},
}
print("TAG" + json.dumps(view, sort_keys=True))
""".replace("TAG", TAG)


def probe_row(instance: SWEInstance) -> dict[str, Any]:
    """The network task's row with the probe as its test command (its setup, the image's env activation, kept)."""
    from swebench.task.repo import load_task

    row = load_task(TASKS / "tasks" / instance.instance_id)
    setup = row["eval_script"].split(": '>>>>> Start Test Output'")[0]
    probe = f"python - <<'EOF_POLAR_PROBE'\n{PROBE}\nEOF_POLAR_PROBE\n"
    row["eval_script"] = f"{setup}: '>>>>> Start Test Output'\n{probe}: '>>>>> End Test Output'\n"
    return row


def view_in(log: str) -> dict[str, Any]:
    [line] = [line for line in log.splitlines() if line.startswith(TAG)]
    return json.loads(line[len(TAG) :])


def swebench_view(row: dict[str, Any], patch: str, tmp_path: Path) -> dict[str, Any]:
    """The probe through swebench 5's own run_instance (create_container, its eval script, its exec)."""
    code = """
import json, sys
from swebench.harness.run_evaluation import _docker_client, run_instance
from swebench.harness.utils import make_test_spec
row, patch = json.loads(sys.argv[1]), sys.argv[2]
pred = {"instance_id": row["instance_id"], "model_name_or_path": "probe", "model_patch": patch}
run_instance(make_test_spec(row), pred, _docker_client(), "polar-probe", timeout=300)
"""
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(row), patch], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    log = tmp_path / "logs" / "run_evaluation" / "polar-probe" / "probe" / row["instance_id"] / "test_output.txt"
    return view_in(log.read_text())


def polar_view(row: dict[str, Any], patch: str, runtime: str, tmp_path: Path) -> dict[str, Any]:
    instance = SWEInstance.model_validate(row)
    result = grade(instance, patch, runtime, log_dir=tmp_path / runtime)
    assert result.log_path is not None, result
    return view_in(result.log_path.read_text())


def cap_bits(*names: str) -> int:
    numbers = {"CAP_MKNOD": 27, "CAP_SYS_ADMIN": 21}
    return sum(1 << numbers[n] for n in names)


def differences(ours: dict[str, Any], theirs: dict[str, Any], prefix: str = "") -> dict[str, tuple[Any, Any]]:
    """Every leaf that differs, by its path (``status.CapEff``, ``env.PWD``, ...)."""
    out: dict[str, tuple[Any, Any]] = {}
    for key in sorted(set(ours) | set(theirs)):
        a, b = ours.get(key, "<absent>"), theirs.get(key, "<absent>")
        if isinstance(a, dict) and isinstance(b, dict):
            out |= differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out[f"{prefix}{key}"] = (a, b)
    return out


@pytest.fixture(scope="module")
def views(images: dict[str, SWEInstance], tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    instance = images[NETWORK_TASK]
    row = probe_row(instance)
    tmp = tmp_path_factory.mktemp("probe")
    return {
        "swebench": swebench_view(row, instance.patch, tmp),
        "docker": polar_view(row, instance.patch, "docker", tmp),
        "bwrap": polar_view(row, instance.patch, "bwrap", tmp),
    }


def test_the_probe_sees_swebench_world(views: dict[str, dict[str, Any]]) -> None:
    """What swebench's own container shows, checked so that a probe that saw nothing could not pass."""
    theirs = views["swebench"]
    assert theirs["ids"]["uid"] == 0 and theirs["cwd"] == "/testbed" and theirs["hostname_shape"] == "docker"
    assert theirs["env"]["HOME"] == "/root" and theirs["env"]["VIRTUAL_ENV"] == "/opt/miniconda3/envs/testbed"
    assert not any(k.lower().endswith("_proxy") or k.startswith("POLAR") for k in theirs["env"])
    assert theirs["net"]["lookup"]["outcome"].startswith("gaierror") and theirs["net"]["lookup"]["at_once"]
    assert theirs["net"]["connect_loopback"]["outcome"].endswith("ECONNREFUSED")
    assert "localhost" in theirs["etc"]["hosts"] and theirs["interfaces"] == ["lo"]


@pytest.mark.parametrize("runtime", ["docker", "bwrap"])
def test_only_documented_differences(views: dict[str, dict[str, Any]], runtime: str) -> None:
    """docs/grading_environment.md, difference by difference."""
    ours, theirs = views[runtime], views["swebench"]
    diff = differences(ours, theirs)
    # Capabilities: swebench adds CAP_SYS_ADMIN (a way out of a container on cgroup v1); bwrap also goes without
    # CAP_MKNOD (no device cgroup to make a device node harmless).
    missing = cap_bits("CAP_SYS_ADMIN") | (cap_bits("CAP_MKNOD") if runtime == "bwrap" else 0)
    for field in ("CapPrm", "CapEff", "CapBnd"):
        a, b = diff.pop(f"status.{field}", (ours["status"][field], theirs["status"][field]))
        assert int(b, 16) & ~int(a, 16) == missing and int(a, 16) & ~int(b, 16) == 0, (field, a, b)
    if runtime == "bwrap":
        # bwrap hands its capabilities on across exec as inheritable and ambient ones (a container: neither).
        for field in ("CapInh", "CapAmb"):
            assert diff.pop(f"status.{field}") == (ours["status"]["CapEff"], "0000000000000000")
        # bwrap sets no seccomp filter (docker's default profile is one) and always sets no_new_privs.
        assert diff.pop("status.Seccomp") == ("0", theirs["status"]["Seccomp"])
        assert diff.pop("status.NoNewPrivs") == ("1", "0")
        # No supplementary groups (docker gives root's from the image's /etc/group).
        assert diff.pop("ids.groups") == ([], [0])
        # New entries right in / and /etc: bwrap's own directories there hold the image's entries bound one by one.
        for path in ("/", "/etc"):
            assert diff.pop(f"writable.{path}") == (False, True)
        if os.geteuid() != 0:  # no overlay without root: the image's root is read-only but /testbed, home and /tmp
            for path in ("/opt", "/usr/local"):
                assert diff.pop(f"writable.{path}") == (False, True)
    assert diff == {}, json.dumps(diff, indent=1, default=str)


def test_no_variable_of_ours_reaches_the_tests(views: dict[str, dict[str, Any]]) -> None:
    for runtime in ("docker", "bwrap"):
        env = views[runtime]["env"]
        assert not [k for k in env if k.startswith("POLAR") or re.fullmatch(r"(?i)(https?|no|all)_proxy", k)]
        assert "NODE_USE_ENV_PROXY" not in env
