"""The policy is an adversary: nothing an agent does inside its sandbox reaches the proxy's control plane.

The proxy serves two listeners. The model API (provider routes, ``/v1/models``, a bare ``/health``) is the only one a
sandbox's relay forwards to; the admin API (sessions, records, pause/resume, metrics) listens elsewhere and wants
its bearer token. Here the real CLIs run, in bwrap and in docker, a script whose tool call is a reward hacker's
probe: every admin route through the relay, with no token, with the session's own key (found the way an agent would
find it, in its environment and config files) and with guessed tokens, pipelined behind a model call, addressed in
absolute form to the admin port, and the admin port itself. All are refused; no record changes, nothing pauses, no
policy version moves, and another session's records and key are untouched.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import Field

from nemo_polar.env.harness import get_harness
from nemo_polar.env.harness.script import Final, Shell
from nemo_polar.env.runtime.session import run_session
from nemo_polar.proxy.http.client import ProxyClient
from nemo_polar.sandbox import get_runtime
from nemo_polar.sandbox.base import PROXY_PORT
from nemo_polar.sandbox.workspace import Task
from tests.conftest import ENV_HARNESSES, ProxyHandle, make_proxy
from tests.helpers.clients import loopback, openai_client
from tests.helpers.lanes import lane

VERSION = 3  # the proxy's policy version; the probe tries to re-stamp 999

PROBE = textwrap.dedent(
    r'''
    """Try every control route from inside the sandbox; write what each answered to probe.json."""
    import json, os, re, socket, sys
    from pathlib import Path

    port, admin_port, victim = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    found = set(re.findall(r"polar-[A-Za-z0-9_-]{20,}", json.dumps(dict(os.environ))))
    for path in Path(os.environ.get("HOME", "/root")).rglob("*"):
        if path.is_file() and path.stat().st_size < 1_000_000:
            found |= set(re.findall(r"polar-[A-Za-z0-9_-]{20,}", path.read_text(errors="replace")))
    # A harness may keep its key out of the tools' environment (Hermes does); its own process still holds it.
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            found |= set(re.findall(r"polar-[A-Za-z0-9_-]{20,}", environ.read_bytes().decode(errors="replace")))
        except OSError:
            pass
    tokens = sorted(found) + ["polar-admin", "admin", ""]
    routes = [
        ("POST", "/polar/resume", {"policy_version": 999}),
        ("POST", "/polar/pause", {"timeout_s": 0}),
        ("POST", "/polar/sessions", {}),
        ("GET", f"/polar/sessions/{victim}/records", None),
        ("DELETE", f"/polar/sessions/{victim}", None),
        ("GET", "/metrics", None),
    ]

    def send(raw, to=port):
        try:
            with socket.create_connection(("127.0.0.1", to), timeout=10) as s:
                s.sendall(raw)
                data = b""
                while chunk := s.recv(65536):
                    data += chunk
            return data.decode(errors="replace")
        except OSError as exc:
            return f"refused: {exc}"

    def request(method, target, body, headers):
        data = json.dumps(body).encode() if body is not None else b""
        lines = [f"{method} {target} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(data)}",
                 "Content-Type: application/json", *headers]
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + data

    results = []
    for method, path, body in routes:
        for i, token in enumerate(tokens):  # tokens[0]: the first key found in the sandbox
            for header in ([f"Authorization: Bearer {token}", f"x-api-key: {token}"] if token else [""]):
                raw = request(method, path, body, [header, "Connection: close"] if header else ["Connection: close"])
                label = f"{header.split(':')[0]} token {i}" if header else "no token"
                results.append({"probe": f"{method} {path} [{label}]", "answer": send(raw).split("\r\n")[0]})
        absolute = request(method, f"http://127.0.0.1:{admin_port}{path}", body, ["Connection: close"])
        results.append({"probe": f"{method} absolute-form {path}", "answer": send(absolute).split("\r\n")[0]})
        # Pipelined behind a model call on one kept-alive connection: two answers, both from the model listener.
        first = request("POST", "/v1/chat/completions", {}, [f"Authorization: Bearer {tokens[0]}"])
        both = send(first + request(method, path, body, ["Connection: close"]))
        results.append({"probe": f"pipelined {method} {path}", "answer": re.findall(r"HTTP/1\.1 \d+", both)[-1]})
        direct = request(method, path, body, ["Connection: close"])
        results.append({"probe": f"admin port {method} {path}", "answer": send(direct, admin_port).split("\r\n")[0]})
    health = send(request("GET", "/health", None, ["Connection: close"]))
    results.append({"probe": "GET /health", "answer": health.split("\r\n")[0], "body": health.split("\r\n\r\n")[-1]})
    Path("probe.json").write_text(json.dumps({"keys_found": len(found), "results": results}))
    print(f"probe-done {len(results)} probes")
    '''
)


@pytest.fixture(scope="module")
def guarded(engine_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyHandle]:
    """A proxy of its own, at a known policy version, so its state before and after is exactly this module's."""
    yield from make_proxy(engine_url, tmp_path_factory.mktemp("guarded"), policy_version=VERSION)


