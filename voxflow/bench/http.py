"""A minimal HTTP/1.1 client for the load generator: asyncio streams + h11, one connection per request in flight.

Why not httpx: its connection pool delays requests on reused keep-alive connections under concurrency (64
closed-loop workers against a server answering in 0.6 s saw the second request of each worker wait 1-5 s before
reaching the socket; encode/httpx#3215), and a load generator must never be the bottleneck.
Here a request takes an idle keep-alive connection (or opens one, TCP_NODELAY), writes head and body in one
write, and reads with `reader.read()`: every read is one arrival, its body bytes one piece. A pooled connection
that turns out to be closed before any response byte is replaced once, transparently (as browsers do).

Errors: `ConnectError` (refused, unresolvable, connect timeout), `ReadTimeout` (no byte for `read_timeout`
seconds), `ReadError` (connection reset or closed before the body was complete, protocol violation).
"""
from __future__ import annotations

import asyncio
import socket
import ssl
import urllib.parse

import h11

READ_SIZE = 1 << 16


class HTTPError(Exception):
    pass


class ConnectError(HTTPError):
    pass


class ReadTimeout(HTTPError):
    pass


class ReadError(HTTPError):
    pass


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer
        self.h11 = h11.Connection(h11.CLIENT)

    def close(self):
        try:
            self.writer.close()
        except Exception:  # noqa: BLE001 - closing a broken transport must not raise
            pass


class HttpClient:
    def __init__(self, base_url: str, *, connect_timeout: float = 30.0, read_timeout: float = 600.0,
                 headers: dict | None = None):
        u = urllib.parse.urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"base URL must be http(s)://host[:port][/prefix], got {base_url!r}")
        self.tls = u.scheme == "https"
        self.host, self.port = u.hostname, u.port or (443 if self.tls else 80)
        self.prefix = u.path.rstrip("/")
        self.host_header = u.netloc.rpartition("@")[2]
        self.connect_timeout, self.read_timeout = connect_timeout, read_timeout
        self.headers = dict(headers or {})
        self.idle: list[_Conn] = []

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.aclose()

    async def aclose(self):
        while self.idle:
            self.idle.pop().close()

    def stream(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None) -> "Exchange":
        return Exchange(self, method, self.prefix + "/" + path.lstrip("/"), body, headers or {})

    async def request(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
        """(status, headers, body) of a whole response."""
        async with self.stream(method, path, body, headers) as resp:
            data = await resp.aread()
        return resp.status, resp.headers, data

    async def _connect(self) -> _Conn:
        ctx = ssl.create_default_context() if self.tls else None
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, ssl=ctx, limit=READ_SIZE * 4), self.connect_timeout)
        except asyncio.TimeoutError:
            raise ConnectError(f"connect to {self.host}:{self.port} timed out") from None
        except OSError as e:
            raise ConnectError(f"cannot connect to {self.host}:{self.port}: {e}") from None
        sock = writer.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        return _Conn(reader, writer)

    def _release(self, conn: _Conn) -> None:
        if conn.h11.our_state is h11.DONE and conn.h11.their_state is h11.DONE:
            try:
                conn.h11.start_next_cycle()
                self.idle.append(conn)
                return
            except h11.LocalProtocolError:
                pass
        conn.close()


class Exchange:
    """`async with client.stream(...) as resp:` -> resp.status, resp.headers (lower-case keys),
    `async for piece in resp.iter_raw()` (body bytes of one read each), `await resp.aread()`."""

    def __init__(self, client: HttpClient, method: str, target: str, body: bytes | None, headers: dict):
        self.client, self.method, self.target, self.body = client, method, target, body or b""
        self.extra = headers
        self.conn: _Conn | None = None
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self._done = False

    async def __aenter__(self) -> "Exchange":
        for attempt in (0, 1):
            pooled = bool(self.client.idle) and attempt == 0
            conn = self.client.idle.pop() if pooled else await self.client._connect()
            self.conn = conn
            try:
                await self._send(conn)
                await self._read_head(conn)
                return self
            except ReadError:
                conn.close()
                if not pooled or self.status is not None:
                    raise
                # a kept-alive connection the server had closed: once more on a fresh one
        raise AssertionError("unreachable")

    async def __aexit__(self, *exc) -> None:
        conn, self.conn = self.conn, None
        if conn is None:
            return
        if self._done and exc[0] is None:
            self.client._release(conn)
        else:
            conn.close()

    async def _send(self, conn: _Conn) -> None:
        c = self.client
        headers = [("Host", c.host_header), ("User-Agent", "voxflow-bench"), ("Accept-Encoding", "identity")]
        headers += [(k, v) for k, v in {**c.headers, **self.extra}.items()]
        if self.method != "GET" or self.body:
            headers.append(("Content-Length", str(len(self.body))))
        try:
            data = conn.h11.send(h11.Request(method=self.method, target=self.target, headers=headers))
            if self.body:
                data += conn.h11.send(h11.Data(data=self.body))
            data += conn.h11.send(h11.EndOfMessage())
            conn.writer.write(data)
            await conn.writer.drain()
        except (OSError, h11.LocalProtocolError) as e:
            raise ReadError(f"sending the request failed: {e}") from None

    async def _events(self, conn: _Conn):
        """Next batch of h11 events from one read (reads as needed)."""
        events = []
        while True:
            try:
                ev = conn.h11.next_event()
            except h11.RemoteProtocolError as e:
                raise ReadError(f"protocol error: {e}") from None
            if ev is h11.NEED_DATA:
                if events:
                    return events
                try:
                    data = await asyncio.wait_for(conn.reader.read(READ_SIZE), self.client.read_timeout)
                except asyncio.TimeoutError:
                    raise ReadTimeout(f"no data for {self.client.read_timeout:g} s") from None
                except OSError as e:
                    raise ReadError(f"connection error: {e}") from None
                conn.h11.receive_data(data)       # b"" = EOF: h11 knows whether the framing allowed it
                continue
            if isinstance(ev, h11.ConnectionClosed) and (self.status is None or not self._done):
                where = "before the response" if self.status is None else "mid-body"
                raise ReadError(f"server closed the connection {where}")
            events.append(ev)
            if isinstance(ev, (h11.EndOfMessage, h11.ConnectionClosed, h11.Response)):
                return events

    async def _read_head(self, conn: _Conn) -> None:
        while self.status is None:
            for ev in await self._events(conn):
                if isinstance(ev, h11.Response):
                    self.status = ev.status_code
                    self.headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in ev.headers}
                elif isinstance(ev, h11.InformationalResponse):
                    continue

    async def iter_raw(self):
        conn = self.conn
        while not self._done:
            piece = []
            for ev in await self._events(conn):
                if isinstance(ev, h11.Data):
                    piece.append(bytes(ev.data))
                elif isinstance(ev, (h11.EndOfMessage, h11.ConnectionClosed)):
                    self._done = True
            if piece:
                yield b"".join(piece)

    async def aread(self) -> bytes:
        return b"".join([p async for p in self.iter_raw()])
