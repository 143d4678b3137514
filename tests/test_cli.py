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
    port = free_port()
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
        "--api-key",
        "sk-cli",
    ]
    proc = subprocess.Popen(cmd, start_new_session=True)
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
    finally:
        stop_group(proc.pid, 10)
        proc.wait()


def test_polar_proxy_requires_an_engine_url() -> None:
    out = subprocess.run([sys.executable, "-m", "nemo_polar.cli", "proxy"], capture_output=True, text=True)
    assert out.returncode != 0 and "--engine-url" in out.stderr
