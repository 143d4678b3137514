"""Egress audit: every connection a sandboxed CLI attempts besides the proxy is refused and recorded.

Inside the sandbox, DNS (127.0.0.1:53, the only nameserver in its resolv.conf) and the HTTP(S) proxy variables
(127.0.0.1:3128) are relayed over Unix sockets to this host-side listener. A name lookup gets REFUSED and a proxy
request gets 403, so a CLI fails fast instead of retrying, and the attempt is kept as evidence of side traffic.
"""

from __future__ import annotations

import socketserver
import struct
import threading
import time
from pathlib import Path

from pydantic import BaseModel


class EgressAttempt(BaseModel):
    kind: str  # "dns" | "http"
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
        self.http_socket = run_dir / "egress-http.sock"
        self._lock = threading.Lock()
        audit = self

        class Dns(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                packet = self.request.recv(4096)
                audit._add("dns", dns_question(packet))
                self.request.sendall(dns_refused(packet))

        class Http(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                head = b""
                while b"\r\n\r\n" not in head and len(head) < 65536:
                    chunk = self.request.recv(4096)
                    if not chunk:
                        break
                    head += chunk
                line = head.split(b"\r\n", 1)[0].decode("latin-1")
                audit._add("http", line)
                self.request.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

        self._servers = [_Server(str(self.dns_socket), Dns), _Server(str(self.http_socket), Http)]
        for server in self._servers:
            threading.Thread(target=server.serve_forever, daemon=True).start()

    def _add(self, kind: str, target: str) -> None:
        with self._lock:
            self.attempts.append(EgressAttempt(kind=kind, target=target, at=time.time()))

    def close(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()
