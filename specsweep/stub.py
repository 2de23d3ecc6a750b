"""A streaming stub server with a known emission schedule, to check the client's timing.

    python -m specsweep.stub --port P --schedule 0.05:1,0.02:4,0.02:2 [--empty-first-chunk]
    python -m specsweep.stub --port P --tokens 256 --tokens-per-chunk 1     (zero latency)
    python -m specsweep.stub --port P --schedule ... --behaviours ok,error@0,error@3,abort@2,longline,garbage

Answers SGLang's native ``/generate`` (streaming): chunk i is sent ``delay_i``
seconds after the previous one and carries ``tokens_i`` tokens; each chunk's
``meta_info.emitted_at`` is the server's CLOCK_MONOTONIC at sending, so a client
on the same host can measure its own timing error. Not a model: no text
meaning, no batching.

A request's ``meta_info.received_at`` is when its bytes reached the stub's
socket (the kernel's stamp), so the stub's own delay in getting round to a
request is not counted against the client.

``--behaviours`` makes request i (counted from 1, cycling through the list)
misbehave the way SGLang does in band, over HTTP 200: ``error@K`` sends K
chunks then ``data: {"error": ...}`` and ``[DONE]``; ``abort@K`` ends after K
chunks with finish reason ``abort``; ``longline`` repeats a 600 KiB text in
every chunk (longer than aiohttp's line limit); ``garbage`` sends a chunk that
is JSON but not an object; ``ok`` behaves.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import time

from aiohttp import web

from .client import StampedSocket, arrival, stamped


def parse_schedule(text: str) -> list[tuple[float, int]]:
    """'0.05:1,0.02:4' -> [(0.05, 1), (0.02, 4)]: delay before each chunk and its tokens."""
    out = []
    for item in text.split(","):
        delay, tokens = item.split(":")
        out.append((float(delay), int(tokens)))
    return out


async def on_schedule(schedule: list[tuple[float, int]]):
    """Yield (tokens in this chunk, tokens so far, last chunk?) at the scheduled times, drift-free."""
    loop = asyncio.get_running_loop()
    deadline, produced = loop.time(), 0
    for index, (delay, tokens) in enumerate(schedule):
        deadline += delay
        wait = deadline - loop.time()
        if wait > 0:
            await asyncio.sleep(wait)
        produced += tokens
        yield tokens, produced, index == len(schedule) - 1


def _sse(payload) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


LONG_TEXT = "x" * (600 * 1024)


def parse_behaviour(text: str) -> tuple[str, int]:
    """'error@3' -> ('error', 3): what request i does, and after how many chunks."""
    name, _, after = text.partition("@")
    if name not in ("ok", "error", "abort", "longline", "garbage"):
        raise ValueError(f"unknown behaviour {text!r}")
    return name, int(after or 0)


def build_app(schedule: list[tuple[float, int]], empty_first: bool,
              behaviours: list[tuple[str, int]] = (("ok", 0),)) -> web.Application:
    app = web.Application()

    async def ok(request):
        return web.Response(text="")

    counter = {"requests": 0}

    def next_behaviour() -> tuple[int, str, int]:
        counter["requests"] += 1
        rid = counter["requests"]
        return (rid, *behaviours[(rid - 1) % len(behaviours)])

    async def fail_in_band(resp, name: str) -> None:
        if name == "error":
            await resp.write(_sse({"error": {"message": "stub: injected in-band error", "type": "internal_error"}}))
        elif name == "garbage":
            await resp.write(_sse([1, 2, 3]))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()

    async def generate(request):
        # the server side of TTFT starts here: when the request reached the socket
        received = arrival(stamped(request.transport), time.monotonic())
        await request.read()
        rid, name, after = next_behaviour()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        text = ""
        if empty_first:
            await resp.write(_sse({"text": "", "meta_info": {"completion_tokens": 0, "prompt_tokens": 8}}))
        chunks = 0
        async for tokens, produced, last in on_schedule(schedule):
            if name in ("error", "garbage") and chunks == after:
                await fail_in_band(resp, name)
                return resp
            text += " tok" * tokens
            stop = last or (name == "abort" and chunks + 1 == after)
            reason = ({"type": "abort", "message": "stub: aborted"} if name == "abort" else {"type": "length"})
            await resp.write(_sse({"text": LONG_TEXT + text if name == "longline" else text, "meta_info": {
                "completion_tokens": produced, "prompt_tokens": 8, "id": rid, "emitted_at": time.monotonic(),
                "received_at": received,
                "client_port": request.transport.get_extra_info("peername")[1],
                "finish_reason": reason if stop else None}}))
            chunks += 1
            if stop:
                break
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def openai(request):
        """OpenAI-compatible streaming (/v1/completions, /v1/chat/completions) on the same schedule."""
        body = await request.json()
        chat = request.path.endswith("chat/completions")
        _, name, after = next_behaviour()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        options = body.get("stream_options") or {}
        produced, chunks = 0, 0
        async for tokens, produced, last in on_schedule(schedule):
            if name in ("error", "garbage") and chunks == after:
                await fail_in_band(resp, name)
                return resp
            text = " tok" * tokens
            stop = last or (name == "abort" and chunks + 1 == after)
            chunks += 1
            choice = ({"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text})
            choice["finish_reason"] = ("abort" if name == "abort" else "length") if stop else None
            chunk = {"id": "stub", "object": "chat.completion.chunk" if chat else "text_completion",
                     "model": body.get("model", "stub"), "choices": [choice], "emitted_at": time.monotonic()}
            if options.get("continuous_usage_stats"):
                chunk["usage"] = {"prompt_tokens": 8, "completion_tokens": produced, "total_tokens": 8 + produced}
            await resp.write(_sse(chunk))
            if stop:
                break
        if options.get("include_usage"):
            usage = {"prompt_tokens": 8, "completion_tokens": produced, "total_tokens": 8 + produced}
            await resp.write(_sse({"id": "stub", "choices": [], "usage": usage}))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def models(request):
        return web.json_response({"object": "list", "data": [{"id": "stub", "object": "model"}]})

    app.router.add_post("/v1/completions", openai)
    app.router.add_post("/v1/chat/completions", openai)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", ok)
    app.router.add_get("/health_generate", ok)
    app.router.add_post("/generate", generate)
    return app


class _Listener(socket.socket):
    """A listening socket whose connections are StampedSockets (each request's arrival stamped by the kernel)."""

    def accept(self):
        fd, address = self._accept()
        return StampedSocket(self.family, self.type, self.proto, fileno=fd).start_stamping(), address


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m specsweep.stub", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--schedule", help="delay:tokens,... for each chunk")
    p.add_argument("--tokens", type=int, default=256, help="zero-latency mode: tokens per request")
    p.add_argument("--tokens-per-chunk", type=int, default=1)
    p.add_argument("--empty-first-chunk", action="store_true", help="send a chunk without tokens first")
    p.add_argument("--behaviours", default="ok", help="per request, cycling: ok, error@K, abort@K, longline, garbage")
    args = p.parse_args(argv)
    if args.schedule:
        schedule = parse_schedule(args.schedule)
    else:
        schedule = [(0.0, args.tokens_per_chunk)] * (args.tokens // args.tokens_per_chunk)
    behaviours = [parse_behaviour(b) for b in args.behaviours.split(",")]
    listener = _Listener(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((args.host, args.port))
    web.run_app(build_app(schedule, args.empty_first_chunk, behaviours), sock=listener, print=None, access_log=None)


if __name__ == "__main__":
    main()