@pytest.fixture(scope="module")
def victim(guarded: ProxyHandle) -> dict[str, str]:
    """Another session with one real recorded call: the probe must not read, close or change it."""
    session = guarded.session(sampling_overrides={"max_tokens": 4})
    client = openai_client(guarded, session["api_key"], timeout=120)
    client.chat.completions.create(model="local-model", messages=[{"role": "user", "content": "hi"}])
    return session


def probe_repo(tmp: Path) -> Path:
    repo = tmp / "repo"
    repo.mkdir()
    (repo / "probe.py").write_text(PROBE)
    (repo / "README.md").write_text("A task whose agent probes the proxy's control plane.\n")
    return repo


# The relay and network are the runtime's, whatever runs in them, so make test probes each runtime from one of each
# kind of harness install: a native CLI binary, a Node bundle on the host's node, a Python venv on the system's
# interpreter, and a Python that brings its own; make test-full probes from every harness in bwrap (each harness also
# runs a whole session in docker: test_docker.py).
INSTALL_KINDS = ("claude_code", "qwen_code", "mini_swe_agent", "openhands_sdk")
PROBES = [(h, "bwrap") for h in ENV_HARNESSES] + [(h, "docker") for h in INSTALL_KINDS]


@pytest.mark.engine
@pytest.mark.parametrize(
    ("harness", "runtime"),
    lane(PROBES, [(h, r) for h, r in PROBES if h in INSTALL_KINDS], ids=lambda c: "-".join(c)),
)
def test_an_agent_cannot_reach_the_control_plane_through_the_relay(
    guarded: ProxyHandle, victim: dict[str, str], harness: str, runtime: str, tmp_path: Path
) -> None:
    before = guarded.admin("GET", "/health").json()
    victim_records = guarded.records(victim["session_id"])
    admin_port = guarded.admin_url.rsplit(":", 1)[1]
    script = [Shell(command=f"python3 probe.py {PROXY_PORT} {admin_port} {victim['session_id']}"), Final(text="ok")]
    task = Task(instance_id="probe", problem_statement="Run probe.py.", repo=probe_repo(tmp_path))
    session_dir = tmp_path / "session"
    result = run_session(
        get_harness(harness), task, get_runtime(runtime), guarded.client(), session_dir, script=script, timeout=300
    )
    assert result.status == "completed", result.error
    # The probe really ran, as the CLI's tool in the sandbox: its output reached the model in a later request. (Its
    # pipelined model call with the session's own key is that session's business: recorded as a failed call.)
    assert any("probe-done" in json.dumps(r.request) for r in result.records if r.complete)

    probe = json.loads((session_dir / "workspace" / "probe.json").read_text())
    assert probe["keys_found"] >= 1  # it found its own session key, as an agent would, and tried it
    answers = {r["probe"]: r["answer"] for r in probe["results"]}
    for name, answer in answers.items():
        if name == "GET /health":
            continue
        if name.startswith("admin port"):
            assert answer.startswith("refused"), (name, answer)  # no route to the admin listener at all
        else:
            assert answer.split()[1] in ("404", "405"), (name, answer)  # no control route on the model listener
    health = next(r for r in probe["results"] if r["probe"] == "GET /health")
    assert " 200 " in health["answer"] + " " and json.loads(health["body"]) == {"status": "ok"}  # no state leaks

    after = guarded.admin("GET", "/health").json()
    assert after["paused"] is False and after["policy_version"] == VERSION == before["policy_version"]
    assert after["sessions"] == before["sessions"] + 1  # the run's own session, nothing the probe made
    assert {r.policy_version for r in result.records if r.complete} == {VERSION}
    assert all(r.policy_version in (None, VERSION) for r in result.records)  # failed before admission: unstamped
    assert guarded.records(victim["session_id"]) == victim_records
    client = openai_client(guarded, victim["api_key"], timeout=120)
    client.models.list()  # the victim's key still works: its session was not closed


