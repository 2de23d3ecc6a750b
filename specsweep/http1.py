"""Streamed HTTP/1.1 answers read where they arrive: every chunk dated by the kernel, no task woken per chunk.

The load generator's connections are read from one epoll set, which the event loop watches as a single file.
When any of them is readable, ``Reader`` reads each ready socket once (``recvmsg``, with the time the kernel
received the bytes), then feeds what was read to httptools' parser (llhttp, strict) for the HTTP framing (status
line, headers, chunked or sized body), takes the event lines apart and hands each ``data:`` payload, dated when
its bytes were received, to its request's callback. Only the end of an answer wakes the task that
sent the request. At a few hundred streams, asyncio's transport and a task wake-up per chunk cost more CPU than
the chunks themselves, and a client that falls behind by more than a chunk's interval dates chunks late: the
kernel merges two packets waiting in one socket and keeps the later one's time (benchmarks/README.md, "Client
overhead").

What is read: plain-HTTP/1.1 answers to one request at a time per connection (no pipelining), bodies framed by
``Transfer-Encoding: chunked``, by ``Content-Length`` or by the connection's end; informational (1xx) answers are
skipped. A 200 answer's body is read as server-sent events; any other answer's body is kept (its first 64 KiB)
for the error message. Lines of any length are read. Malformed framing fails the request (MalformedAnswer).
"""

from __future__ import annotations

import asyncio
import select
import socket
import struct
import time
from collections import deque
from dataclasses import dataclass
from urllib.parse import urlsplit

import httptools

SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux
STAMP_SPACE = 64  # ancillary bytes to ask recvmsg for
READ_SIZE = 64 * 1024  # bytes per read (asyncio's 256 KiB buffers are mapped and unmapped on every read)
_KEPT_BODY = 64 * 1024  # of a non-200 answer, for its error message
_MAX_HEAD = 64 * 1024


def arrival(ancillary, seen: float) -> float:
    """When the bytes of a ``recvmsg`` with SO_TIMESTAMPNS on arrived, as time.monotonic() seconds: the kernel's
    stamp in its ``ancillary`` data (never later than ``seen``, when they were read), else ``seen``. Two packets
    that waited in a TCP socket together share the later one's stamp."""
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(payload) >= 16:
            seconds, nanoseconds = struct.unpack("qq", payload[:16])  # CLOCK_REALTIME
            stamp = seen - (time.time() - (seconds + nanoseconds * 1e-9))
            return stamp if stamp <= seen else seen
    return seen


