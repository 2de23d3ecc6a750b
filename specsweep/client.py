"""The load generator: how requests are sent and timed.

Load models:
- closed loop (default): ``concurrency`` slots; a free slot takes the next
  session in workload order and runs its turns one after the other (a turn's
  prompt is the previous context + the reply + the next message). With think
  time, the slot is released while the session's user thinks, and the session
  continues on the next free slot afterwards.
- open loop: sessions start at Poisson arrival times (``rate`` per second);
  ``concurrency`` caps requests in flight, so a late send shows as queue delay.

Protocols: SGLang's native ``/generate`` (default) or the OpenAI-compatible
``/v1/chat/completions`` and ``/v1/completions`` (streaming with usage). Each
content chunk's arrival time and token count (from the server's cumulative
completion tokens) is recorded; nothing is re-tokenised on the client.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import deque
from dataclasses import asdict, dataclass, field

import aiohttp

from .text import chat_prompt
from .workloads import Session

# Failure categories (METRICS.md): a failed request is recorded, never dropped.
CONNECT, HTTP_STATUS, TIMEOUT, TRUNCATED, SERVER_DIED = "connect", "http_status", "timeout", "truncated", "server_died"
PROTOCOLS = ("native", "openai-chat", "openai-completions")


@dataclass
class LoadModel:
    """How requests are offered: closed loop (default) or Poisson arrivals; optional think time between turns."""

    model: str = "closed"  # closed | poisson
    rate: float = 0.0  # sessions per second (poisson)
    think_time: float = 0.0  # seconds between a reply and the session's next turn
    protocol: str = "native"
    seed: int = 0
    headers: dict = field(default_factory=dict)  # e.g. Authorization, from the environment (never logged)


@dataclass
class RequestRecord:
    """One request as the client saw it. Times are seconds since the start of the run (monotonic clock)."""

    session: str
    turn: int
    kind: str
    t_sched: float = 0.0  # when the load model intended to send it
    t0: float = 0.0  # when it was sent
    chunk_times: list = field(default_factory=list)  # arrival of each content chunk
    chunk_tokens: list = field(default_factory=list)  # tokens carried by each content chunk
    output_tokens: int = 0  # server-reported completion tokens
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


def _payload(protocol: str, messages: list[dict], thinking: bool, sampling: dict) -> tuple[str, dict]:
    if protocol == "native":
        return "/generate", {"text": chat_prompt(messages, thinking), "sampling_params": sampling, "stream": True}
    common = {"model": "default", "stream": True, "temperature": sampling.get("temperature", 0.0),
              "top_p": sampling.get("top_p", 1.0), "max_tokens": sampling.get("max_new_tokens"),
              "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    if protocol == "openai-chat":
        return "/v1/chat/completions", {**common, "messages": messages,
                                        "chat_template_kwargs": {"enable_thinking": thinking}}
    return "/v1/completions", {**common, "prompt": chat_prompt(messages, thinking)}


def _parse_chunk(protocol: str, chunk: dict, record: RequestRecord, last_tokens: int) -> tuple[int, str]:
    """Cumulative completion tokens and text delta-applied output of one stream chunk."""
    if protocol == "native":
        meta = chunk.get("meta_info", {})
        record.prompt_tokens = int(meta.get("prompt_tokens", record.prompt_tokens))
        record.cached_tokens = int(meta.get("cached_tokens", 0) or 0)
        if "spec_verify_ct" in meta:
            record.verify_ct = int(meta["spec_verify_ct"])
        reason = meta.get("finish_reason")
        if reason:
            record.finish_reason = reason.get("type") if isinstance(reason, dict) else str(reason)
        return int(meta.get("completion_tokens", last_tokens)), chunk.get("text", record.output_text)
    usage = chunk.get("usage") or {}
    text = record.output_text
    for choice in chunk.get("choices", []):
        delta = choice.get("delta", {}).get("content") if protocol == "openai-chat" else choice.get("text")
        text += delta or ""
        if choice.get("finish_reason"):
            record.finish_reason = choice["finish_reason"]
    if usage:
        record.prompt_tokens = int(usage.get("prompt_tokens", record.prompt_tokens))
        details = usage.get("prompt_tokens_details") or {}
        record.cached_tokens = int(details.get("cached_tokens", 0) or 0)
    return int(usage.get("completion_tokens", last_tokens)), text


async def send(http: aiohttp.ClientSession, url: str, messages: list[dict], sampling: dict, record: RequestRecord,
               timeout: float, protocol: str = "native", thinking: bool = False, alive=None, on_chunk=None) -> None:
    """Send one streaming request and fill ``record`` with what arrived and when.

    ``on_chunk(arrival_time, chunk)``, if given, sees every parsed chunk (used to measure the client's own timing error).
    """
    path, payload = _payload(protocol, messages, thinking, sampling)
    last_tokens = 0
    done = False
    record.t0 = time.monotonic()
    try:
        async with asyncio.timeout(timeout):
            async with http.post(url + path, json=payload) as resp:
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
                    if on_chunk is not None:
                        on_chunk(now, chunk)
                    tokens, text = _parse_chunk(protocol, chunk, record, last_tokens)
                    if tokens > last_tokens:  # a chunk carrying content (role-only and empty chunks are not)
                        record.chunk_times.append(now)
                        record.chunk_tokens.append(tokens - last_tokens)
                        last_tokens = tokens
                    record.output_text = text
                    record.output_tokens = last_tokens
        if not done:
            record.error, record.error_detail = TRUNCATED, "stream ended without [DONE]"
    except TimeoutError:
        record.error, record.error_detail = TIMEOUT, f"no complete answer within {timeout:g} s"
    except (aiohttp.ClientConnectorError, ConnectionRefusedError) as exc:
        record.error, record.error_detail = CONNECT, str(exc)
    except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
        record.error, record.error_detail = TRUNCATED, f"{type(exc).__name__}: {exc}"
    except json.JSONDecodeError as exc:
        record.error, record.error_detail = TRUNCATED, f"malformed stream chunk: {exc}"
    if record.error in (CONNECT, TRUNCATED, TIMEOUT) and alive is not None and await _died(alive):
        record.error = SERVER_DIED


async def _died(alive, grace: float = 0.3) -> bool:
    """Whether the server process is gone; a dying process may still be exiting, so look for up to ``grace`` s."""
    deadline = time.monotonic() + grace
    while alive():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


@dataclass
class _SessionState:
    session: Session
    turn: int = 0
    messages: list = field(default_factory=list)
    t_ready: float = 0.0  # when its next turn may be sent


async def run_sessions(url: str, sessions: list[Session], concurrency: int, sampling: dict, timeout: float,
                       thinking: bool = False, alive=None, load: LoadModel | None = None,
                       on_chunk=None) -> list[RequestRecord]:
    """Run the sessions under a load model; returns one record per turn sent, in send order."""
    load = load or LoadModel()
    records: list[RequestRecord] = []
    start = time.monotonic()
    arrivals = deque()
    clock = 0.0
    rng = random.Random(f"arrivals:{load.seed}")
    for s in sessions:
        if load.model == "poisson":
            clock += rng.expovariate(load.rate)
        arrivals.append(_SessionState(s, 0, list(s.messages), start + (clock if load.model == "poisson" else 0.0)))
    continuing: deque[_SessionState] = deque()  # sessions whose think time is over
    thinking_sessions = 0
    wake = asyncio.Event()
    connector = aiohttp.TCPConnector(limit=0)
    client_timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)

    async def think(state: _SessionState):
        nonlocal thinking_sessions
        await asyncio.sleep(load.think_time)
        thinking_sessions -= 1
        state.t_ready = time.monotonic()
        continuing.append(state)
        wake.set()

    def next_state() -> _SessionState | None:
        if continuing:
            return continuing.popleft()
        if arrivals:
            return arrivals.popleft()
        return None

    async def slot(http):
        nonlocal thinking_sessions
        while True:
            state = next_state()
            if state is None:
                if thinking_sessions == 0 and not continuing:
                    wake.set()
                    return
                wake.clear()
                await wake.wait()
                continue
            if load.model == "closed" and state.turn == 0:
                state.t_ready = time.monotonic()  # closed loop: a session is due when a slot is free
            delay = state.t_ready - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            while True:
                session = state.session
                record = RequestRecord(session.id, state.turn, session.kind, t_sched=state.t_ready)
                params = dict(sampling, max_new_tokens=session.max_new_tokens)
                await send(http, url, state.messages, params, record, timeout, load.protocol, thinking, alive, on_chunk)
                records.append(record)
                if not record.ok or state.turn == len(session.followups):
                    break
                state.messages = state.messages + [{"role": "assistant", "content": record.output_text},
                                                   session.followups[state.turn]]
                state.turn += 1
                if load.think_time > 0:  # release the slot while the user thinks
                    thinking_sessions += 1
                    asyncio.get_running_loop().create_task(think(state))
                    break
                state.t_ready = time.monotonic()

    async with aiohttp.ClientSession(connector=connector, timeout=client_timeout, headers=load.headers) as http:
        await asyncio.gather(*(slot(http) for _ in range(max(1, min(concurrency, len(sessions))))))
    for r in records:  # times relative to the start of the run
        r.t_sched -= start
        r.t0 -= start
        r.chunk_times = [t - start for t in r.chunk_times]
    return records


def measure(url: str, sessions: list[Session], concurrency: int, sampling: dict, timeout: float,
            thinking: bool = False, alive=None, load: LoadModel | None = None, on_chunk=None) -> list[RequestRecord]:
    """Synchronous wrapper around run_sessions."""
    return asyncio.run(run_sessions(url, sessions, concurrency, sampling, timeout, thinking, alive, load, on_chunk))
