"""``fedvit tap``: a passive eavesdropper between SuperNodes and a SuperLink's Fleet API (a transparent proxy).

SuperNodes dial the tap (``--superlink <tap address>``) instead of the SuperLink. Each TCP connection is sniffed
by its first bytes:

- plain HTTP/1.1 (an ``--insecure`` link, Flower 1.41's protobuf-over-HTTP Fleet API) goes through a Starlette
  app on uvicorn that forwards every request to the SuperLink with httpx, unchanged (method, path, query,
  headers, body: SuperNode signatures stay valid), returns the SuperLink's response unchanged, and hands the pair
  to :class:`fedvit.capture.wire_tap.WireRecorder`, which rebuilds and records the Messages;
- TLS (a ClientHello) and HTTP/2 (the legacy gRPC Fleet, ``FLWR_INTERNAL_GRPC_FLEET_API=1``) are relayed byte
  for byte; the tap records only connection metadata (``connections.jsonl``: peer, protocol, bytes, duration)
  and says so in its log: it cannot read them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from fedvit.capture.wire_tap import DEFAULT_SPOOL_BYTES, WireRecorder

LOG = logging.getLogger("fedvit.tap")
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "upgrade", "te", "trailer"}
HTTP2_PREFACE = b"PRI * HTTP/2.0"
TLS_HANDSHAKE = 0x16  # first byte of a TLS record carrying a ClientHello


def split_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (IPv6 in brackets) → (host, port), with a clear error for anything else."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected HOST:PORT, got {address!r}")
    return host.strip("[]"), int(port)


def sniff(first: bytes) -> str:
    """The protocol of a connection from its first bytes: "tls", "http2" or "http"."""
    if first[:1] == bytes([TLS_HANDSHAKE]):
        return "tls"
    if first.startswith(HTTP2_PREFACE[: len(first)]) and first:
        return "http2"
    return "http"


def proxy_app(upstream: str, recorder: WireRecorder) -> Starlette:
    """The HTTP side: forward each request to ``upstream`` unchanged, record the exchange, relay the response."""
    client = httpx.AsyncClient(base_url=f"http://{upstream}", timeout=httpx.Timeout(300.0, connect=30.0))

    async def forward(request: Request) -> Response:
        body = await request.body()
        headers = [(k, v) for k, v in request.headers.raw if k.decode().lower() not in HOP_BY_HOP | {"host"}]
        url = httpx.URL(path=request.url.path, query=request.url.query.encode())
        try:
            upstream_request = client.build_request(request.method, url, headers=headers, content=body)
            reply = await client.send(upstream_request, stream=True)
            content = b"".join([chunk async for chunk in reply.aiter_raw()])
            await reply.aclose()
        except httpx.HTTPError as err:
            LOG.warning("tap: upstream %s unreachable (%s)", upstream, err)
            return Response(status_code=502, content=f"fedvit tap: upstream unreachable: {err}".encode())
        recorder.observe(request.url.path, body, content, reply.status_code)
        kept = [(k, v) for k, v in reply.headers.raw if k.decode().lower() not in HOP_BY_HOP]
        response = Response(content=content, status_code=reply.status_code)
        response.raw_headers = [(k.lower(), v) for k, v in kept] + [(b"content-length", str(len(content)).encode())]
        return response

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        yield
        await client.aclose()

    methods = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]
    return Starlette(routes=[Route("/{path:path}", forward, methods=methods)], lifespan=lifespan)


class Tap:
    """The listener: sniffs each connection and relays it (see the module docstring)."""

    def __init__(self, listen: str, upstream: str, out: Path, spool_bytes: int = DEFAULT_SPOOL_BYTES) -> None:
        self.listen, self.upstream = split_address(listen), split_address(upstream)
        self.upstream_text = upstream
        self.out = Path(out).resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        self.recorder = WireRecorder(self.out, spool_bytes)
        self.connections = {"http": 0, "tls": 0, "http2": 0}
        self._http_port = 0
        self._stop: asyncio.Event | None = None
        self.ready = threading.Event()

    async def serve(self) -> None:
        """Run until :meth:`stop` (or cancellation)."""
        self._stop = asyncio.Event()
        inner = socket.socket()
        inner.bind(("127.0.0.1", 0))
        self._http_port = inner.getsockname()[1]
        config = uvicorn.Config(proxy_app(self.upstream_text, self.recorder), log_level="warning", lifespan="on")
        http_server = uvicorn.Server(config)
        http_task = asyncio.create_task(http_server.serve(sockets=[inner]))
        front = await asyncio.start_server(self._connection, *self.listen)
        LOG.info("tap: listening on %s:%d, relaying to %s, recording to %s", *self.listen, self.upstream_text,
                 self.out)  # fmt: skip
        self.ready.set()
        try:
            await self._stop.wait()
        finally:
            front.close()
            await front.wait_closed()
            http_server.should_exit = True
            await http_task
            self.recorder.close()
            self._write_summary()

    def stop(self) -> None:
        if self._stop is not None:
            self._stop.set()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        try:
            first = await asyncio.wait_for(reader.read(len(HTTP2_PREFACE)), timeout=60)
        except (TimeoutError, ConnectionError):
            writer.close()
            return
        if not first:  # closed without a byte (a port probe): nothing to relay or count
            writer.close()
            return
        protocol = sniff(first)
        self.connections[protocol] += 1
        target = ("127.0.0.1", self._http_port) if protocol == "http" else self.upstream
        if protocol != "http" and self.connections[protocol] == 1:
            LOG.warning("tap: %s link from %s: relayed as bytes, nothing readable is recorded (connection metadata "
                        "only, connections.jsonl)", protocol.upper(), peer)  # fmt: skip
        start = time.time()
        try:
            up_reader, up_writer = await asyncio.open_connection(*target)
        except OSError as err:
            LOG.warning("tap: cannot reach %s:%d (%s)", *target, err)
            writer.close()
            return
        up_writer.write(first)
        sent, received = await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        if protocol != "http":
            entry = {"peer": f"{peer[0]}:{peer[1]}" if peer else "", "protocol": protocol, "start": start,
                     "seconds": round(time.time() - start, 3), "bytes-up": sent + len(first),
                     "bytes-down": received, "readable": False}  # fmt: skip
            with contextlib.suppress(OSError):  # a full disk must not stop the relay
                with open(self.out / "connections.jsonl", "a") as f:
                    f.write(json.dumps(entry) + "\n")

    def _write_summary(self) -> None:
        summary = {"upstream": self.upstream_text, "connections": self.connections, "records": self.recorder.stats}
        with contextlib.suppress(OSError):
            (self.out / "tap.json").write_text(json.dumps(summary, indent=1))
        LOG.info("tap: stopped; connections %s; records %s", self.connections, self.recorder.stats)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
    """Copy ``reader`` to ``writer`` until EOF; returns the bytes copied."""
    total = 0
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
            total += len(data)
    except ConnectionError:
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()
    return total


@contextlib.contextmanager
def running_tap(listen: str, upstream: str, out: Path) -> Iterator[Tap]:
    """A tap serving in a background thread for the ``with`` block (tests, scripts)."""
    tap = Tap(listen, upstream, out)
    loop = asyncio.new_event_loop()
    failure: list[BaseException] = []

    def serve() -> None:
        try:
            loop.run_until_complete(tap.serve())
        except BaseException as err:  # noqa: BLE001 — reported to the caller below
            failure.append(err)
            tap.ready.set()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    tap.ready.wait(30)
    if failure or not tap.ready.is_set():
        raise RuntimeError(f"fedvit tap did not start: {failure[0] if failure else 'timeout'}")
    try:
        yield tap
    finally:
        loop.call_soon_threadsafe(tap.stop)
        thread.join(60)


def main(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM; the summary goes to ``<out>/tap.json``."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    logging.getLogger("fedvit").setLevel(logging.INFO)
    try:
        split_address(args.listen), split_address(args.upstream)
        tap = Tap(args.listen, args.upstream, args.out, int(args.spool_mb * 2**20))
    except (ValueError, OSError) as err:
        print(f"fedvit tap: {err}", file=sys.stderr)
        return 2

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, tap.stop)
        await tap.serve()

    try:
        asyncio.run(serve())
    except OSError as err:  # e.g. the listen port is taken
        print(f"fedvit tap: cannot listen on {args.listen}: {err}", file=sys.stderr)
        return 2
    print(f"fedvit tap: records in {tap.out} (summary: {tap.out / 'tap.json'})")
    return 0
