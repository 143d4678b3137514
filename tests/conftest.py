"""Shared fixtures: one real vLLM engine per test session, and proxies served over real HTTP.

Set ``POLAR_TEST_ENGINE_URL`` to reuse an engine that is already running (it must serve ``tiny-qwen3``).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from nemo_polar.engine.launcher import EngineProcess, EngineSpec, free_port
from nemo_polar.env.frontends.patterns import harness_order
from nemo_polar.env.gym import ENVIRONMENTS
from nemo_polar.proxy.http.app import ProxyApps
from nemo_polar.proxy.http.client import ProxyClient
from nemo_polar.proxy.http.config import ProxyConfig
from nemo_polar.proxy.http.serve import ProxyServer
from tests.helpers.clients import loopback

ROOT = Path(__file__).resolve().parents[1]
# The harnesses with a Polar environment (polar_<harness>): the paper's four, then those added since.
ENV_HARNESSES = tuple(sorted((env.removeprefix("polar_") for env in ENVIRONMENTS), key=harness_order().__getitem__))
FIXTURES = ROOT / "tests" / "fixtures" / "harness_requests"
TASKS = ROOT / "examples" / "tasks" / "swebench5"  # real projects' bugs, as a SWE-bench 5 task repo


def _start_engine(model: str) -> Iterator[str]:
    engine = EngineProcess(EngineSpec(model=model, port=free_port()))
    try:
        yield engine.start(timeout=600)
    finally:
        engine.stop()


def pytest_configure(config: pytest.Config) -> None:
    from tests.helpers.durations import Durations

    worker = getattr(config, "workerinput", {}).get("workerid")  # set in a pytest-xdist worker
    config.pluginmanager.register(Durations(worker), "polar-durations")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def engine_url() -> Iterator[str]:
    """The real vLLM engine serving tiny-qwen3 (random weights, real Qwen tokenizer)."""
    if os.environ.get("POLAR_TEST_ENGINE_URL"):
        yield os.environ["POLAR_TEST_ENGINE_URL"]
        return
    yield from _start_engine("tiny-qwen3")


@pytest.fixture(scope="session")
def model_dir(engine_url: str) -> str:
    """The shared engine's model directory (its tokenizer and template)."""
    return loopback.get(f"{engine_url}/v1/models", timeout=10).json()["data"][0]["root"]


@pytest.fixture(scope="module")
def smollm2_url() -> Iterator[str]:
    """The real vLLM engine serving SmolLM2-135M-Instruct (real weights: real text). Module-scoped: it is stopped
    after the module that uses it, so it does not compete with the shared engine for the rest of the run."""
    yield from _start_engine("smollm2-135m-instruct")


