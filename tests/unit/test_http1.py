"""The client's HTTP/1.1 reader against a server that writes exact bytes: framing, splits, errors, kept-alive reuse.

The server here is a plain TCP server on 127.0.0.1 that answers each request with scripted bytes (what a real
server may legally send), so the reader is checked on the wire formats SGLang's own server (uvicorn) does not
happen to use today.
"""

from __future__ import annotations

import json
import socket
import socketserver
import threading
import time

import pytest

from conftest import one, patience
from specsweep.client import measure


def sse(*chunks: dict, done: bool = True) -> bytes:
    body = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
    return body + (b"data: [DONE]\n\n" if done else b"")


def native(tokens: int) -> list[dict]:
    """A native /generate stream of ``tokens`` one-token chunks, the last with its finish reason."""
    return [
        {
            "text": "x" * (i + 1),
            "meta_info": {
                "completion_tokens": i + 1,
                "prompt_tokens": 3,
                "finish_reason": {"type": "length"} if i == tokens - 1 else None,
            },
        }
        for i in range(tokens)
    ]


def chunked(body: bytes, sizes=(7, 1, 30)) -> bytes:
    """``body`` in HTTP chunks of varying sizes (one with an extension), then the last chunk and a trailer."""
    out, i, k = [], 0, 0
    while i < len(body):
        size = sizes[k % len(sizes)]
        piece = body[i : i + size]
        extension = b";note=1" if k == 1 else b""
        out.append(b"%x%s\r\n%s\r\n" % (len(piece), extension, piece))
        i, k = i + size, k + 1
    return b"".join(out) + b"0\r\nX-Trailer: yes\r\n\r\n"


STREAM_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"


