"""New weights into a running vLLM engine, in place: the trainer writes a checkpoint directory, the engine reloads
it (vLLM's ``reload_weights`` worker method over ``/collective_rpc``) and drops its prefix cache, whose KV entries
were computed by the old weights. The engine must run with ``EngineSpec(weight_sync=True)``.

The caller holds generations off around it: the proxy's ``pause`` drains its in-flight calls first, and the
engine's own ``/pause`` (mode ``wait``) covers any other client, so no request samples from half-loaded weights.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx


class WeightSyncError(RuntimeError):
    pass


def _post(client: httpx.Client, url: str, **kw: object) -> httpx.Response:
    resp = client.post(url, **kw)  # type: ignore[arg-type]
    if resp.status_code == 404:
        raise WeightSyncError(f"{url}: not served; start the engine with weight_sync=True (vLLM dev mode)")
    if resp.status_code >= 400:
        raise WeightSyncError(f"{url} -> {resp.status_code}: {resp.text[:500]}")
    return resp


def load_weights(engine_url: str, checkpoint: Path, timeout_s: float = 300.0) -> float:
    """Reload the engine's weights from ``checkpoint`` (a directory of safetensors); returns the seconds it took."""
    if not any(checkpoint.glob("*.safetensors")):
        raise WeightSyncError(f"{checkpoint}: no *.safetensors to load")
    start = time.monotonic()
    with httpx.Client(base_url=engine_url, timeout=timeout_s) as client:
        _post(client, "/pause", params={"mode": "wait"})
        try:
            body = {"method": "reload_weights", "kwargs": {"weights_path": str(checkpoint.resolve())}}
            _post(client, "/collective_rpc", json=body)
            _post(client, "/reset_prefix_cache")
        finally:
            _post(client, "/resume")
    return time.monotonic() - start
