"""Egress audit: every name a sandboxed CLI looks up is refused and recorded.

In an agent's sandbox, DNS (127.0.0.1:53, the only nameserver in its resolv.conf) is relayed over a Unix socket to
this host-side listener. A lookup gets REFUSED, so a CLI fails fast instead of retrying, and the name is kept as
evidence of side traffic. There are no proxy variables to name another route: the tests the agent runs see the
environment the grader's see, and a connection to an address goes nowhere (the sandbox's network has only its
loopback). Grading sandboxes have no audit at all.
"""

from __future__ import annotations

import socketserver
import struct
import threading
import time
from pathlib import Path

from pydantic import BaseModel


class EgressAttempt(BaseModel):
    kind: str  # "dns" (records written before the HTTP audit went may say "http")
    target: str
    at: float


def dns_question(packet: bytes) -> str:
    """The queried name of a DNS query packet (RFC 1035 §4.1.2)."""
    labels, i = [], 12
    while i < len(packet) and packet[i] != 0:
        n = packet[i]
        labels.append(packet[i + 1 : i + 1 + n].decode("ascii", "replace"))
        i += 1 + n
    return ".".join(labels)


def dns_refused(packet: bytes) -> bytes:
    """The same query answered with RCODE 5 (REFUSED), question echoed, no records."""
    if len(packet) < 12:
        return b""
    ident, flags = struct.unpack(">HH", packet[:4])
    reply_flags = 0x8000 | (flags & 0x0100) | 0x0080 | 5  # QR, copy RD, RA, REFUSED
    return struct.pack(">HHHHHH", ident, reply_flags, 1, 0, 0, 0) + packet[12:]


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class EgressAudit:
    def __init__(self, run_dir: Path) -> None:
        self.attempts: list[EgressAttempt] = []
        self.dns_socket = run_dir / "egress-dns.sock"
        self._lock = threading.Lock()
        audit = self

        class Dns(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                packet = self.request.recv(4096)
                audit._add("dns", dns_question(packet))
                self.request.sendall(dns_refused(packet))

        self._servers = [_Server(str(self.dns_socket), Dns)]
        for server in self._servers:
            threading.Thread(target=server.serve_forever, daemon=True).start()

    def _add(self, kind: str, target: str) -> None:
        with self._lock:
            self.attempts.append(EgressAttempt(kind=kind, target=target, at=time.time()))

    def close(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()