class Scripted(socketserver.ThreadingTCPServer):
    """Answers the n-th request (counted over all connections) with answers[n](connection index, request index on
    that connection) -> (bytes, then: 'keep' | 'close' | 'hold' it open until the end); writes each answer in
    pieces of ``piece`` bytes."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, answers, piece: int | None = None):
        self.answers, self.piece = answers, piece
        self.requests, self.connections = 0, 0
        self.lock = threading.Lock()
        self.released = threading.Event()
        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def __exit__(self, *exc):
        self.released.set()
        self.shutdown()
        self.server_close()


class Handler(socketserver.BaseRequestHandler):
    def handle(self):
        sock: socket.socket = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(10)
        with self.server.lock:
            connection = self.server.connections
            self.server.connections += 1
        buffer, on_connection = b"", 0
        while True:
            while b"\r\n\r\n" not in buffer:
                data = sock.recv(65536)
                if not data:
                    return
                buffer += data
            head, _, buffer = buffer.partition(b"\r\n\r\n")
            length = int(
                next(
                    (line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")),
                    b"0",
                )
            )
            while len(buffer) < length:
                buffer += sock.recv(65536)
            buffer = buffer[length:]
            with self.server.lock:
                n = self.server.requests
                self.server.requests += 1
            answer, then = self.server.answers[n](connection, on_connection)
            on_connection += 1
            step = self.server.piece or len(answer) or 1
            for i in range(0, len(answer), step):
                sock.sendall(answer[i : i + step])
                if self.server.piece:
                    time.sleep(0.001)  # separate segments, so that reads end mid-line and mid-chunk
            if then == "hold":  # keep the connection open, the answer unfinished, until the test ends
                self.server.released.wait(30)
            if then in ("close", "hold"):
                sock.close()
                return


def run(server: Scripted, n: int = 1):
    return measure(server.url, [one("hi", 8)] * n, 1, {}, timeout=patience(2))


def stream_answer(_connection, _index):
    body = sse(*native(5))
    return STREAM_HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(body), "keep"


@pytest.mark.parametrize("piece", [None, 1, 5])
def test_a_chunked_stream_reads_the_same_however_the_bytes_are_split(piece):
    with Scripted([stream_answer] * 2, piece=piece) as server:
        records = run(server, 2)
    for r in records:
        assert r.ok, r.error_detail
        assert r.chunk_tokens == [1, 1, 1, 1, 1] and r.output_tokens == 5
        assert r.output_text == "xxxxx" and r.finish_reason == "length"
    assert server.connections == 1  # the connection is kept alive across the chunk extension and the trailer


def test_sized_and_close_delimited_bodies_and_a_skipped_informational_answer():
    body = sse(*native(3))
    answers = [
        lambda c, i: (STREAM_HEAD + b"Content-Length: %d\r\n\r\n" % len(body) + body, "keep"),
        lambda c, i: (
            b"HTTP/1.1 100 Continue\r\n\r\n" + STREAM_HEAD + b"Content-Length: %d\r\n\r\n" % len(body) + body,
            "keep",
        ),
        lambda c, i: (STREAM_HEAD + b"\r\n" + body, "close"),  # no length: the body ends with the connection
        stream_answer,
    ]
    with Scripted(answers) as server:
        records = run(server, 4)
    assert [(r.error, r.output_tokens) for r in records] == [(None, 3)] * 3 + [(None, 5)]
    assert server.connections == 2  # a close-delimited answer cannot leave its connection for another request


def test_an_error_status_keeps_its_body_and_a_truncated_stream_is_a_truncated_request():
    error = b'{"object": "error", "message": "the server is full"}'
    cut = sse(*native(4), done=False)[:-10]
    answers = [
        lambda c, i: (b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: %d\r\n\r\n" % len(error) + error, "keep"),
        lambda c, i: (STREAM_HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n%s\r\n" % (len(cut), cut), "close"),
        lambda c, i: (b"not http at all\r\n\r\n", "close"),
    ]
    with Scripted(answers) as server:
        records = run(server, 3)
    assert records[0].error == "http_status" and "503" in records[0].error_detail
    assert "the server is full" in records[0].error_detail
    assert records[1].error == "truncated" and records[1].output_tokens == 3  # what arrived before is kept
    assert "closed the connection" in records[1].error_detail
    assert records[2].error == "client_error" and "not an HTTP answer" in records[2].error_detail


def test_a_kept_alive_connection_the_server_drops_is_retried_once_on_a_new_one():
    def answer(connection, index):
        if connection == 0 and index == 1:
            return b"", "close"  # reads the second request, then closes without a byte of answer
        return stream_answer(connection, index)

    with Scripted([answer] * 4) as server:
        records = run(server, 3)
    assert [r.error for r in records] == [None, None, None]
    assert server.connections == 2 and server.requests == 4  # the dropped request was sent again, once


def test_an_answer_whose_body_never_ends_after_done_is_taken_and_its_connection_dropped():
    body = sse(*native(4))
    unfinished = STREAM_HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n%s\r\n" % (len(body), body)
    with Scripted([lambda c, i: (unfinished, "hold"), stream_answer]) as server:
        records = run(server, 2)  # the request timeout (10 s) would fail the first request if it waited for the end
    assert [(r.error, r.output_tokens) for r in records] == [(None, 4), (None, 5)]
    assert server.connections == 2  # the unfinished connection is not used again


def test_a_server_that_answers_nothing_times_out_and_is_not_retried():
    with Scripted([lambda c, i: (b"", "hold")] * 2) as server:
        records = measure(server.url, [one("hi", 8)], 1, {}, timeout=1)
    assert records[0].error == "timeout"
    assert server.requests == 1


ONE_CHUNK = b'data: {"a": 1}\n\n'  # 16 bytes
MALFORMED = {
    "chunk size with sign, prefix and digit separator": (
        STREAM_HEAD + b"Transfer-Encoding: chunked\r\n\r\n +0x1_0 \r\n" + ONE_CHUNK + b"\r\n0\r\n\r\n",
        "Invalid character in chunk size",
    ),
    "repeated Content-Length": (
        STREAM_HEAD + b"Content-Length: 16\r\nContent-Length: 16\r\n\r\n" + ONE_CHUNK,
        "Duplicate Content-Length",
    ),
    "Content-Length not digits": (
        STREAM_HEAD + b"Content-Length: +16\r\n\r\n" + ONE_CHUNK,
        "Invalid character in Content-Length",
    ),
    "repeated Transfer-Encoding": (
        STREAM_HEAD
        + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n"
        + ONE_CHUNK
        + b"\r\n0\r\n\r\n",
        "repeats its transfer-encoding header",
    ),
    "a transfer coding other than chunked": (
        STREAM_HEAD + b"Transfer-Encoding: gzip, chunked\r\n\r\n10\r\n" + ONE_CHUNK + b"\r\n0\r\n\r\n",
        "only chunked is read",
    ),
    "both Content-Length and Transfer-Encoding": (
        STREAM_HEAD + b"Content-Length: 16\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n" + ONE_CHUNK + b"\r\n0\r\n\r\n",
        "Transfer-Encoding can't be present with Content-Length",
    ),
    "chunk data longer than its size": (
        STREAM_HEAD + b"Transfer-Encoding: chunked\r\n\r\n8\r\n" + ONE_CHUNK + b"\r\n0\r\n\r\n",
        "Expected LF after chunk data",
    ),
    "a header line without a colon": (
        STREAM_HEAD + b"Content-Length 16\r\n\r\n" + ONE_CHUNK,
        "Invalid header field char",
    ),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_framing_fails_its_request_with_what_was_wrong_and_its_connection_is_dropped(case):
    answer, reason = MALFORMED[case]
    with Scripted([lambda c, i: (answer, "keep"), stream_answer]) as server:
        records = run(server, 2)
    assert records[0].error == "client_error"
    assert "malformed HTTP/1.1 framing in the server's answer 'HTTP/1.1 200 OK'" in records[0].error_detail
    assert reason in records[0].error_detail
    assert records[0].chunk_times == []  # nothing of a malformed answer is taken as content
    assert (records[1].error, records[1].output_tokens) == (None, 5)
    assert server.connections == 2  # the next request went out on a new connection


def test_bytes_after_the_answer_keep_the_answer_but_not_the_connection():
    body = sse(*native(3))
    extra = STREAM_HEAD + b"Content-Length: %d\r\n\r\n" % len(body) + body + b"HTTP/1.1 200 OK\r\n"
    with Scripted([lambda c, i: (extra, "keep"), stream_answer]) as server:
        records = run(server, 2)
    assert [(r.error, r.output_tokens) for r in records] == [(None, 3), (None, 5)]
    assert server.connections == 2
