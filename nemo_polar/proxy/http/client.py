"""The proxy as its operators use it: where harnesses reach the model API, and the admin API behind its token.

``url`` is the model listener (the provider APIs; the only address a sandbox's relay forwards to), ``admin_url`` the
control listener (sessions, records, weight sync, metrics). They are separate listeners so that nothing an agent can
send from inside a sandbox reaches a control route.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import httpx
from pydantic import BaseModel, Field

from nemo_polar.proxy.store.records import CallRecord

_local = threading.local()
_ssl_lock = threading.Lock()
_ssl: list[object] = []  # the one SSL context every thread's client reuses, made on first use


def thread_client() -> httpx.Client:
    """This thread's pooled HTTP client, for admin calls and load generators alike. One per thread, not one shared:
    httpcore's sync pool, used by many threads, can close a connection it has just handed to another (closing a
    surplus or expired idle one: encode/httpcore#1110, httpcore 1.0.9), which failed 2-6 of 1,000 concurrent
    sessions with EBADF in bench.capacity. The clients share one SSL context (building one costs ~30 ms of CPU, more
    than a lightweight session). Module-level, so a ProxyClient stays a plain picklable model (Ray)."""
    client = getattr(_local, "client", None)
    if client is None:
        with _ssl_lock:
            if not _ssl:
                _ssl.append(httpx.create_ssl_context())
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        client = _local.client = httpx.Client(verify=_ssl[0], limits=limits)  # type: ignore[arg-type]
    return client


class ProxyClient(BaseModel):
    url: str = Field(description="the model API (what harnesses call), as the host reaches it")
    admin_url: str = Field(description="the admin API: sessions, records, pause/resume, metrics")
    admin_token: str | None = Field(
        default_factory=lambda: os.environ.get("POLAR_ADMIN_TOKEN") or None,
        description="the admin API's bearer token; by default $POLAR_ADMIN_TOKEN (a secret never needs argv)",
    )

    def _headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.admin_token}"} if self.admin_token else {}

    def _request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            kw.setdefault("timeout", 30)
            resp = thread_client().request(method, f"{self.admin_url}{path}", headers=self._headers(), **kw)
        except httpx.HTTPError as exc:
            raise ConnectionError(f"proxy admin API at {self.admin_url} is unreachable: {exc}") from None
        if resp.status_code >= 400:
            raise RuntimeError(f"proxy {method} {path} -> {resp.status_code}: {resp.text[:500]}")
        return resp

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        return self._request(method, path, **kw).json()

    def metrics(self, timeout_s: float = 30) -> str:
        """The proxy's Prometheus metrics, in the text format."""
        return self._request("GET", "/metrics", timeout=timeout_s).text

    def create_session(self, config: dict[str, Any]) -> tuple[str, str]:
        made = self._call("POST", "/polar/sessions", json=config)
        return made["session_id"], made["api_key"]

    def records(self, session_id: str) -> list[CallRecord]:
        return [CallRecord.model_validate(r) for r in self._call("GET", f"/polar/sessions/{session_id}/records")]

    def close(self, session_id: str) -> None:
        self._call("DELETE", f"/polar/sessions/{session_id}")

    def health(self) -> dict[str, Any]:
        """The admin listener's health: sessions, paused, policy version, in-flight generations."""
        return self._call("GET", "/health")

    def pause(self, timeout_s: float, keep: bool = False) -> dict[str, Any]:
        body = {"timeout_s": timeout_s, "keep": keep}
        return self._call("POST", "/polar/pause", json=body, timeout=timeout_s + 30)

    def resume(self, policy_version: int | None = None) -> dict[str, Any]:
        return self._call("POST", "/polar/resume", json={"policy_version": policy_version})