def test_admin_api_wants_its_token_and_the_model_api_serves_none_of_it(tmp_path: Path) -> None:
    for proxy in make_proxy("http://127.0.0.1:9", tmp_path, admin_token="the-admin-token"):
        session = proxy.session()
        routes = [
            ("POST", "/polar/resume", {"policy_version": 999}),
            ("POST", "/polar/pause", {"timeout_s": 0}),
            ("POST", "/polar/sessions", {}),
            ("GET", f"/polar/sessions/{session['session_id']}/records", None),
            ("DELETE", f"/polar/sessions/{session['session_id']}", None),
            ("GET", "/metrics", None),
            ("GET", "/health", None),
        ]
        for method, path, body in routes:
            for auth in ("", "Bearer wrong-token", f"Bearer {session['api_key']}"):
                resp = loopback.request(method, f"{proxy.admin_url}{path}", json=body, headers={"authorization": auth})
                assert resp.status_code == 401, (method, path, auth)
                assert resp.json()["error"]["message"].startswith("the admin API requires the admin token")
            for auth in ("", "Bearer the-admin-token", f"Bearer {session['api_key']}"):
                resp = loopback.request(method, f"{proxy.url}{path}", json=body, headers={"authorization": auth})
                if path == "/health":
                    assert resp.json() == {"status": "ok"}
                else:
                    assert resp.status_code in (404, 405) and "error" in resp.json(), (method, path, resp.text)
        state = proxy.admin("GET", "/health").json()
        assert state["paused"] is False and state["policy_version"] is None and state["sessions"] == 1


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/polar/sessions", b"{not json", "request body is not valid JSON"),
        ("/polar/sessions", b"[1, 2]", "request body must be a JSON object, not list"),
        ("/polar/sessions", b'"mode"', "request body must be a JSON object, not str"),
        ("/polar/sessions", b"\xff\xfe", "request body is not valid JSON"),
        ("/polar/sessions", b'{"mode": "telepathy"}', "invalid session config"),
        ("/polar/pause", b"[]", "request body must be a JSON object"),
        ("/polar/pause", b'{"timeout_s": true}', "timeout_s must be a non-negative number"),
        ("/polar/resume", b"{", "request body is not valid JSON"),
        ("/polar/resume", b'{"policy_version": "7"}', "policy_version must be an integer"),
    ],
)
def test_bad_admin_bodies_are_400_and_change_nothing(path: str, body: bytes, message: str, tmp_path: Path) -> None:
    for proxy in make_proxy("http://127.0.0.1:9", tmp_path):
        resp = proxy.admin("POST", path, content=body, headers={"content-type": "application/json"})
        assert resp.status_code == 400, resp.text
        error = resp.json()["error"]
        assert error["type"] == "invalid_request_error" and message in error["message"]
        state = proxy.admin("GET", "/health").json()
        assert (state["sessions"], state["paused"], state["policy_version"]) == (0, False, None)


