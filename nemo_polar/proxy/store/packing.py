"""How records pack token ids and texts (zlib-compressed, as base64) and digest prompts (SHA-256 of little-endian
int32), and the running digests that let a writer hash only what a prompt adds."""

from __future__ import annotations

import base64
import hashlib
import sys
import zlib
from array import array
from typing import Any


def int32le(ids: list[int]) -> bytes:
    """The ids as little-endian int32 bytes."""
    packed = array("i", ids)
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tobytes()


def prompt_digest(ids: list[int]) -> str:
    """SHA-256 of the ids as little-endian int32: what a stored prompt is checked against when rebuilt."""
    return hashlib.sha256(int32le(ids)).hexdigest()


def pack_ids(ids: list[int]) -> str:
    """Token ids as base64 of zlib-compressed little-endian int32: ~2-2.5 bytes a token of real text on disk, where
    a JSON list takes ~4.6 (and 7 for ids past 100k)."""
    return _deflate(int32le(ids))


def unpack_ids(text: str) -> list[int]:
    raw = _inflate(text)
    if len(raw) % 4:
        raise ValueError("packed ids are not a whole number of int32")
    ids = array("i")
    ids.frombytes(raw)
    if sys.byteorder != "little":
        ids.byteswap()
    return ids.tolist()


def _deflate(raw: bytes) -> str:
    return base64.b64encode(zlib.compress(raw, 6)).decode("ascii")


def _inflate(packed: str) -> bytes:
    try:
        return zlib.decompress(base64.b64decode(packed, validate=True))
    except zlib.error as exc:
        raise ValueError(f"does not decompress: {exc}") from None


def pack_text(text: str) -> str:
    """An ASCII text zlib-compressed, as base64 (a tool's output or a file a harness resends: 2-4x smaller)."""
    return _deflate(text.encode("ascii"))


def unpack_text(packed: str) -> str:
    return _inflate(packed).decode("ascii")


class RunningDigests:
    """Each written prompt's SHA-256 (``prompt_digest``) as a running hash, after its prompt and after its prompt +
    sampled ids: a prompt that extends an earlier one is digested by hashing only what it adds."""

    def __init__(self) -> None:
        self._after: dict[str, tuple[Any, Any]] = {}  # call id -> (hash after the prompt, after prompt + sampled)

    def after(self, call_id: str, sampled: bool) -> Any:
        return self._after[call_id][1 if sampled else 0]

    def keep(self, call_id: str, sampled: list[int], prompt_hash: Any) -> None:
        """``prompt_hash``: the running hash of the call's whole prompt; ``sampled``: its sampled ids."""
        whole = prompt_hash.copy()
        whole.update(int32le(sampled))
        self._after[call_id] = (prompt_hash, whole)