def ask_for_stamps(sock: socket.socket) -> None:
    """Have the kernel stamp what ``sock`` receives (a no-op where it cannot: arrival is then when it is read)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        pass


class ConnectFailed(OSError):
    """No connection could be opened (refused, unreachable, name not resolved)."""


class Disconnected(ConnectionError):
    """The connection ended before the answer did."""

    def __init__(self, message: str, answered: bool):
        super().__init__(message)
        self.answered = answered  # whether any byte of the answer had arrived


@dataclass
class Answer:
    """How a request ended: its status, and the kept body of a non-200 answer."""

    status: int
    body: bytes = b""


class MalformedAnswer(ValueError):
    """The server's answer breaks HTTP/1.1's framing (the message says how); its connection is not used again."""


class Connection:
    """One HTTP/1.1 connection; ``request`` sends a request and resolves when its answer has ended.

    For a 200 answer, ``on_event(arrival, data)`` is called for each ``data:`` line of the event stream as its
    bytes are read; it returns True once the answer is complete (the stream's ``[DONE]``), after which the body
    has ``grace`` seconds to end. Whatever ``on_event`` raises ends the request with that exception and closes
    the connection.

    The framing is httptools' (llhttp's strict parser, one for the connection's answers), fed every read in the
    order read; its callbacks (the ``on_*`` methods) take the head and the body pieces. An answer the parser
    refuses (a chunk size such as `` +0x1_0 ``, a Content-Length that is not digits, a repeated Content-Length),
    or one this reader does not read (a repeated Transfer-Encoding header, a transfer coding other than chunked, a
    head over 64 KiB) fails its request with MalformedAnswer and closes the connection.
    """

    def __init__(self, sock: socket.socket, reader: "Reader"):
        self.sock, self.reader = sock, reader
        self.closed = False
        self.reusable = False
        self._future: asyncio.Future | None = None
        self._grace_timer: asyncio.TimerHandle | None = None
        self._parser: httptools.HttpResponseParser | None = httptools.HttpResponseParser(self)  # for every answer
        reader.watch(self)

    async def request(self, data: bytes, on_event, on_send=None, grace: float = 1.0) -> Answer:
        """Send one request (head and body) and read its answer; ``on_send()``, if given, is called once the
        connection is ready for the answer, just before the bytes go to the kernel."""
        if self.closed or (self._future is not None and not self._future.done()):
            raise RuntimeError("connection not ready for a request")
        loop = asyncio.get_running_loop()
        self._future = loop.create_future()
        self._on_event, self._grace = on_event, grace
        self._grace_timer = None
        self._now, self._first, self._lines, self._body = 0.0, b"", bytearray(), bytearray()
        self._received, self._status, self._until_close = 0, 0, False
        self.reusable = False
        if on_send is not None:
            on_send()
        try:
            await loop.sock_sendall(self.sock, data)
        except OSError as exc:
            self._fail(Disconnected(f"the request could not be sent: {exc}", False))
        return await self._future

    def close(self) -> None:
        if self._grace_timer is not None:  # closed before the grace after [DONE] ran out (an aborted request)
            self._grace_timer.cancel()
        if not self.closed:
            self.closed, self.reusable = True, False
            self._parser = None  # it holds this connection's callbacks
            self.reader.forget(self)
            self.sock.close()

    # ------------------------------------------------------------------ reading

    def read(self) -> tuple | None:
        """Read what has arrived: (bytes, when the kernel received them); at the connection's end (b"", the error
        or None); None when there is nothing to read."""
        try:
            data, ancillary, _, _ = self.sock.recvmsg(READ_SIZE, STAMP_SPACE)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError as exc:
            return b"", exc
        if not data:
            return b"", None
        return data, arrival(ancillary, time.monotonic())

    def received(self, data: bytes, when) -> None:
        """Take in what ``read`` returned, in the order it was read: every body piece parsed from ``data`` is dated
        ``when``, the time its bytes were received."""
        parser = self._parser
        if parser is None:  # closed
            return
        if not data:
            self._lost(when)
            return
        if self._future is None or self._future.done():
            self.close()  # bytes nobody asked for: this connection cannot be trusted with another request
            return
        if not self._received:
            self._first = data[:80]
        self._received += len(data)
        self._now = when
        try:
            parser.feed_data(data)
            if not self._status and self._received > _MAX_HEAD:
                raise self._malformed("the answer's head is longer than 64 KiB")
        except httptools.HttpParserCallbackError as exc:  # what a callback below (or on_event) raised
            self._fail(exc.__context__ or MalformedAnswer(str(exc)))
        except httptools.HttpParserError as exc:  # the framing llhttp refuses
            self._fail(self._malformed(str(exc)))
        except httptools.HttpParserUpgrade:
            self._fail(self._malformed("the server switched protocols, which no request asked for"))
        except Exception as exc:  # a broken answer or whatever on_event raised ends this request only
            self._fail(exc)

    def _malformed(self, reason: str) -> MalformedAnswer:
        status_line = self._first.partition(b"\r\n")[0].decode("latin-1")
        if not status_line.startswith("HTTP/"):
            return MalformedAnswer(f"not an HTTP answer ({reason}): {self._first!r}")
        return MalformedAnswer(
            f"malformed HTTP/1.1 framing in the server's answer '{status_line}': {reason} "
            f"(after {self._received} bytes)"
        )

    def _lost(self, exc: OSError | None) -> None:
        pending = self._future is not None and not self._future.done()
        if pending and self._until_close:
            self._finish(keep=False)
        elif pending:
            why = f": {exc}" if exc else ""
            self._fail(
                Disconnected(
                    f"the server closed the connection after {self._received} bytes of the answer{why}",
                    self._received > 0,
                )
            )
        self.close()

    # httptools' callbacks, called from feed_data in the order of the bytes

    def on_message_begin(self) -> None:
        if self._future is None or self._future.done():
            raise MalformedAnswer("bytes after the end of the answer")
        self._framing: dict[bytes, bytes] = {}

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-length" or name == b"transfer-encoding":
            if name in self._framing:
                raise self._malformed(
                    f"the answer repeats its {name.decode()} header ({self._framing[name]!r}, then {value!r})"
                )
            if name == b"transfer-encoding" and value.strip().lower() != b"chunked":
                raise self._malformed(f"Transfer-Encoding {value!r}: only chunked is read")
            self._framing[name] = value

    def on_headers_complete(self) -> None:
        parser = self._parser
        assert parser is not None  # the parser calls it
        status = parser.get_status_code()
        if status < 200:
            return  # informational: the real answer follows
        self._status, self._keep = status, parser.should_keep_alive()
        self._until_close = not self._framing and status not in (204, 304)

    def on_message_complete(self) -> None:
        if self._status:  # not the end of an informational answer
            self._finish(keep=True)

    def on_body(self, piece: bytes) -> None:
        """A piece of the body (chunk framing removed): a 200 answer's event lines, each ``data:`` payload handed to
        on_event with the time its bytes were received; another answer's body is kept for its error message."""
        if self._status != 200:
            if len(self._body) < _KEPT_BODY:
                self._body += piece[: _KEPT_BODY - len(self._body)]
            return
        if b"\n" not in piece:
            self._lines += piece
            return
        if self._lines:
            piece = bytes(self._lines) + piece
            self._lines = bytearray()
        lines = piece.split(b"\n")
        rest = lines.pop()
        if rest:
            self._lines += rest
        for line in lines:
            if line[:5] == b"data:" and self._grace_timer is None:
                if self._on_event(self._now, line[5:].strip()):
                    self._grace_timer = asyncio.get_running_loop().call_later(self._grace, self._complete_early)

    def _complete_early(self) -> None:
        """The answer was complete but its body did not end: take the answer, drop the connection."""
        if self._future is not None and not self._future.done():
            self._future.set_result(Answer(self._status, bytes(self._body)))
        self.close()

    def _finish(self, keep: bool) -> None:
        if self._grace_timer is not None:
            self._grace_timer.cancel()
        self.reusable = keep and self._keep and not self.closed
        if self._future is not None and not self._future.done():
            self._future.set_result(Answer(self._status, bytes(self._body)))

    def _fail(self, exc: BaseException) -> None:
        if self._grace_timer is not None:
            self._grace_timer.cancel()
        if self._future is not None and not self._future.done():
            self._future.set_exception(exc)
        self.close()


