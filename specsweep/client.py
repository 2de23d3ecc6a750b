"""The load generator: how requests are sent and timed.

Closed loop: ``concurrency`` slots, each taking the next session from the
workload in order and running its turns one after the other (a turn's prompt
is the previous context + the reply + the next message). Requests stream from
SGLang's native ``/generate``; every chunk's arrival time and token count (from
the server's cumulative ``completion_tokens``) is recorded. Nothing is
re-tokenised on the client.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field

import aiohttp

from .text import chat_prompt
from .workloads import Session

# Failure categories (METRICS.md): a failed request is recorded, never dropped.
CONNECT, HTTP_STATUS, TIMEOUT, TRUNCATED, SERVER_DIED = "connect", "http_status", "timeout", "truncated", "server_died"


@dataclass
class RequestRecord:
    """One request as the client saw it. Times are seconds on the client's monotonic clock."""

    session: str
    turn: int
    kind: str
    t_sched: float = 0.0
    t0: float = 0.0
    chunk_times: list = field(default_factory=list)  # arrival of each content chunk
    chunk_tokens: list = field(default_factory=list)  # tokens carried by each content chunk
    output_tokens: int = 0  # server-reported completion_tokens
    prompt_tokens: int = 0
    cached_tokens: int = 0
    verify_ct: int | None = None
    finish_reason: str | None = None
    output_text: str = ""
    error: str | None = None  # failure category, None when successful
    error_detail: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None

    def as_dict(self) -> dict:
        return asdict(self)


async def stream_generate(http: aiohttp.ClientSession, url: str, prompt: str, sampling: dict,
                          record: RequestRecord, timeout: float, alive=None) -> None:
    """Send one streaming /generate request and fill ``record`` with what arrived and when."""
    payload = {"text": prompt, "sampling_params": sampling, "stream": True}
    last_tokens = 0
    done = False
    record.t0 = time.monotonic()
    try:
        async with asyncio.timeout(timeout):
            async with http.post(url + "/generate", json=payload) as resp:
                if resp.status != 200:
                    body = (await resp.text())[:300]
                    record.error, record.error_detail = HTTP_STATUS, f"HTTP {resp.status}: {body}"
                    return
                async for raw in resp.content:
                    now = time.monotonic()
                    line = raw.strip()
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        done = True
                        break
                    chunk = json.loads(data)
                    meta = chunk.get("meta_info", {})
                    tokens = int(meta.get("completion_tokens", last_tokens))
                    if tokens > last_tokens:  # a chunk carrying content
                        record.chunk_times.append(now)
                        record.chunk_tokens.append(tokens - last_tokens)
                        last_tokens = tokens
                    record.output_text = chunk.get("text", record.output_text)
                    record.output_tokens = tokens
                    record.prompt_tokens = int(meta.get("prompt_tokens", 0))
                    record.cached_tokens = int(meta.get("cached_tokens", 0) or 0)
                    if "spec_verify_ct" in meta:
                        record.verify_ct = int(meta["spec_verify_ct"])
                    reason = meta.get("finish_reason")
                    if reason:
                        record.finish_reason = reason.get("type") if isinstance(reason, dict) else str(reason)
        if not done:
            record.error, record.error_detail = TRUNCATED, "stream ended without [DONE]"
    except TimeoutError:
        record.error, record.error_detail = TIMEOUT, f"no complete answer within {timeout:g} s"
    except (aiohttp.ClientConnectorError, ConnectionRefusedError) as exc:
        record.error, record.error_detail = CONNECT, str(exc)
    except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
        record.error, record.error_detail = TRUNCATED, f"{type(exc).__name__}: {exc}"
    if record.error in (CONNECT, TRUNCATED, TIMEOUT) and alive is not None and not alive():
        record.error = SERVER_DIED


async def run_sessions(url: str, sessions: list[Session], concurrency: int, sampling: dict,
                       timeout: float, thinking: bool = False, alive=None) -> list[RequestRecord]:
    """Closed loop over sessions at a concurrency; returns one record per turn sent, in send order."""
    records: list[RequestRecord] = []
    queue = list(reversed(sessions))
    start = time.monotonic()
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    client_timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)

    async def slot(http):
        while queue:
            session = queue.pop()
            messages = list(session.messages)
            for turn in range(1 + len(session.followups)):
                record = RequestRecord(session.id, turn, session.kind, t_sched=time.monotonic())
                params = dict(sampling, max_new_tokens=session.max_new_tokens)
                await stream_generate(http, url, chat_prompt(messages, thinking), params, record, timeout, alive)
                records.append(record)
                if not record.ok or turn == len(session.followups):
                    break
                messages = messages + [{"role": "assistant", "content": record.output_text},
                                       session.followups[turn]]

    async with aiohttp.ClientSession(connector=connector, timeout=client_timeout) as http:
        await asyncio.gather(*(slot(http) for _ in range(min(concurrency, len(sessions)))))
    for r in records:  # times relative to the start of the run
        r.t_sched -= start
        r.t0 -= start
        r.chunk_times = [t - start for t in r.chunk_times]
    return records


def measure(url: str, sessions: list[Session], concurrency: int, sampling: dict, timeout: float,
            thinking: bool = False, alive=None) -> list[RequestRecord]:
    """Synchronous wrapper around run_sessions."""
    return asyncio.run(run_sessions(url, sessions, concurrency, sampling, timeout, thinking, alive))
