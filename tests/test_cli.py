"""The `polar` command line: the proxy served from a config file, flags overriding it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from nemo_polar.engine.launcher import stop_group, wait_healthy
from tests.conftest import free_port
from tests.helpers.clients import loopback

ROOT = Path(__file__).resolve().parents[1]


def test_polar_proxy_from_config(engine_url: str, tmp_path: Path) -> None:
    port, admin_port = free_port(), free_port()
    cmd = [
        sys.executable,
        "-m",
        "nemo_polar.cli",
        "proxy",
        "--config",
        str(ROOT / "conf/proxy/default.yaml"),
        "--engine-url",
        engine_url,
        "--port",
        str(port),
        "--record-dir",
        str(tmp_path),
        "--admin-port",
        str(admin_port),
        "--api-key",
        "sk-cli",
    ]
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, 60, proc)
        resp = loopback.post(
            f"{url}/v1/chat/completions",
            headers={"authorization": "Bearer sk-cli"},
            json={"model": "local-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
            timeout=60,
        )
        assert resp.status_code == 200, resp.text  # `local-model` comes from the config's model_aliases
        [records] = list(tmp_path.glob("*.jsonl"))  # --record-dir overrides the config's record_dir
        assert '"complete":true' in records.read_text()
        # The admin API listens on --admin-port behind the random token the proxy printed (the config has none).
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(3)]
        assert lines[1].startswith(f"admin API  http://127.0.0.1:{admin_port}")
        token = lines[2].split()[2]
        admin = f"http://127.0.0.1:{admin_port}/health"
        assert loopback.get(admin, timeout=10).status_code == 401
        state = loopback.get(admin, headers={"authorization": f"Bearer {token}"}, timeout=10).json()
        assert state["sessions"] == 1 and state["paused"] is False  # the --api-key session
        assert (
            loopback.get(f"{url}/polar/sessions/x/records", headers={"authorization": f"Bearer {token}"}).status_code
            == 404
        )
    finally:
        stop_group(proc, 10)
        proc.wait()


def test_polar_lists_its_subcommands_in_order() -> None:
    """Each module of nemo_polar/cli registers its own subcommands; `polar --help` lists them in this order, and
    every leaf has a handler."""
    import argparse

    from nemo_polar.cli import build_parser

    def commands(parser: argparse.ArgumentParser, prefix: str = "") -> list[str]:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            assert callable(parser.get_default("func")), prefix
            return [prefix]
        return [c for name, sub in subs[0].choices.items() for c in commands(sub, f"{prefix} {name}".strip())]

    assert commands(build_parser()) == [
        "engine up",
        "engine down",
        "proxy",
        "patterns",
        "reconstruct",
        "audit",
        "rollout",
        "generate",
        "learn",
        "grade",
        "convert-rows",
        "view",
        "gym-root",
        "gym-recipe",
        "gym-venvs",
        "harness install",
    ]


def test_polar_proxy_requires_an_engine_url() -> None:
    out = subprocess.run([sys.executable, "-m", "nemo_polar.cli", "proxy"], capture_output=True, text=True)
    assert out.returncode != 0 and "--engine-url" in out.stderr


def test_an_idle_keep_alive_connection_outlasts_the_clients_own_expiry() -> None:
    """An agent's HTTP client keeps its connection for 4-5 s idle (Node 4 s, httpx 5 s) and reuses it after tool
    time: the proxy must not be the side that closes first, or the next POST races the close ("server disconnected").
    One connection, a request, 6 s idle (past uvicorn's default 5 s), another request on the same socket."""
    import http.client
    import time

    from nemo_polar.proxy.http.config import ProxyConfig
    from nemo_polar.proxy.http.serve import ProxyServer

    with ProxyServer(ProxyConfig(engine_url="http://127.0.0.1:9", render="engine")) as server:
        port = int(server.url.rsplit(":", 1)[1])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/health")
        assert conn.getresponse().read() == b'{"status":"ok"}'
        sock = conn.sock
        time.sleep(6)
        conn.request("GET", "/health")  # http.client reconnects silently if the server closed: check the socket
        assert conn.getresponse().status == 200 and conn.sock is sock
        conn.close()


def test_the_proxys_connections_send_without_waiting_for_acks() -> None:
    """Every accepted connection has TCP_NODELAY. asyncio sets it only where the socket's protocol is named TCP, and
    an accepted socket inherits the listener's: a listener made without it left Nagle's algorithm on, and each small
    answer written in two parts waited for the client's delayed ACK (~40 ms a call)."""
    import asyncio
    import http.client
    import socket

    from nemo_polar.proxy.http.config import ProxyConfig
    from nemo_polar.proxy.http.serve import ProxyServer, _listen

    with ProxyServer(ProxyConfig(engine_url="http://127.0.0.1:9", render="engine")) as server:
        for url, listener in zip((server.url, server.admin_url), server._servers.servers, strict=True):
            conn = http.client.HTTPConnection("127.0.0.1", int(url.rsplit(":", 1)[1]), timeout=10)
            conn.request("GET", "/health")
            conn.getresponse().read()
            [protocol] = listener.server_state.connections
            sock = protocol.transport.get_extra_info("socket")
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
            conn.close()

    async def accepted_nodelay() -> int:  # asyncio's own loop too (uvloop sets it on every TCP socket it accepts)
        accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.set_result(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(on_connect, sock=_listen("127.0.0.1", None))
        async with server:
            _, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
            writer.close()
            return await asyncio.wait_for(accepted, 10)

    assert asyncio.run(accepted_nodelay()) == 1


def test_the_proxys_listeners_hold_distinct_ports_from_construction() -> None:
    """Both listeners are bound when the server is built: no other socket can take either port before it starts
    (two separate free-port probes once handed both listeners the same port), and a taken port is a clear error."""
    import socket

    from nemo_polar.proxy.http.config import ProxyConfig
    from nemo_polar.proxy.http.serve import ProxyServer

    config = ProxyConfig(engine_url="http://127.0.0.1:9", render="engine")
    server = ProxyServer(config)
    assert server.port != server.admin_port
    for port in (server.port, server.admin_port):
        with socket.socket() as other, pytest.raises(OSError):
            other.bind(("127.0.0.1", port))
    with server:
        assert loopback.get(server.url + "/health", timeout=5).status_code == 200
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{port}"):
            ProxyServer(config, port=port)


def test_admin_token_by_environment_or_file_never_on_argv(tmp_path: Path) -> None:
    """A token that starts with '-' works on every path; by environment or file it never appears in argv."""
    import os

    token = "-starts-with-a-dash"
    token_file = tmp_path / "admin-token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    ways: dict[str, tuple[list[str], dict[str, str]]] = {
        "environment": ([], {"POLAR_ADMIN_TOKEN": token}),
        "file": (["--admin-token-file", str(token_file)], {}),
        "argv": ([f"--admin-token={token}"], {}),
    }
    for way, (flags, env) in ways.items():
        port, admin_port = free_port(), free_port()
        cmd = [sys.executable, "-m", "nemo_polar.cli", "proxy", "--engine-url", "http://127.0.0.1:9"]
        cmd += ["--port", str(port), "--admin-port", str(admin_port), "--record-dir", str(tmp_path / way), *flags]
        base_env = {k: v for k, v in os.environ.items() if k != "POLAR_ADMIN_TOKEN"}
        proc = subprocess.Popen(cmd, start_new_session=True, env={**base_env, **env}, stdout=subprocess.DEVNULL)
        try:
            wait_healthy(f"http://127.0.0.1:{port}", 60, proc, name="polar proxy")
            admin = f"http://127.0.0.1:{admin_port}/health"
            assert loopback.get(admin, headers={"authorization": f"Bearer {token}"}, timeout=10).status_code == 200, way
            assert loopback.get(admin, headers={"authorization": "Bearer other"}, timeout=10).status_code == 401, way
            argv = Path(f"/proc/{proc.pid}/cmdline").read_bytes().decode()
            assert (token in argv) == (way == "argv"), way
        finally:
            stop_group(proc, 10)
            proc.wait()


def test_clients_take_the_admin_token_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rollout config, the Gym agent and `polar generate` name a running proxy without its token on argv."""
    from nemo_polar.proxy.http.client import ProxyClient

    monkeypatch.setenv("POLAR_ADMIN_TOKEN", "-from-the-environment")
    assert ProxyClient(url="http://m", admin_url="http://a").admin_token == "-from-the-environment"
    assert ProxyClient(url="http://m", admin_url="http://a", admin_token="given").admin_token == "given"
    monkeypatch.delenv("POLAR_ADMIN_TOKEN")
    assert ProxyClient(url="http://m", admin_url="http://a").admin_token is None


def test_unreadable_admin_token_file_is_a_clear_error(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "nemo_polar.cli", "proxy", "--engine-url", "http://127.0.0.1:9"]
    out = subprocess.run([*cmd, "--admin-token-file", str(tmp_path / "missing")], capture_output=True, text=True)
    assert out.returncode != 0 and "cannot read --admin-token-file" in out.stderr
    assert "Traceback" not in out.stderr


def test_wait_healthy_names_the_process_it_waited_on(tmp_path: Path) -> None:
    import pytest

    log = tmp_path / "out.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", "print('refused my argv'); raise SystemExit(2)"], stdout=out)
    proc.wait()
    with pytest.raises(RuntimeError, match=r"(?s)polar proxy exited with code 2.*refused my argv"):
        wait_healthy(f"http://127.0.0.1:{free_port()}", 10, proc, log, name="polar proxy")


def _nice_of(pid: int, tid: int | None = None) -> int:
    stat = Path(f"/proc/{pid}/task/{tid or pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[16])  # field 19 of stat(5): nice


def test_engine_niceness_reaches_what_it_starts_later(tmp_path: Path) -> None:
    """``polar engine up --nice``: set on the session leader right after its start, it holds for the threads and
    processes it starts afterwards (vLLM's engine core and workers), and for its autogroup, which is what the
    kernel weighs against the proxy's session where it has autogroups."""
    from nemo_polar.engine.launcher import set_niceness

    script = (
        "import subprocess, sys, threading\n"
        "sys.stdin.readline()\n"  # started, waiting: the niceness is set now
        "ready = threading.Event()\n"
        "t = threading.Thread(target=lambda: (print(threading.get_native_id(), flush=True), ready.wait()))\n"
        "t.start()\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import sys; sys.stdin.readline()'], stdin=subprocess.PIPE)\n"
        "print(child.pid, flush=True)\n"
        "sys.stdin.readline(); ready.set(); child.communicate(b'\\n')\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        set_niceness(proc.pid, 7)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        thread_id, child_pid = int(proc.stdout.readline()), int(proc.stdout.readline())
        assert _nice_of(proc.pid) == 7
        assert _nice_of(proc.pid, thread_id) == 7
        assert _nice_of(child_pid) == 7
        autogroup = Path(f"/proc/{proc.pid}/autogroup")
        if autogroup.exists() and Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1":
            assert autogroup.read_text().split()[-1] == "7"
            assert Path(f"/proc/{child_pid}/autogroup").read_text() == autogroup.read_text()
        proc.stdin.write("done\n")
        proc.stdin.flush()
        assert proc.wait(timeout=30) == 0
    finally:
        stop_group(proc, 5)


def test_stop_group_returns_when_its_group_has_exited() -> None:
    """The leader is this process's own child, so it stays a zombie in its group until it is reaped: stop_group
    must reap it, or the group looks alive until the timeout (every engine and proxy stop took its whole timeout)."""
    import signal
    import threading

    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; print('up', flush=True); sys.stdin.readline()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "up\n"
    stopped = threading.Event()
    threading.Thread(target=lambda: (stop_group(proc, 3600), stopped.set()), daemon=True).start()
    assert stopped.wait(300), "stop_group kept waiting on a group whose only process had exited"
    assert proc.returncode == -signal.SIGTERM


def test_stop_group_kills_a_member_that_outlives_the_leader() -> None:
    """Reaping the leader must not end the wait early: a member that ignores SIGTERM is killed at the timeout."""

    member = (
        "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); "
        "time.sleep(3600)"
    )
    leader = (
        "import subprocess, sys\n"
        f"m = subprocess.Popen([sys.executable, '-c', {member!r}], stdout=subprocess.PIPE, text=True)\n"
        "m.stdout.readline(); print(m.pid, flush=True); sys.stdin.readline()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", leader], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert proc.stdout is not None
    member_pid = int(proc.stdout.readline())
    stop_group(proc, 1)
    assert proc.wait(timeout=300) < 0  # ended by a signal: SIGTERM, or SIGKILL if it was not scheduled within 1 s
    assert _gone(member_pid, within_s=300), "the member that ignored SIGTERM was left running"


def _gone(pid: int, within_s: float) -> bool:
    """The process has exited (a zombie awaiting its new parent's reaping counts), waiting up to ``within_s``."""
    import time

    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_random_admin_tokens_can_be_passed_as_option_values() -> None:
    """A token starting with "-" would read as an option (`--proxy-admin-token -x...`); a bare token_urlsafe starts
    with one 1 time in 64, so among 1,000 tokens one would."""
    from nemo_polar.proxy.http.config import ProxyConfig

    tokens = {ProxyConfig(engine_url="http://127.0.0.1:1").admin_token for _ in range(1000)}
    assert len(tokens) == 1000 and not any(t.startswith("-") for t in tokens)


def test_a_format_the_proxy_cannot_read_is_refused_at_start(tmp_path: Path) -> None:
    """Continuation mode reads a sampled Llama 3 JSON call with vLLM's parser, which needs the model's tokenizer
    files beside the proxy. An engine whose model directory is on another machine (a stand-in answering only the
    model card and /tokenize, labelled so) is refused when the proxy starts, naming the parser and the directory; in
    chat mode the engine parses, and the proxy starts."""
    from fastapi import FastAPI

    from nemo_polar.proxy.http.serve import BackgroundServer

    remote = FastAPI()
    remote.get("/v1/models")(lambda: {"data": [{"id": "m", "root": "/models/elsewhere", "max_model_len": 4096}]})
    remote.post("/tokenize")(lambda: {"tokens": [1, 2]})
    with BackgroundServer(remote) as engine:
        base = [sys.executable, "-m", "nemo_polar.cli", "proxy", "--engine-url", engine.url]
        base += ["--tool-call-parser", "llama3_json", "--record-dir", str(tmp_path), "--port", str(free_port())]
        out = subprocess.run(base, capture_output=True, text=True, timeout=120)
        assert out.returncode != 0 and "Traceback" not in out.stderr
        assert "'llama3_json'" in out.stderr and "/models/elsewhere" in out.stderr and "--mode chat" in out.stderr
        proc = subprocess.Popen([*base, "--mode", "chat"], start_new_session=True, stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None and proc.stdout.readline().startswith("model API")
        finally:
            stop_group(proc, 10)
            proc.wait()


def test_generate_takes_hydra_overrides_and_its_flags_are_aliases() -> None:
    """`polar generate` speaks `polar rollout`'s config (conf/generate.yaml over rollout.yaml): an old command's flags
    and the same command in overrides compose one config; flags win over overrides of the same key."""
    from omegaconf import OmegaConf

    from nemo_polar.cli import build_parser
    from nemo_polar.cli.generate import alias_overrides
    from nemo_polar.env.frontends.rollout import compose

    def composed(argv: list[str]) -> dict:
        args = build_parser().parse_args(["generate", *argv])
        cfg = compose([*args.overrides, *alias_overrides(args)], config_name="generate")
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]

    flags = composed(
        [
            *["--env", "polar_codex", "--instances", "rows's.jsonl", "--attempts", "2", "--run-slots", "3"],
            *["--container-formatter", "/sif/sweb.{instance_id}.sif", "--instance-id", "a", "--instance-id", "b"],
            *["--no-scripted", "--engine-url", "http://h:8000", "-o", "out dir", "--timeout", "90"],
        ]
    )
    overrides = composed(
        [
            *["env=polar_codex", "dataset=swebench", 'dataset.path="rows\'s.jsonl"', "n_samples=2"],
            *["gateway.run_slots=3", "dataset.container_formatter=['/sif/sweb.{instance_id}.sif']"],
            *["dataset.instance_ids=[a,b]", "scripted=false", "engine.url=http://h:8000", "out='out dir'"],
            "timeout=90.0",
        ]
    )
    assert flags == overrides
    assert flags["dataset"]["path"] == "rows's.jsonl" and flags["gateway"]["agent_budget_s"] == 90.0
    defaults = composed(["dataset=bundled"])
    assert (defaults["n_samples"], defaults["timeout"], defaults["scripted"], defaults["env"]["name"]) == (
        4,
        1800,
        True,  # the bundled dataset's scripts solve its tasks
        "polar_pi",
    )
    assert composed(["env=polar_codex", "--env", "polar_pi"])["env"]["name"] == "polar_pi"
