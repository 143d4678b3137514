"""The four real coding CLIs in the docker runtime: one container per session, no network, the proxy relayed in.

Needs a docker daemon and the runtime image (`make docker`). The scripted sessions are the bwrap ones
(tests/test_harness.py) with ``runtime="docker"``; the rest checks what the container adds: isolation and limits as
the daemon reports them, the fail-fast proxy check, and a timeout that kills the command inside the container.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from nemo_polar.engine.launcher import free_port
from nemo_polar.reconstruct.audit import audit
from nemo_polar.reconstruct.builders import prefix_merging
from nemo_polar.sandbox import RuntimeUnavailable, get_runtime
from nemo_polar.sandbox.base import PROXY_PORT, PROXY_UNREACHABLE
from nemo_polar.sandbox.docker import LABEL, DockerRuntime, docker_client
from tests.conftest import ENV_HARNESSES, ProxyHandle
from tests.helpers.lanes import DIALECT_HARNESSES, lane
from tests.helpers.sessions import EXPECTED_PATCH, check_egress_audit, make_spec, requests_text, run

pytestmark = pytest.mark.engine
HEALTH = f"exec 3<>/dev/tcp/127.0.0.1/{PROXY_PORT}; printf 'GET /health HTTP/1.0\\r\\n\\r\\n' >&3; head -1 <&3"


def containers_for(run_dir: Path) -> list[object]:
    """Containers still around for a sandbox (stop() removes its container)."""
    return docker_client().containers.list(all=True, filters={"label": f"{LABEL}.run_dir={run_dir}"})


@pytest.mark.parametrize("harness", lane(ENV_HARNESSES, DIALECT_HARNESSES.values()))
def test_scripted_session_in_docker(proxy: ProxyHandle, harness: str, tmp_path: Path) -> None:
    result = run(proxy, harness, tmp_path, runtime="docker")
    assert result.status == "completed", result.error
    assert result.exit_code == 0 and result.runtime == "docker"
    assert result.egress == []  # nothing but the proxy was attempted

    recs = result.records
    assert [r.complete for r in recs] == [True] * 5
    assert recs[-1].output is not None and recs[-1].output["content"] == "Fixed add in calc.py."
    assert all(r.sampled_token_ids and len(r.sampled_logprobs) == len(r.sampled_token_ids) for r in recs)
    # The tools really ran inside the container: their output reached the model in the next request.
    assert "test_calc.py" in requests_text(result, 1)  # ls
    assert "return a - b" in requests_text(result, 2)  # read
    assert "sum 5" in requests_text(result, 4)  # the check ran on the edited file (the image's python3)

    assert EXPECTED_PATCH in result.patch
    assert "calc.py" in result.patch and "__pycache__" not in result.patch
    # What the harness wrote in the workspace belongs to the caller, as under bwrap.
    assert (tmp_path / "session" / "workspace" / "calc.py").stat().st_uid == os.getuid()

    built = prefix_merging(recs)
    main = [t for t in built.traces if t.role == "main"]
    assert len(main) == 1 and len(built.traces) == 1
    assert [s.call_id for s in main[0].spans] == [r.call_id for r in recs]
    assert not built.break_reasons
    report = audit(built.traces, recs)
    assert report.ok, report

    saved = json.loads((tmp_path / "session" / "session.json").read_text())
    assert saved["status"] == "completed" and saved["runtime"] == "docker"
    assert containers_for(tmp_path / "session" / "run") == []  # removed


def test_docker_isolation_and_limits(proxy: ProxyHandle, tmp_path: Path) -> None:
    """No network but the relayed proxy, host files invisible, read-only system, no capabilities, the limits set."""
    spec = make_spec(tmp_path, proxy.url)
    proxy_port = proxy.url.rsplit(":", 1)[1]
    script = (
        "touch /workspace/ok /root/ok; touch /usr/x /etc/x /x 2>/dev/null && echo system-writable; "
        f"test -e {Path(__file__).parent} && echo host-visible; test -e {tmp_path} && echo host-visible; "
        "echo nets=$(ls /sys/class/net); grep CapEff /proc/self/status; echo pid1=$(cat /proc/1/comm); "
        f"(exec 3<>/dev/tcp/127.0.0.1/{proxy_port}) 2>/dev/null && echo host-port-reachable; "
        f"{HEALTH}"
    )
    rt = DockerRuntime(cpus=1, memory="512m", pids=128)
    with rt:
        rt.start(spec)
        done = rt.exec(["bash", "-c", script], {}, cwd=None, timeout=60, log_prefix=tmp_path / "iso")
        assert rt.container is not None
        rt.container.reload()
        host = rt.container.attrs["HostConfig"]
    out = done.stdout.read_text()
    assert done.returncode == 0, done.stderr.read_text()
    assert (spec.workspace / "ok").exists() and (spec.home / "ok").exists()
    assert "system-writable" not in out and "host-visible" not in out and "host-port-reachable" not in out
    assert "nets=lo\n" in out  # network_mode none: loopback only
    assert "CapEff:\t0000000000000000" in out
    assert "pid1=bash" in out  # the container's own pid namespace: the relay keeper is pid 1
    assert "200 OK" in out  # ...and the proxy answers through the relay
    assert host["NetworkMode"] == "none" and host["ReadonlyRootfs"] and host["CapDrop"] == ["ALL"]
    assert (host["Memory"], host["NanoCpus"], host["PidsLimit"]) == (512 * 2**20, 10**9, 128)
    assert containers_for(spec.run_dir) == []


def test_docker_egress_audit_records_and_refuses(proxy: ProxyHandle, tmp_path: Path) -> None:
    check_egress_audit("docker", proxy.url, tmp_path)


def test_docker_without_a_proxy_route_fails_fast(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, f"http://127.0.0.1:{free_port()}")
    with get_runtime("docker") as rt:
        rt.start(spec)
        done = rt.exec(["true"], {}, cwd=None, timeout=60, log_prefix=tmp_path / "x")
    assert done.returncode == PROXY_UNREACHABLE
    assert done.duration_s < 30
    assert "model proxy is not reachable from the sandbox" in done.stderr.read_text()
    assert containers_for(spec.run_dir) == []


def test_docker_without_a_proxy_has_no_route_out(tmp_path: Path) -> None:
    """Grading runs with no proxy at all: no relay to one, no audit, a lookup fails at once as in a plain
    container with no network."""
    spec = make_spec(tmp_path, "http://127.0.0.1:1").model_copy(update={"proxy_url": None})
    script = (
        f"(exec 3<>/dev/tcp/127.0.0.1/{PROXY_PORT}) 2>/dev/null && echo proxy-route; "
        "python3 -c 'import socket; socket.getaddrinfo(\"egress-probe.invalid\", 443)' 2>/dev/null || echo dns-failed"
    )
    with get_runtime("docker") as rt:
        rt.start(spec)
        done = rt.exec(["bash", "-c", script], {}, cwd=None, timeout=60, log_prefix=tmp_path / "grade")
        attempts = rt.egress_attempts()
    out = done.stdout.read_text()
    assert done.returncode == 0, done.stderr.read_text()
    assert "proxy-route" not in out and "dns-failed" in out
    assert done.duration_s < 30 and attempts == []
    assert not (spec.run_dir / "proxy.sock").exists()


def test_docker_timeout_kills_the_command_inside(proxy: ProxyHandle, tmp_path: Path) -> None:
    """Killing the `docker exec` client alone would leave the command running in the container."""
    spec = make_spec(tmp_path, proxy.url)
    hang = "sleep 301 & setsid sleep 302 & exec sleep 303"
    with DockerRuntime() as rt:
        rt.start(spec)
        done = rt.exec(["bash", "-c", hang], {}, cwd=None, timeout=3, log_prefix=tmp_path / "hang")
        assert rt.container is not None
        left = rt.container.exec_run(["ps", "-eo", "args"]).output.decode()
        again = rt.exec(["bash", "-c", HEALTH], {}, cwd=None, timeout=60, log_prefix=tmp_path / "again")
    assert done.timed_out and done.returncode is None
    assert "sleep 30" not in left, left  # all three, the detached one included
    # The relays (pid 1's) survive, and the next command gets through.
    assert sum(line.startswith("socat ") for line in left.splitlines()) == 2  # the DNS audit and the proxy
    assert again.returncode == 0 and "200 OK" in again.stdout.read_text()


def test_docker_session_timeout(proxy: ProxyHandle, tmp_path: Path) -> None:
    result = run(proxy, "pi", tmp_path, runtime="docker", timeout=2)
    assert result.status == "timeout"
    assert result.exit_code is None
    assert "killed" in (result.error or "")
    assert containers_for(tmp_path / "session" / "run") == []


def test_docker_unavailable_says_what_to_do(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    spec = make_spec(tmp_path, "http://127.0.0.1:1")
    with pytest.raises(RuntimeUnavailable, match="is missing; run `make docker`"):
        DockerRuntime(image="nemo-polar/absent:0").start(spec)
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-daemon.sock")
    with pytest.raises(RuntimeUnavailable, match=r"no docker daemon answers.*make docker"):
        get_runtime("docker").start(spec)
