"""Shared bench plumbing: a real engine, the proxy in its own process (like in production), percentiles."""

from __future__ import annotations

import math
import os
import secrets
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from nemo_polar.engine.launcher import EngineProcess, EngineSpec, free_port, set_niceness, stop_group, wait_healthy
from nemo_polar.proxy.http.client import ProxyClient

_ENGINE_PIDS: dict[str, int] = {}


@contextmanager
def engine(model: str = "tiny-qwen3") -> Iterator[str]:
    """``POLAR_BENCH_ENGINE_URL`` (and ``POLAR_BENCH_ENGINE_PID``) reuses a running engine; otherwise one is
    started for the run."""
    if os.environ.get("POLAR_BENCH_ENGINE_URL"):
        yield os.environ["POLAR_BENCH_ENGINE_URL"]
        return
    with EngineProcess(EngineSpec(model=model, port=free_port())) as proc:
        assert proc.proc is not None
        _ENGINE_PIDS[proc.spec.url] = proc.proc.pid
        yield proc.spec.url


def engine_pid(url: str) -> int:
    """The process (session leader) of the engine serving ``url``."""
    if url in _ENGINE_PIDS:
        return _ENGINE_PIDS[url]
    if url == os.environ.get("POLAR_BENCH_ENGINE_URL") and os.environ.get("POLAR_BENCH_ENGINE_PID"):
        return int(os.environ["POLAR_BENCH_ENGINE_PID"])
    raise SystemExit(f"the engine at {url} was not started by this bench: set POLAR_BENCH_ENGINE_PID")


def priorities(engine_url: str, nice: int, reps: int) -> Iterator[int]:
    """The engine's niceness for each of ``2 * reps`` repetitions, alternating ABBA between its default priority (0)
    and ``nice`` (as ``polar engine up --nice`` sets it) so that drift over the run hits both alike; each is set
    before it is yielded, and the default is restored after."""
    pid = engine_pid(engine_url)
    try:
        for value in ([0, nice, nice, 0] * ((reps + 1) // 2))[: 2 * reps]:
            set_niceness(pid, value)
            yield value
    finally:
        set_niceness(pid, 0)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int | str = "self") -> float:
    """Resident set size of a process (Linux /proc), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


@contextmanager
def proxy(engine_url: str, cpu: dict[str, float] | None = None) -> Iterator[ProxyClient]:
    """Run ``polar proxy`` as a separate process, as a deployment would (model and admin listeners)."""
    port, admin_port, token = free_port(), free_port(), secrets.token_urlsafe(24)
    records = Path(tempfile.mkdtemp(prefix="polar-bench-"))
    if cpu is not None:
        cpu["record_dir"] = records  # type: ignore[assignment]
    cmd = [
        sys.executable,
        "-m",
        "nemo_polar.cli",
        "proxy",
        "--engine-url",
        engine_url,
        "--port",
        str(port),
        "--record-dir",
        str(records),
        "--model-alias",
        "local-model",
        "--admin-port",
        str(admin_port),
        "--workers",
        "1",  # one process: the benches read its CPU by its pid
    ]
    log = records / "proxy.log"
    with log.open("wb") as out:  # the token by environment: argv is readable by every local user
        env = {**os.environ, "POLAR_ADMIN_TOKEN": token}
        proc = subprocess.Popen(cmd, start_new_session=True, stdout=out, stderr=subprocess.STDOUT, env=env)
    if cpu is not None:
        cpu["proxy_pid"] = proc.pid
    client = ProxyClient(url=f"http://127.0.0.1:{port}", admin_url=f"http://127.0.0.1:{admin_port}", admin_token=token)
    try:
        wait_healthy(client.url, 60, proc, log, name="polar proxy")
        start = cpu_seconds(proc.pid)
        yield client
        if cpu is not None:
            cpu["proxy_cpu_s"] = cpu_seconds(proc.pid) - start
    finally:
        stop_group(proc, 10)
        proc.wait()


def new_session(proxy: ProxyClient, **config: object) -> str:
    return proxy.create_session(config)[1]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def fit_exponent(points: list[tuple[float, float]]) -> float:
    """Slope of log(cost) against log(size): 0 flat, 1 linear, 2 quadratic."""
    xs, ys = [math.log(x) for x, _ in points], [math.log(max(y, 1e-9)) for _, y in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def fit_at(points: list[tuple[float, float]], size: float) -> float:
    """The power law ``fit_exponent`` fits to ``points``, at ``size``: a figure from every point rather than one."""
    xs, ys = [math.log(x) for x, _ in points], [math.log(max(y, 1e-9)) for _, y in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return math.exp(my + fit_exponent(points) * (math.log(size) - mx))


def report(bench: str, figures: dict[str, float | int | str], line: str) -> None:
    """Print the bench's figure as its last line and, when ``POLAR_BENCH_RESULTS`` names a JSON file (``make
    bench``), merge ``figures`` into it under the bench's name."""
    import json

    path = os.environ.get("POLAR_BENCH_RESULTS")
    if path:
        target = Path(path)
        data = json.loads(target.read_text()) if target.exists() else {}
        data[bench] = {"figures": figures, "line": line}
        target.write_text(json.dumps(data, indent=2) + "\n")
    print(line)
