"""Server-sent events as SGLang streams them: one ``data: <json>`` event per chunk, then ``data: [DONE]``.

Shared by the simulated server and the timing stub (tests/fixtures/timing_stub.py), so both frame their streams
exactly as the client reads SGLang's.
"""

from __future__ import annotations

import orjson

from aiohttp import web

DONE = b"data: [DONE]\n\n"


def event(payload) -> bytes:
    """One server-sent event carrying ``payload`` as JSON (orjson, as SGLang writes its streams)."""
    return b"data: " + orjson.dumps(payload) + b"\n\n"


class EventStream:
    """One streamed HTTP answer: ``open`` it on a request, ``send`` each chunk, ``close`` it with [DONE]."""

    def __init__(self, response: web.StreamResponse):
        self.response = response

    @classmethod
    async def open(cls, request: web.Request) -> "EventStream":
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        return cls(response)

    async def send(self, payload) -> None:
        await self.response.write(event(payload))

    async def close(self) -> web.StreamResponse:
        await self.response.write(DONE)
        await self.response.write_eof()
        return self.response