@dataclass
class ProxyHandle:
    """A proxy served over real HTTP: ``url`` is its model API, ``admin_url`` its admin API (token required)."""

    url: str
    admin_url: str
    admin_token: str
    record_dir: Path
    apps: ProxyApps

    def client(self) -> ProxyClient:
        return ProxyClient(url=self.url, admin_url=self.admin_url, admin_token=self.admin_token)

    def admin(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """An admin API call with the admin token."""
        kw.setdefault("timeout", 10)
        headers = {"authorization": f"Bearer {self.admin_token}", **kw.pop("headers", {})}
        return loopback.request(method, f"{self.admin_url}{path}", headers=headers, **kw)

    def session(self, **config: Any) -> dict[str, str]:
        resp = self.admin("POST", "/polar/sessions", json=config)
        resp.raise_for_status()
        return resp.json()

    def records(self, session_id: str) -> list[dict[str, Any]]:
        resp = self.admin("GET", f"/polar/sessions/{session_id}/records")
        resp.raise_for_status()
        return resp.json()

    def wait_for_local_renderer(self, timeout_s: float = 120) -> None:
        """Call until the proxy has adopted its in-process renderer (verified against the engine in the background,
        started by the first call), so a test's first render is the same whichever tests ran before it."""
        session = self.session(sampling_overrides={"max_tokens": 1})
        body = {"model": "local-model", "messages": [{"role": "user", "content": "hi"}]}
        headers = {"authorization": f"Bearer {session['api_key']}"}
        deadline = time.monotonic() + timeout_s
        while self.apps.proxy.renderer.name != "local":
            loopback.post(f"{self.url}/v1/chat/completions", json=body, headers=headers, timeout=60).raise_for_status()
            assert time.monotonic() < deadline, "the proxy never adopted its local renderer"
            time.sleep(0.2)

    def disk_records(self, session_id: str) -> list[dict[str, Any]]:
        path = self.record_dir / f"{session_id}.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def make_proxy(engine: str, tmp: Path, **config: Any) -> Iterator[ProxyHandle]:
    cfg = ProxyConfig(engine_url=engine, record_dir=tmp, model_aliases=["local-model"], **config)
    with ProxyServer(cfg) as server:
        yield ProxyHandle(server.url, server.admin_url, server.admin_token, tmp, server.apps)


@pytest.fixture(scope="session")
def proxy(engine_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyHandle]:
    for handle in make_proxy(engine_url, tmp_path_factory.mktemp("records")):
        handle.wait_for_local_renderer()
        yield handle


@pytest.fixture(scope="session")
def scripted_sessions(
    request: pytest.FixtureRequest, proxy: ProxyHandle, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    """Each harness's scripted session, run once for every test that reads it (tests/helpers/sessions.py)."""
    from tests.helpers.sessions import ScriptedSessions, harnesses_read

    sessions = ScriptedSessions(proxy, tmp_path_factory.mktemp("scripted"), harnesses_read(request.session))
    yield sessions
    sessions.ahead.close()


def load_fixture(harness: str, name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / harness / name).read_text())


def all_fixtures() -> list[tuple[str, str]]:
    return sorted((p.parent.name, p.name) for p in FIXTURES.glob("*/*.json"))


@pytest.fixture(scope="session")
def images() -> dict[str, Any]:
    """The swebench5 task images, built once and cached by their Dockerfiles (scripts/build_swebench5_images.sh):
    instance id -> SWEInstance."""
    from nemo_polar.rewards.datasets import select_instances

    done = subprocess.run(["bash", str(ROOT / "scripts" / "build_swebench5_images.sh")], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return {i.instance_id: i for i in select_instances(TASKS)}


# make test runs in two worker processes, one per core (pytest-xdist): a worker takes a whole module at a time, so
# module fixtures (a family's engine, sessions run ahead) start once, and the longest modules go first, so that the
# workers end together; a module that reads another's session fixture (the scripted sessions) goes with it. The
# measured times are in $POLAR_TEST_LOG/modules.tsv; the order only balances the workers, no verdict depends on it.
# The modules that start engines of their own (test_learn also its trainer: ~2 GB each) run one after another in one
# worker, early, beside the families (whose worker has the one shared engine up yet): run side by side, and beside both
# workers' shared engines, they took this 23 GB machine out of memory.
OWN_ENGINES = "own engines"
WITH_MODULE = {
    "test_token_entries": "test_harness",  # reads test_harness's scripted sessions (scripted_sessions)
    "test_learn": OWN_ENGINES,
    "test_quickstart": OWN_ENGINES,
    "test_real_text": OWN_ENGINES,
}
LONGEST_FIRST = (
    "test_model_families",
    OWN_ENGINES,
    "test_patterns",
    "test_swebench5",
    "test_harness",
    "test_rewards",
    "test_gym",
)


def worker_unit(nodeid: str) -> str:
    """What one worker runs whole: the test's module, or the module whose session fixture it reads."""
    module = Path(nodeid.split("::", 1)[0]).stem
    return WITH_MODULE.get(module, module)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class WholeModules(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return worker_unit(nodeid)

    return WholeModules(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests parametrized over a model family (the ``family`` fixture, one family's engine at a time) run family by
    family, whichever test function they belong to, so each family's engine starts once: their items are put back
    into the same slots, grouped by family in order of first appearance. In workers, the longest modules come first."""
    slots = [i for i, item in enumerate(items) if "family" in getattr(getattr(item, "callspec", None), "params", {})]
    chosen = [items[i] for i in slots]
    order = list(dict.fromkeys(item.callspec.params["family"] for item in chosen))  # type: ignore[attr-defined]
    grouped = sorted(chosen, key=lambda item: order.index(item.callspec.params["family"]))  # type: ignore[attr-defined]
    for slot, item in zip(slots, grouped, strict=True):
        items[slot] = item
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the controller schedules in this order
        rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
        items.sort(key=lambda item: rank.get(worker_unit(item.nodeid), len(rank)))