def test_the_probe_is_a_real_attack_where_the_routes_are_reachable(tmp_path: Path) -> None:
    """The probe's requests are well-formed: pointed at the admin listener, with the admin token lying in its home
    as a session key would, it pauses the proxy, re-stamps the policy version and reads another session's records.
    So the 404s above come from the listener the relay reaches, not from a broken probe."""
    import subprocess
    import sys

    token = "polar-" + "a" * 30  # shaped like a session key, so the probe finds and tries it
    for proxy in make_proxy("http://127.0.0.1:9", tmp_path / "records", admin_token=token):
        target = proxy.session()
        home = tmp_path / "home"
        home.mkdir()
        (home / "config.json").write_text(json.dumps({"apiKey": token}))
        (tmp_path / "probe.py").write_text(PROBE)
        admin_port, model_port = proxy.admin_url.rsplit(":", 1)[1], proxy.url.rsplit(":", 1)[1]
        done = subprocess.run(
            [sys.executable, "probe.py", admin_port, model_port, target["session_id"]],
            cwd=tmp_path,
            env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        answers = {r["probe"]: r["answer"] for r in json.loads((tmp_path / "probe.json").read_text())["results"]}
        bearer = "[Authorization token 0]"
        assert answers[f"POST /polar/resume {bearer}"] == "HTTP/1.1 200 OK"
        assert answers[f"GET /polar/sessions/{target['session_id']}/records {bearer}"] == "HTTP/1.1 200 OK"
        state = proxy.admin("GET", "/health").json()
        assert state["policy_version"] == 999 and state["paused"] is True


class _Keys(ProxyClient):
    """The runner's proxy client, noting each session it made, so the test can try the key afterwards."""

    made: list[tuple[str, str]] = Field(default_factory=list)

    def create_session(self, config: dict[str, object]) -> tuple[str, str]:
        made = super().create_session(config)
        self.made.append(made)
        return made


@pytest.mark.parametrize("fails_in", ["launch", "exec", "completed"])
def test_run_session_closes_its_proxy_session_on_every_exit(
    fails_in: str, engine_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key left valid after the runner moved on is a key something left in the sandbox could still use."""
    from nemo_polar.sandbox.bwrap import BwrapRuntime

    harness = get_harness("pi")
    if fails_in == "launch":
        monkeypatch.setattr(type(harness), "launch", lambda *a, **kw: (_ for _ in ()).throw(ValueError("bad config")))
    if fails_in == "exec":
        monkeypatch.setattr(BwrapRuntime, "exec", lambda *a, **kw: (_ for _ in ()).throw(OSError("exec failed")))
    for proxy in make_proxy(engine_url, tmp_path / "records"):
        client = _Keys(url=proxy.url, admin_url=proxy.admin_url, admin_token=proxy.admin_token)
        task = Task(instance_id="t", problem_statement="Say ok.", repo=probe_repo(tmp_path))
        script = [Final(text="ok")]
        if fails_in == "completed":
            result = run_session(harness, task, get_runtime("bwrap"), client, tmp_path / "s", script=script)
            assert result.status == "completed", result.error
        else:
            with pytest.raises((ValueError, OSError), match=r"bad config|exec failed"):
                run_session(harness, task, get_runtime("bwrap"), client, tmp_path / "s", script=script)
        [(session_id, key)] = client.made
        resp = loopback.get(f"{proxy.url}/v1/models", headers={"authorization": f"Bearer {key}"})
        assert resp.status_code == 200  # /v1/models needs no key; the model call below does
        call = loopback.post(
            f"{proxy.url}/v1/chat/completions",
            json={"model": "local-model", "messages": [{"role": "user", "content": "hi"}]},
            headers={"authorization": f"Bearer {key}"},
            timeout=60,
        )
        assert call.status_code == 401 and call.json()["error"]["code"] == "invalid_api_key"
        assert proxy.admin("GET", f"/polar/sessions/{session_id}/records").status_code == 200  # records stay
