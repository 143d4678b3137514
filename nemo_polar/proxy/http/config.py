"""The proxy's configuration: one engine, its session defaults, the record directory, the admin token."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from nemo_polar.proxy.store.records import Mode


def new_admin_token() -> str:
    """A random admin token. Prefixed, so it never starts with "-" (a bare token_urlsafe does, one time in 64, and
    `--proxy-admin-token <token>` then reads as an unknown option)."""
    return f"polar-admin-{secrets.token_urlsafe(24)}"


def spare_cores() -> int:
    """The cores this process may run on, less one for the rest of the node (the engine's own CPU processes, the
    gateway, the harnesses' relays); at least one."""
    return max(1, len(os.sched_getaffinity(0)) - 1)


class ProxyConfig(BaseModel):
    engine_url: str
    default_mode: Mode = "continuation"
    record_dir: Path | None = None
    max_body_bytes: int = Field(default=32 * 1024 * 1024, ge=1024)
    keepalive_s: float = Field(default=5.0, gt=0, description="SSE keep-alive interval while the engine is silent")
    model_aliases: list[str] = Field(default_factory=list)
    eot_token: str | None = Field(
        default=None,
        description="the token that ends a turn; None: the one the model directory's polar-family.json names, "
        "else <|im_end|>",
    )
    admin_token: str = Field(
        default_factory=new_admin_token,
        min_length=8,
        description="bearer token of the admin API; random unless given (ProxyServer.admin_token, printed by the CLI)",
    )

    @field_validator("admin_token", mode="before")
    @classmethod
    def _random_unless_given(cls, value: Any) -> Any:
        return new_admin_token() if value is None else value

    tool_call_parser: str | None = Field(
        default=None,
        description="vLLM's name for the model's tool-call format; None: the one the model directory's "
        "polar-family.json names, else hermes/qwen3_coder (read in process)",
    )
    reasoning_parser: str | None = Field(default=None, description="likewise for reasoning")
    policy_version: int | None = Field(default=None, description="stamped on records until a resume changes it")
    render: Literal["auto", "engine"] = Field(
        default="auto", description="auto: render in-process when verified identical to the engine's /tokenize"
    )
    served_model: str | None = Field(
        default=None,
        description="the engine's model name when it serves no /v1/models (NeMo-RL's vLLM HTTP server); "
        "otherwise the engine's own model list is used",
    )
    freeze_heap: bool = Field(
        default=False,
        description="the proxy owns its process (`polar proxy`): freeze the start-up heap (settle_heap). Off where "
        "it runs inside another program, whose objects a freeze would keep from ever being collected",
    )
    trim_heap_s: float | None = Field(
        default=10.0,
        gt=0,
        description="every this many seconds, return the memory the allocator holds free to the system (trim_heap); "
        "None: never",
    )
    workers: int | None = Field(
        default=None,
        ge=1,
        le=256,
        description="proxy worker processes `polar proxy` starts on this node, each a whole proxy on its own ports, "
        "a session pinned to one (ProxyPool); None: one per spare core (spare_cores)",
    )
    worker: int | None = Field(
        default=None,
        ge=0,
        le=255,
        description="this process's index in a pool of workers (set by the pool, not by hand): the first byte of "
        "its session ids, so a session id names its worker",
    )

    helper_threads: bool | None = Field(
        default=None,
        description="render what a call adds to its session's history, and build its record's line, in threads "
        "beside the event loop (a whole history's render and every fsync always run in threads): that gains only "
        "where a core is spare for them; on busy cores each hand-off waits for one (measured: two workers on two "
        "cores ~15% faster without). None: threads where the machine's cores outnumber the proxy's processes",
    )

    def uses_helper_threads(self) -> bool:
        """``helper_threads``, or whether this machine's cores outnumber the proxy's processes (this one, or its
        pool's ``workers`` when it is a worker of one)."""
        if self.helper_threads is not None:
            return self.helper_threads
        processes = self.workers if self.worker is not None and self.workers else 1
        return len(os.sched_getaffinity(0)) > processes

    def worker_count(self) -> int:
        """How many worker processes to start: ``workers``, else one per spare core."""
        return self.workers or spare_cores()
