"""The Fleet gateway: the only part of a SuperLink that the nodes' network may reach.

Flower 1.41 serves the Fleet API (SuperNodes), the Control API (``flwr run``/``ls``/``log``,
no login) and the Runtime API (ServerApp SuperExecs) on ONE host:port; ``--control-api-address``
and ``--fleet-api-address`` are deprecated and ignored. So the SuperLink binds to the
operator's side only (loopback or a private network) and this gateway, on the network address
the nodes use, forwards nothing but ``POST /v1/fleet/<call>``, one request per upstream
connection (``fedclust deploy fleet-gateway``; ``docker/compose.yml``).
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedclust.errors import FedclustError

FLEET_REQUEST = re.compile(rb"POST /v1/fleet/[a-z][a-z-]{0,63} HTTP/1\.1")
HEADER_NAME = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
HOP_BY_HOP = {b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer", b"upgrade"}
MAX_HEAD = 16 * 1024
MAX_BODY = 512 * 1024 * 1024


class Refused(FedclustError):
    """A request the gateway does not forward (HTTP status and a data-free reason)."""

    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status


def fleet_request_head(head: bytes) -> tuple[bytes, int]:
    """Check one request head; return it rewritten for one upstream request + its body size.

    Only ``POST /v1/fleet/<call> HTTP/1.1`` with one ``Content-Length`` passes. Hop-by-hop
    headers are dropped and ``Connection: close`` is added, so the SuperLink serves exactly
    this request on the connection (nothing can be smuggled behind its body).
    """
    lines = head.split(b"\r\n")
    if any(c in line for line in lines for c in (b"\r", b"\n", b"\0")):
        raise Refused("400 Bad Request", "bare CR, LF or NUL in the request head")
    if not FLEET_REQUEST.fullmatch(lines[0]):
        raise Refused("403 Forbidden", "only the Fleet API (POST /v1/fleet/...) is served here")
    kept, length = [lines[0]], None
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not HEADER_NAME.fullmatch(name):
            raise Refused("400 Bad Request", "malformed header line")
        key, value = name.lower(), value.strip()
        if key == b"transfer-encoding":
            raise Refused("411 Length Required", "chunked bodies are not forwarded")
        if key == b"content-length":
            if length is not None or not value.isdigit():
                raise Refused("400 Bad Request", "one numeric Content-Length is required")
            length = int(value)
        if key not in HOP_BY_HOP:
            kept.append(line)
    if length is None:
        raise Refused("411 Length Required", "a Content-Length is required")
    if length > MAX_BODY:
        raise Refused("413 Content Too Large", f"bodies over {MAX_BODY} bytes are refused")
    return b"\r\n".join([*kept, b"Connection: close", b"", b""]), length


@dataclass
class FleetGateway:
    """Forward only Flower's Fleet API from ``listen`` to the SuperLink at ``upstream``.

    With ``certfile``/``keyfile`` it serves TLS (the SuperLink's certificate, whose SANs must
    name the address the nodes dial) and reaches the SuperLink over TLS checked against
    ``ca_file``; without them both sides are plain HTTP (loopback demos only).
    """

    listen: tuple[str, int]
    upstream: tuple[str, int]
    certfile: Path | None = None
    keyfile: Path | None = None
    ca_file: Path | None = None
    timeout: float = 300.0
    _client_ctx: Any = field(default=None, init=False, repr=False)

    def _contexts(self) -> tuple[Any, Any]:
        import ssl

        if not self.certfile:
            return None, None
        server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server.load_cert_chain(str(self.certfile), str(self.keyfile))
        client = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)
        return server, client

    async def serve(self, ready: Any = None) -> None:
        import asyncio

        server_ctx, self._client_ctx = self._contexts()
        server = await asyncio.start_server(self._handle, *self.listen, ssl=server_ctx,
                                            limit=MAX_HEAD)
        print(f"fleet gateway: {self.listen[0]}:{self.listen[1]} -> "
              f"{self.upstream[0]}:{self.upstream[1]} ({'TLS' if server_ctx else 'plain'}); "
              f"only POST /v1/fleet/* is forwarded", file=sys.stderr, flush=True)
        if ready is not None:
            ready.set()
        async with server:
            await server.serve_forever()

    async def _handle(self, reader: Any, writer: Any) -> None:
        import asyncio

        peer, head = writer.get_extra_info("peername"), b""
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
                upstream_head, length = fleet_request_head(head[:-4])
            except (asyncio.LimitOverrunError, ValueError):
                raise Refused("431 Request Header Fields Too Large",
                              "request head too large") from None
            except asyncio.IncompleteReadError:
                return
            up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(
                *self.upstream, ssl=self._client_ctx), 30)
            try:
                up_writer.write(upstream_head)
                while length:
                    chunk = await asyncio.wait_for(reader.read(min(length, 1 << 20)),
                                                   self.timeout)
                    if not chunk:
                        return
                    up_writer.write(chunk)
                    length -= len(chunk)
                    await up_writer.drain()
                while chunk := await asyncio.wait_for(up_reader.read(1 << 20), self.timeout):
                    writer.write(chunk)
                    await writer.drain()
            finally:
                up_writer.close()
        except Refused as exc:
            line = head.split(b"\r\n", 1)[0][:80]
            print(f"fleet gateway: refused {line!r} from {peer}: {exc}", file=sys.stderr,
                  flush=True)
            body = f"fedclust fleet gateway: {exc}\n".encode()
            writer.write(f"HTTP/1.1 {exc.status}\r\nContent-Type: text/plain\r\n"
                         f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                         .encode() + body)
        except (OSError, asyncio.TimeoutError) as exc:
            print(f"fleet gateway: {peer}: {type(exc).__name__}: {exc}", file=sys.stderr,
                  flush=True)
        finally:
            try:
                await writer.drain()
            except OSError:
                pass
            writer.close()


def host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    if not 1 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} of {text!r} is not a TCP port: allowed "
                                         f"1..65535")
    return host.strip("[]"), int(port)


# ----------------------------------------------------------------------------------------------
# Processes
