"""Helpers shared by the three API adapters."""

from __future__ import annotations

import json
import time
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from nemo_polar.proxy.errors import bad_request

T = TypeVar("T", bound=BaseModel)


class Loose(BaseModel):
    """Request models check the types of the fields the proxy uses and keep every other field as sent."""

    model_config = ConfigDict(extra="allow")


def validate(model: type[T], body: Any) -> T:
    if not isinstance(body, dict):
        raise bad_request("request body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise bad_request(f"invalid request: {where}: {first['msg']}", param=where) from None


def sse(data: Any, event: str | None = None) -> str:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n"


def now() -> int:
    return int(time.time())


def as_stop_list(stop: Any, param: str) -> list[str] | None:
    if stop is None:
        return None
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return list(stop)
    raise bad_request(f"{param} must be a string or a list of strings", param=param)
