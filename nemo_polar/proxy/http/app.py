"""The proxy's two ASGI apps over one engine client and session store: the model API that harnesses (and so
sandboxed agents) reach, and the admin API for sessions, records, weight sync and metrics on a listener of its own."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import FastAPI

from nemo_polar.proxy.http.admin import admin_app
from nemo_polar.proxy.http.config import ProxyConfig
from nemo_polar.proxy.http.proxy import Proxy
from nemo_polar.proxy.http.routes import model_app
from nemo_polar.proxy.render.renderer import (
    preload_tokenizers,
)
from nemo_polar.proxy.store.sessions import SessionConfig


@dataclass(frozen=True)
class ProxyApps:
    """The proxy's two ASGI apps over one :class:`Proxy`, served on separate listeners.

    ``model`` is the data plane: the provider APIs a harness calls with its session key, ``/v1/models`` and a bare
    ``/health``; it is the only listener a sandbox's relay ever forwards to, so nothing an agent sends can reach a
    control route. ``admin`` is the control plane: sessions and their records, weight sync (pause/resume), metrics
    and the full health state, every route behind the admin bearer token.
    """

    proxy: Proxy
    model: FastAPI
    admin: FastAPI


def create_apps(
    config: ProxyConfig, *, api_key: str | None = None, session_config: SessionConfig | None = None
) -> ProxyApps:
    """Build both apps; ``api_key`` pre-creates one session with that key (handy for running a CLI by hand)."""
    if config.render == "auto":
        preload_tokenizers()  # here, not lazily on the first call: see preload_tokenizers
    proxy = Proxy(config)
    if api_key:
        proxy.sessions.create(session_config or SessionConfig(mode=config.default_mode), api_key=api_key)
    return ProxyApps(proxy, model_app(proxy), admin_app(proxy))