class Reader:
    """The connections of one run, in one epoll set that the event loop watches as one file.

    Reading comes before parsing: a pass reads every ready socket (taking the kernel's arrival stamps), then
    parses what was read a few reads at a time, reading again whatever has become ready between two slices. A
    socket is thus read soon after its bytes arrive, however long the parsing takes, and the kernel does not
    get to merge a stream's next chunk into one still waiting (which would date the earlier one late). A pass
    yields to the event loop after ``PASS_BUDGET`` seconds and goes on in the next. Connections stay watched
    while idle, so a server that closes a kept-alive connection is seen at once.
    """

    PARSE_SLICE = 16  # reads parsed between two looks for newly arrived bytes
    PASS_BUDGET = 0.005

    def __init__(self):
        self._epoll = select.epoll()
        self._connections: dict[int, Connection] = {}
        self._read: deque = deque()  # (connection, data, when), in the order read
        self._resume: asyncio.Handle | None = None
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._epoll.fileno(), self._pass)

    def watch(self, connection: Connection) -> None:
        fd = connection.sock.fileno()
        self._connections[fd] = connection
        self._epoll.register(fd, select.EPOLLIN)

    def forget(self, connection: Connection) -> None:
        fd = connection.sock.fileno()
        if fd >= 0 and self._connections.get(fd) is connection:
            del self._connections[fd]
            try:
                self._epoll.unregister(fd)
            except (OSError, ValueError):
                pass

    def _read_ready(self) -> None:
        connections, read = self._connections, self._read
        for fd, _ in self._epoll.poll(0):
            connection = connections.get(fd)
            got = connection.read() if connection is not None else None
            if connection is not None and got is not None:
                if not got[0]:
                    self.forget(connection)  # its end is read once; close it when its bytes before are taken
                read.append((connection, *got))

    def _pass(self) -> None:
        self._resume = None
        read = self._read
        deadline = time.monotonic() + self.PASS_BUDGET
        self._read_ready()
        while read:
            for _ in range(min(self.PARSE_SLICE, len(read))):
                connection, data, when = read.popleft()
                connection.received(data, when)
            if time.monotonic() > deadline:
                break
            self._read_ready()
        if read and self._resume is None:
            self._resume = self._loop.call_soon(self._pass)

    def close(self) -> None:
        for connection in list(self._connections.values()):
            connection.close()
        if self._resume is not None:
            self._resume.cancel()
        self._loop.remove_reader(self._epoll.fileno())
        self._epoll.close()


