"""The `polar` command line: the proxy served from a config file, flags overriding it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx

from nemo_polar.engine.launcher import stop_group, wait_healthy
from tests.conftest import free_port

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
        resp = httpx.post(
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
        assert httpx.get(admin, timeout=10).status_code == 401
        state = httpx.get(admin, headers={"authorization": f"Bearer {token}"}, timeout=10).json()
        assert state["sessions"] == 1 and state["paused"] is False  # the --api-key session
        assert (
            httpx.get(f"{url}/polar/sessions/x/records", headers={"authorization": f"Bearer {token}"}).status_code
            == 404
        )
    finally:
        stop_group(proc.pid, 10)
        proc.wait()


def test_polar_proxy_requires_an_engine_url() -> None:
    out = subprocess.run([sys.executable, "-m", "nemo_polar.cli", "proxy"], capture_output=True, text=True)
    assert out.returncode != 0 and "--engine-url" in out.stderr


def test_an_idle_keep_alive_connection_outlasts_the_clients_own_expiry() -> None:
    """An agent's HTTP client keeps its connection for 4-5 s idle (Node 4 s, httpx 5 s) and reuses it after tool
    time: the proxy must not be the side that closes first, or the next POST races the close ("server disconnected").
    One connection, a request, 6 s idle (past uvicorn's default 5 s), another request on the same socket."""
    import http.client
    import time

    from nemo_polar.proxy.app import ProxyConfig
    from nemo_polar.proxy.serve import ProxyServer

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
