"""Start and stop a real vLLM server for the project's models.

The engine runs from its own virtualenv (``make setup`` builds it under ``$POLAR_CACHE/engine``); this
module only builds the command line, spawns it in its own process group and waits for ``/health``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from nemo_polar.engine.families import read_family_file, served_trait, stand_ins
from nemo_polar.paths import cache_dir, run_dir

SMOLLM2 = "smollm2-135m-instruct"  # real weights with the project's ChatML template, 8k context
VLLM_PLUGINS = Path(__file__).parent / "vllm_plugins"  # on the engine's PYTHONPATH
FORCED_TOKENS = "polar_forced_tokens:ForcedTokens"


def known_models() -> dict[str, int]:
    """The models ``make setup`` builds, by name, with their context lengths: every family's stand-in (tiny-qwen3
    must hold a full harness request: Codex/Claude/Qwen send 12-20k tokens) and SmolLM2."""
    return {**{name: f.max_model_len for name, f in stand_ins().items()}, SMOLLM2: 8192}


_handed_out: set[int] = set()
_handed_out_lock = threading.Lock()
PORT_HOLD_S = 600  # how long a port handed out stays promised: a server binds it within its start-up time


def free_port() -> int:
    """A free loopback TCP port (for engines and servers started by tests, benches and the demo).

    Never the same port twice in one process, nor to two processes sharing the run directory within
    ``PORT_HOLD_S``: the kernel may hand a just-released port out again, and a port is only bound once its server
    has started (an engine's, tens of seconds later), so every port promised is kept in ``run/ports.json`` under a
    file lock until its hold ends."""
    with _handed_out_lock, (run_dir() / "ports.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        held_file = run_dir() / "ports.json"
        now = time.time()
        try:
            held = {int(p): t for p, t in json.loads(held_file.read_text()).items() if t > now}
        except (OSError, ValueError, AttributeError):
            held = {}  # none yet, or unreadable: the in-process set still holds this process's own
        while True:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            if port not in _handed_out and port not in held:
                _handed_out.add(port)
                held[port] = now + PORT_HOLD_S
                tmp = held_file.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_text(json.dumps(held))
                tmp.replace(held_file)
                return port


def has_gpu() -> bool:
    return (
        shutil.which("nvidia-smi") is not None
        and subprocess.run(["nvidia-smi", "-L"], capture_output=True, check=False).returncode == 0
    )


def engine_python() -> Path:
    """The interpreter of the engine virtualenv (override with ``POLAR_ENGINE_PYTHON``)."""
    override = os.environ.get("POLAR_ENGINE_PYTHON")
    if override:
        return Path(override)
    flavour = "cuda" if has_gpu() else "cpu"
    return cache_dir() / "engine" / f"vllm-{flavour}" / "bin" / "python"


def resolve_model(model: str) -> tuple[Path, str, int | None]:
    """``(directory, served name, max_model_len)`` for a known model name or a model directory."""
    known = known_models()
    if model in known:
        path = cache_dir() / "models" / model
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"model {model!r} is not built at {path}: run `make setup`")
        return path, model, known[model]
    path = Path(model).expanduser().resolve()
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{model!r} is neither a known model ({', '.join(known)}) nor a model directory")
    return path, path.name, None


# vLLM's API server, run as ``-m vllm.entrypoints.openai.api_server`` would run it, from ``-c``: its engine core is a
# spawned process, and spawn re-imports a ``-m`` parent's main module in the child first (the whole API server:
# FastAPI, the OpenAI routes), which the engine core never uses. ~4 s of CPU less per engine start here (47 s instead
# of 51 s, tiny-llama3).
API_SERVER = (
    "import runpy, sys; sys.argv[0] = 'vllm.entrypoints.openai.api_server'; "
    "runpy.run_module('vllm.entrypoints.openai.api_server', run_name='__main__', alter_sys=False)"
)


@dataclass
class EngineSpec:
    model: str = "tiny-qwen3"
    port: int = 8011
    host: str = "127.0.0.1"
    max_model_len: int | None = None
    max_logprobs: int = 20
    tool_call_parser: str | None = None  # None: the model family's (its polar-family.json), else hermes
    reasoning_parser: str | None = None  # None: the model family's, if it names one
    kv_cache_gib: int = 1
    dtype: str | None = None
    weight_sync: bool = False
    nice: int = 0  # > 0: the engine yields the CPU to the proxy on a shared machine (see set_niceness)
    extra_args: list[str] = field(default_factory=list)

    def command(self) -> tuple[list[str], dict[str, str]]:
        path, name, default_len = resolve_model(self.model)
        cmd = [
            str(engine_python()),
            "-c",
            API_SERVER,
            "--model",
            str(path),
            "--served-model-name",
            name,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--max-logprobs",
            str(self.max_logprobs),
        ]
        family = read_family_file(path)
        # A family whose template renders no tools names no parser (the proxy refuses tools requests to it).
        tool_parser = self.tool_call_parser or served_trait(family, "tool_call_parser")
        if tool_parser:
            cmd += ["--enable-auto-tool-choice", "--tool-call-parser", tool_parser]
        reasoning = self.reasoning_parser or served_trait(family, "reasoning_parser")
        if reasoning:
            # With a reasoning parser vLLM applies structured outputs only once reasoning has ended; the scripted
            # policy constrains a whole sample, its reasoning included (Qwen3.5's prompt opens "<think>" itself).
            structured = json.dumps({"enable_in_reasoning": True})
            cmd += ["--reasoning-parser", reasoning, "--structured-outputs-config", structured]
        max_len = self.max_model_len or default_len
        if max_len:
            cmd += ["--max-model-len", str(max_len)]
        template = path / "chat_template.jinja"
        if template.exists():
            cmd += ["--chat-template", str(template)]
        gpu = has_gpu()
        if not gpu:
            cmd.append("--enforce-eager")  # CPU: skip torch.compile, ready in ~20 s instead of ~60 s
        # CPUs without native bf16 arithmetic (AVX2) run an fp32 engine several times faster than a bf16 one (10k-token
        # prefill of tiny-qwen3 here: 17.1 s in bf16, 12.6 s in fp32), and fp32 matches a CPU trainer's numerics.
        dtype = self.dtype or (None if gpu else "float32")
        if dtype:
            cmd += ["--dtype", dtype]
        # The scripted policy's exact tokens (engine/vllm_plugins/polar_forced_tokens.py); unused by other requests.
        # vLLM refuses custom logits processors beside speculative decoding: such an engine serves no scripts.
        if not any(a.startswith("--speculative-config") for a in self.extra_args):
            cmd += ["--logits-processors", FORCED_TOKENS]
        cmd += self.extra_args
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(VLLM_PLUGINS), env.get("PYTHONPATH")) if p)
        env.update(HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", TOKENIZERS_PARALLELISM="false")
        if self.weight_sync:
            # vLLM's in-place weight reload (/collective_rpc reload_weights, /reset_prefix_cache) is served only in
            # its dev mode. The engine listens on loopback and only the proxy and the trainer reach it: a sandboxed
            # agent reaches the proxy's model listener, never the engine.
            env["VLLM_SERVER_DEV_MODE"] = "1"
        if not gpu:
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self.kv_cache_gib))
            # One process fewer: the model runs in the engine core's process instead of a worker of its own (vLLM's
            # uniprocess executor). It starts in 40 s instead of 62 s here (each process imports vLLM and torch) and
            # prefills a 10k-token prompt in 17 s instead of 26 s (no second process contending for two cores).
            env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            # Eager means eager: vLLM still wraps some CPU ops in torch.compile, and dynamo compiles them again for
            # each new shape. Two scripted CLI sessions (Codex, Claude Code) here: engine CPU 14.0 s -> 9.4 s, the
            # sessions' wall time 41 s -> 20 s.
            env.setdefault("TORCHDYNAMO_DISABLE", "1")
            # OpenMP threads sleep when a parallel region ends instead of spinning for the next: a CPU engine shares
            # its cores with the proxy, the CLIs and the grader (the same sessions: engine CPU 9.4 s -> 7.0 s).
            env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        return cmd, env

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


class EngineProcess:
    """A running vLLM server owned by this process (or adopted from a pid file)."""

    def __init__(self, spec: EngineSpec, log_path: Path | None = None) -> None:
        self.spec = spec
        self.log_path = log_path or run_dir() / f"engine-{spec.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 300.0) -> str:
        cmd, env = self.spec.command()
        if not Path(cmd[0]).exists():
            raise FileNotFoundError(f"engine interpreter {cmd[0]} not found: run `make setup`")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            if self.spec.nice:  # before vLLM starts its engine core and workers: they inherit it
                set_niceness(self.proc.pid, self.spec.nice)
            wait_healthy(self.spec.url, timeout, self.proc, self.log_path)
        except BaseException:
            self.stop()
            raise
        return self.spec.url

    def stop(self, timeout: float = 30.0) -> None:
        if self.proc is None:
            return
        stop_group(self.proc, timeout)
        self.proc.wait(timeout=5)
        self.proc = None

    def __enter__(self) -> EngineProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def set_niceness(pid: int, nice: int) -> None:
    """Lower the CPU priority of ``pid`` (the leader of its own session) and of what it starts later.

    On a machine where the engine and the proxy share a few cores, vLLM's engine core and workers keep them busy
    and the proxy's short per-request work (parsing, the render) waits for a core: the proxy's p95 time to first
    delta was 1.3-30x the engine's own. Linux schedules sessions as autogroups and shares the CPU *between*
    autogroups regardless of the threads' own nice values, so both are set: the autogroup's nice (where the kernel
    has autogroups) and the process's own (everywhere else); threads and children started afterwards inherit both."""
    os.setpriority(os.PRIO_PROCESS, pid, nice)
    autogroup = Path(f"/proc/{pid}/autogroup")
    if autogroup.exists():
        with contextlib.suppress(OSError):  # autogroups switched off (sched_autogroup_enabled=0)
            autogroup.write_text(str(nice))


def wait_healthy(
    url: str,
    timeout: float,
    proc: subprocess.Popen[bytes] | subprocess.Popen[str] | None = None,
    log: Path | None = None,
    name: str = "vLLM",
) -> None:
    """Wait for ``url``/health; ``name`` is the process waited on and ``log`` its output, shown if it exits."""
    deadline = time.monotonic() + timeout
    # One client for the whole wait: each new httpx client loads the CA bundle into an SSL context (~50 ms of CPU).
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                tail = log.read_text(errors="replace")[-3000:] if log else "(no log)"
                raise RuntimeError(f"{name} exited with code {proc.returncode} before becoming healthy:\n{tail}")
            try:
                if client.get(f"{url}/health").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
    raise TimeoutError(f"{name} at {url} not healthy after {timeout:.0f} s (log: {log})")


def stop_group(proc: subprocess.Popen[bytes] | int, timeout: float = 30.0) -> None:
    """SIGTERM the process group, then SIGKILL whatever is left after ``timeout``.

    Pass the ``Popen`` of a child this process started: it is reaped as soon as it exits. An unreaped leader stays
    a zombie inside its group, and the group would look alive until the timeout ran out on every stop.
    """
    pid = proc if isinstance(proc, int) else proc.pid
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not isinstance(proc, int):
            proc.poll()
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


# -- detached engines for the `polar engine up|down` commands ------------------------------------------


def _pid_file(port: int) -> Path:
    return run_dir() / f"engine-{port}.json"


def up(spec: EngineSpec, timeout: float = 300.0) -> str:
    engine = EngineProcess(spec)
    url = engine.start(timeout)
    assert engine.proc is not None
    _pid_file(spec.port).write_text(json.dumps({"pid": engine.proc.pid, "url": url, "model": spec.model}))
    engine.proc = None  # detach: the server outlives this command
    return url


def down(port: int | None = None) -> list[str]:
    files = [_pid_file(port)] if port else sorted(run_dir().glob("engine-*.json"))
    stopped = []
    for f in files:
        if not f.exists():
            continue
        info = json.loads(f.read_text())
        stop_group(int(info["pid"]))
        f.unlink()
        stopped.append(info["url"])
    return stopped


if __name__ == "__main__":  # pragma: no cover - debugging aid
    print(" ".join(EngineSpec(model=sys.argv[1] if len(sys.argv) > 1 else "tiny-qwen3").command()[0]))