class Pool:
    """Keep-alive connections to one plain-HTTP server, each carrying one request at a time (or one per request).

    Use it inside a running event loop and ``close`` it at the end.
    """

    def __init__(self, url: str, headers: dict | None = None, per_request: bool = False):
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"the load generator speaks plain HTTP: {url!r} is not an http:// URL")
        self.host, self.port, self.prefix = parts.hostname, parts.port or 80, parts.path.rstrip("/")
        self.per_request = per_request
        lines = {
            "Host": parts.netloc,
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
            **({"Connection": "close"} if per_request else {}),
            **(headers or {}),
        }
        self._head = "".join(f"{name}: {value}\r\n" for name, value in lines.items())
        self._idle: list[Connection] = []
        self._addresses: list | asyncio.Future[list] | None = None  # a lookup under way: its future
        self._reader = Reader()

    async def _resolve(self) -> list:
        """The server's addresses, looked up once per pool (an IP address needs no lookup)."""
        addresses = self._addresses
        if addresses is None:
            try:
                addresses = socket.getaddrinfo(
                    self.host, self.port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST
                )
            except socket.gaierror:
                addresses = asyncio.ensure_future(
                    asyncio.get_running_loop().getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
                )  # the slots that come meanwhile wait for it
            self._addresses = addresses
        if isinstance(addresses, asyncio.Future):
            try:
                addresses = self._addresses = await asyncio.shield(addresses)
            except OSError as exc:
                self._addresses = None
                raise ConnectFailed(f"cannot resolve {self.host}:{self.port}: {exc}") from exc
        return addresses

    async def _open(self) -> Connection:
        loop = asyncio.get_running_loop()
        addresses = await self._resolve()
        error: OSError | None = None
        for family, type_, proto, _, address in addresses:
            sock = socket.socket(family, type_, proto)
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                ask_for_stamps(sock)
                await loop.sock_connect(sock, address)
            except BaseException as exc:  # cancelled or failed: the socket is not left open
                sock.close()
                if not isinstance(exc, OSError):
                    raise
                error = exc
                continue
            return Connection(sock, self._reader)
        raise ConnectFailed(f"cannot connect to {self.host}:{self.port}: {error}")

    async def post(self, path: str, body: bytes, on_event, on_sent) -> Answer:
        """POST ``body`` to ``path`` and read the answer (see Connection). ``on_sent(t, opened)`` is called with the
        time just before the request's bytes go to the kernel and, on a new connection, when its set-up began."""
        data = f"POST {self.prefix}{path} HTTP/1.1\r\n{self._head}Content-Length: {len(body)}\r\n\r\n".encode() + body
        for attempt in (0, 1):
            while self._idle and self._idle[-1].closed:
                self._idle.pop()
            reused = bool(self._idle)
            opened = None
            if reused:
                connection = self._idle.pop()
            else:
                opened = time.monotonic()
                connection = await self._open()
            try:
                answer = await connection.request(data, on_event, lambda: on_sent(time.monotonic(), opened))
            except Disconnected as exc:
                if reused and not exc.answered and attempt == 0:
                    continue  # a kept-alive connection the server had closed: once more on a new one
                raise
            except BaseException:
                connection.close()
                raise
            if connection.reusable and not self.per_request:
                self._idle.append(connection)
            else:
                connection.close()
            return answer
        raise AssertionError("unreachable")

    def close(self) -> None:
        self._idle.clear()
        self._reader.close()
