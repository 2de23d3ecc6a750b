"""The load generator: how requests are sent and timed.

Load models:
- closed loop (default): ``concurrency`` slots; a free slot takes the next
  session in workload order and runs its turns one after the other (a turn's
  prompt is the previous context + the reply + the next message). With think
  time, the slot is released while the session's user thinks, and the session
  continues on the next free slot afterwards.
- open loop: sessions start at Poisson arrival times (``rate`` per second),
  or (``trace``) at each session's own arrival time (a traced request's);
  ``concurrency`` caps requests in flight, so a late send shows as queue delay.

Protocols: SGLang's native ``/generate`` (default) or the OpenAI-compatible
``/v1/chat/completions`` and ``/v1/completions`` (streaming with usage). Each
content chunk's arrival time and token count (from the server's cumulative
completion tokens) is recorded; nothing is re-tokenised on the client.

A request fails (and is recorded with its category, never dropped) when the
connection fails, the status is not 200, it times out, the stream ends without
``[DONE]``, the server reports an error inside the stream (SGLang sends
``data: {"error": ...}`` then ``[DONE]`` over HTTP 200), the server aborts it
(finish reason ``abort``), or reading its stream raises anything else. The
streams are read by ``http1`` as their bytes arrive, so no line is too long to
read (SGLang's native stream without ``--incremental-streaming-output`` repeats
the whole text in every chunk) and a busy client does not date chunks late.
"""

from __future__ import annotations

import asyncio
import gc
import json
import random
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import orjson

from .http1 import ConnectFailed, Disconnected, Pool
from .text import QWEN_CHATML, ChatTemplate
from .workloads import Session

# Failure categories (metrics.failures; docs/metrics.md): a failed request is recorded,
# never dropped.
CONNECT, HTTP_STATUS, TIMEOUT, TRUNCATED, SERVER_DIED = "connect", "http_status", "timeout", "truncated", "server_died"
SERVER_ERROR, ABORTED, CLIENT_ERROR = "server_error", "aborted", "client_error"
PROTOCOLS = ("native", "openai-chat", "openai-completions")


@dataclass
class LoadModel:
    """How requests are offered: closed loop (default) or Poisson arrivals; optional think time between turns."""

    model: str = "closed"  # closed | poisson | trace (each session at its own arrival time)
    rate: float = 0.0  # sessions per second (poisson)
    think_time: float = 0.0  # seconds between a reply and the session's next turn
    protocol: str = "native"
    seed: int = 0
    headers: dict = field(default_factory=dict)  # e.g. Authorization, from the environment (never logged)
    incremental: bool = False  # native stream sends disjoint text segments (--incremental-streaming-output)
    connections: str = "keep-alive"  # or "per-request": a new TCP connection for every request, set-up in TTFT
    ignore_eos: bool = False  # ask for exactly max_new_tokens tokens; a different length is counted as a mismatch


@dataclass
class RequestRecord:
    """One request as the client saw it. Times are seconds since the start of the run (monotonic clock)."""

    session: str
    turn: int
    kind: str
    t_sched: float = 0.0  # when the load model intended to send it
    t0: float = 0.0  # when it was sent
    t_end: float | None = None  # when it finished: its last chunk, [DONE] or its failure
    chunk_times: list = field(default_factory=list)  # arrival of each content chunk
    chunk_tokens: list = field(default_factory=list)  # tokens carried by each content chunk
    output_tokens: int = 0  # server-reported completion tokens
    expected_tokens: int | None = None  # max_new_tokens when ignore_eos asked for exactly that many
    prompt_tokens: int = 0
    cached_tokens: int = 0
    verify_ct: int | None = None
    server_accept_length: float | None = None  # SGLang's own spec_accept_length (completion_tokens / verify_ct)
    # SGLang's spec_correct_drafts_histogram (spec_accept_histogram before 0.5.21) where the build reports one:
    # index k holds the verify rounds of this request that accepted k drafts
    correct_drafts_histogram: list | None = None
    server_queue_time: float | None = (
        None  # meta_info queue_time as the server reports it (0.0 in SGLang 0.5.16 streams)
    )
    finish_reason: str | None = None
    output_text: str = ""
    error: str | None = None  # failure category, None when successful
    error_detail: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None

    def as_dict(self) -> dict:
        return asdict(self)


def _payload(
    protocol: str, messages: list[dict], thinking: bool, sampling: dict, template: ChatTemplate
) -> tuple[str, dict]:
    """Path and body of a request; the native and completions prompts are the messages rendered by ``template``
    (openai-chat sends the messages: the server applies its own template)."""
    if protocol == "native":
        return "/generate", {"text": template.render(messages, thinking), "sampling_params": sampling, "stream": True}
    common = {
        "model": "default",
        "stream": True,
        "temperature": sampling.get("temperature", 0.0),
        "top_p": sampling.get("top_p", 1.0),
        "max_tokens": sampling.get("max_new_tokens"),
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    if sampling.get("ignore_eos"):
        common["ignore_eos"] = True  # SGLang's OpenAI server takes its sampling extensions in the body
    if protocol == "openai-chat":
        return "/v1/chat/completions", {
            **common,
            "messages": messages,
            "chat_template_kwargs": {"enable_thinking": thinking},
        }
    return "/v1/completions", {**common, "prompt": template.render(messages, thinking)}


HISTOGRAM_FIELDS = ("spec_correct_drafts_histogram", "spec_accept_histogram")  # newest name first


def _histogram(meta: dict) -> list[int] | None:
    """A request's verify rounds by drafts accepted, from whichever of HISTOGRAM_FIELDS its meta_info carries (a list
    of non-negative integers), else None: read where the build reports it, never assumed."""
    for name in HISTOGRAM_FIELDS:
        value = meta.get(name)
        if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
            return list(value)
    return None


class StreamError(Exception):
    """The server reported an error inside an HTTP 200 stream (SGLang's in-band error object)."""


def _in_band_failure(chunk: dict) -> None:
    """Raise StreamError for SGLang's in-band error chunk ({"error": ...} or an OpenAI error object)."""
    if "error" in chunk or chunk.get("object") == "error":
        error = chunk.get("error", chunk)
        message = error.get("message", error) if isinstance(error, dict) else error
        raise StreamError(f"error in the stream: {str(message)[:300]}")


def _parse_chunk(
    protocol: str, chunk: dict, record: RequestRecord, last_tokens: int, incremental: bool = False
) -> tuple[int, str]:
    """Cumulative completion tokens and the output text so far, after one stream chunk."""
    _in_band_failure(chunk)
    if protocol == "native":
        meta = chunk.get("meta_info", {})
        record.prompt_tokens = int(meta.get("prompt_tokens", record.prompt_tokens))
        record.cached_tokens = int(meta.get("cached_tokens", 0) or 0)
        if "spec_verify_ct" in meta:
            record.verify_ct = int(meta["spec_verify_ct"])
        if meta.get("spec_accept_length") is not None:
            record.server_accept_length = float(meta["spec_accept_length"])
        histogram = _histogram(meta)
        if histogram is not None:
            record.correct_drafts_histogram = histogram
        if meta.get("queue_time") is not None:
            record.server_queue_time = float(meta["queue_time"])
        reason = meta.get("finish_reason")
        if reason:
            record.finish_reason = reason.get("type") if isinstance(reason, dict) else str(reason)
        text = chunk.get("text")
        if text is None:  # SGLang may leave intermediate text out; the last chunk carries it
            text = record.output_text
        elif incremental:
            text = record.output_text + text
        return int(meta.get("completion_tokens", last_tokens)), text
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


async def send(
    pool: Pool,
    messages: list[dict],
    sampling: dict,
    record: RequestRecord,
    timeout: float,
    *,
    protocol: str = "native",
    thinking: bool = False,
    alive=None,
    on_chunk=None,
    incremental: bool = False,
    setup_in_ttft: bool = False,
    template: ChatTemplate = QWEN_CHATML,
) -> None:
    """Send one streaming request and fill ``record`` with what arrived and when.

    ``record.t0`` is when the request's bytes went to the kernel (or, with ``setup_in_ttft``, when its connection's
    set-up began); each chunk is dated when the kernel received its bytes (read as they arrive: ``http1``).

    Whatever goes wrong with this request becomes its failure (record.error, with a category); nothing raised
    while reading one stream escapes to the cell. ``on_chunk(arrival_time, chunk)``, if given, sees every parsed
    chunk (used to measure the client's own timing error). ``template`` renders the prompt text (its session's).
    """
    if sampling.get("ignore_eos"):
        record.expected_tokens = int(sampling["max_new_tokens"])
    stream = _Stream(record, protocol, incremental, on_chunk)

    def on_sent(now: float, opened: float | None) -> None:
        record.t0 = opened if setup_in_ttft and opened is not None else now

    record.t0 = time.monotonic()
    try:
        path, payload = _payload(protocol, messages, thinking, sampling, template)  # a template may refuse a turn
        async with asyncio.timeout(timeout):
            answer = await pool.post(path, orjson.dumps(payload), stream.event, on_sent)
        if answer.status != 200:
            record.error = HTTP_STATUS
            record.error_detail = f"HTTP {answer.status}: {answer.body.decode('utf-8', 'replace')[:300]}"
        elif record.finish_reason == "abort":
            record.error = ABORTED
            record.error_detail = f"the server aborted the request after {record.output_tokens} tokens"
        elif not stream.done:
            record.error, record.error_detail = TRUNCATED, "stream ended without [DONE]"
    except Exception as exc:  # whatever happens while reading this stream fails this request only
        record.error, record.error_detail = _failure(exc, record.output_tokens, timeout)
    record.t_end = time.monotonic()
    if record.error in (CONNECT, TRUNCATED, TIMEOUT) and alive is not None and await _died(alive):
        record.error = SERVER_DIED


class _Stream:
    """One request's stream as its events arrive: each chunk that carries content dated and counted in the record,
    the text so far kept; ``done`` once [DONE] arrived (the record's output_tokens then hold every token)."""

    def __init__(self, record: RequestRecord, protocol: str, incremental: bool, on_chunk):
        self.record, self.protocol, self.incremental, self.on_chunk = record, protocol, incremental, on_chunk
        self.done = False

    def event(self, now: float, data: bytes) -> bool:
        """Take one event's data that arrived at ``now``; True at the end of the stream."""
        if data == b"[DONE]":
            self.done = True
            return True
        chunk = orjson.loads(data)
        if self.on_chunk is not None:
            self.on_chunk(now, chunk)
        record, last = self.record, self.record.output_tokens
        tokens, text = _parse_chunk(self.protocol, chunk, record, last, self.incremental)
        if tokens > last:  # a chunk carrying content (role-only and empty chunks are not)
            record.chunk_times.append(now)
            record.chunk_tokens.append(tokens - last)
            record.output_tokens = tokens
        record.output_text = text
        return False


def _failure(exc: Exception, tokens: int, timeout: float) -> tuple[str, str]:
    """(category, detail) of what ended a request's stream after ``tokens`` tokens: the server's error in the stream,
    the request's timeout, a connection refused, a connection lost or a chunk cut short (truncated), else the
    client's own error."""
    if isinstance(exc, StreamError):
        return SERVER_ERROR, f"{exc} (after {tokens} tokens)"
    if isinstance(exc, TimeoutError):
        return TIMEOUT, f"no complete answer within {timeout:g} s"
    if isinstance(exc, ConnectFailed):
        return CONNECT, str(exc)
    if isinstance(exc, (Disconnected, OSError)):
        return TRUNCATED, f"{type(exc).__name__}: {exc}"
    if isinstance(exc, json.JSONDecodeError):
        return TRUNCATED, f"malformed stream chunk: {exc}"
    return CLIENT_ERROR, f"{type(exc).__name__}: {exc}"[:500]


async def _died(alive, grace: float = 0.3) -> bool:
    """Whether the server process is gone; a dying process may still be exiting, so look for up to ``grace`` s."""
    deadline = time.monotonic() + grace
    while alive():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


class _SendGate:
    """Requests go out one per pass of the event loop, in the order their slots asked.

    When a wave of requests ends together (a batching server finishes them in one step), their slots would all send
    the next request in one pass: at 64 slots that holds the loop for 20-35 ms, the first chunks of the earliest new
    requests wait unread in their sockets, the kernel merges each with the chunk after it, and the first token is
    dated one chunk late (measured: TTFT error p99 about 10 ms at concurrency 64 in most runs, below 0.3 ms with
    this gate). Between two sends the loop reads what has arrived. A send waits at least one pass.
    """

    def __init__(self):
        self.waiting: deque[asyncio.Future] = deque()  # while not empty, a release is due in the next pass

    async def wait(self) -> None:
        turn = asyncio.get_running_loop().create_future()
        if not self.waiting:
            asyncio.get_running_loop().call_soon(self._release)
        self.waiting.append(turn)
        await turn

    def _release(self) -> None:
        while self.waiting:
            turn = self.waiting.popleft()
            if not turn.done():  # a cancelled slot gives its turn to the next one
                turn.set_result(None)
                break
        if self.waiting:
            asyncio.get_running_loop().call_soon(self._release)  # the next send in the next pass


class Abort:
    """When to abort the sessions under way (``budget: verdict``, once a cell's verdict is decided).

    ``decided(records)`` is asked as each request finishes, with the records so far (the one just finished last).
    Once it answers True, every turn under way is cancelled: its connection is closed, so the server sees the client
    go away and stops the request (SGLang aborts a streaming request whose client disconnects), and no record is
    written for it, not even a partial one; no session starts, and no session waiting to continue (after a turn, or
    while its user thinks) goes on. Afterwards ``turns`` holds the turns cancelled and ``sessions`` the ids of the
    sessions cut short (a turn cancelled, or a turn still to come). A turn is counted as cancelled when its slot had
    not taken its record yet: one whose answer ended in the same read as the deciding one, or one still waiting at
    the send gate (never sent), is counted too. That changes the counts only: a cell's estimate counts the deciding
    look's sessions alone."""

    def __init__(self, decided):
        self.decided = decided
        self.aborted = False  # whether decided answered True
        self.turns = 0
        self.sessions: set[str] = set()


@dataclass
class _SessionState:
    session: Session
    turn: int = 0
    messages: list = field(default_factory=list)
    t_ready: float = 0.0  # when its next turn may be sent


async def run_sessions(
    url: str,
    sessions: list[Session],
    concurrency: int,
    sampling: dict,
    timeout: float,
    thinking: bool = False,
    alive=None,
    load: LoadModel | None = None,
    on_chunk=None,
    on_record=None,
    stop=None,
    abort: Abort | None = None,
) -> list[RequestRecord]:
    """Run the sessions under a load model; returns one record per turn that finished, in the order they finished.
    ``on_record(record)``, if given, is called as each request finishes (progress reports). ``stop(records)``, if
    given, is asked before each new session starts; once it answers True no new session starts (adaptive cells),
    and the sessions under way finish. ``abort`` (an Abort), if given, is asked as each request finishes; once it
    answers True the sessions under way are aborted (see Abort). No task, connection or timer outlives the run."""
    load = load or LoadModel()
    run = _SessionRun(sessions, load, stop, abort, on_record)
    pool = Pool(url, load.headers, per_request=load.connections == "per-request")

    async def turn(state: _SessionState) -> RequestRecord:
        """Send the session's next turn and wait for its answer."""
        record = RequestRecord(state.session.id, state.turn, state.session.kind, t_sched=state.t_ready)
        params = dict(sampling, max_new_tokens=state.session.max_new_tokens)
        if load.ignore_eos or state.session.ignore_eos:
            params["ignore_eos"] = True
        return await run.send_turn(
            state,
            record,
            lambda: send(
                pool,
                state.messages,
                params,
                record,
                timeout,
                protocol=load.protocol,
                thinking=thinking,
                alive=alive,
                on_chunk=on_chunk,
                incremental=load.incremental,
                setup_in_ttft=load.connections == "per-request",
                template=state.session.chat_template,
            ),
        )

    # No garbage collection while the load runs: a collection stops the event loop (a full one walks every object
    # of the process: about 47 ms; even a young one took 4-12 ms at 256 streams), and chunks that wait unread meanwhile
    # are merged by the kernel and dated late. What the run allocates is freed by reference counting; the few cycles
    # (a failed request's traceback) are collected after it.
    with _collection_paused():
        try:
            await run.run_slots(turn, max(1, min(concurrency, len(sessions))))
        finally:
            pool.close()
    _relative_to(run.start, run.records)
    return run.records


def _relative_to(start: float, records: list[RequestRecord]) -> None:
    """Every time of the records (scheduled, sent, ended, each chunk's) as seconds after ``start``, the run's."""
    for r in records:
        r.t_sched -= start
        r.t0 -= start
        r.t_end = r.t_end - start if r.t_end is not None else None
        r.chunk_times = [t - start for t in r.chunk_times]


class _SessionRun:
    """The sessions of one run and its slots: a slot takes the next session due (one back from thinking first, then
    a new one while ``stop`` allows), sends its turns one after another, and frees itself while its user thinks.
    Once ``abort`` decides, every slot and thinking session is cancelled (abort_all)."""

    def __init__(self, sessions: list[Session], load: LoadModel, stop, abort: Abort | None = None, on_record=None):
        self.load, self.stop, self.abort, self.on_record = load, stop, abort, on_record
        self.records: list[RequestRecord] = []
        self.start = time.monotonic()
        self.arrivals = _arrivals(sessions, load, self.start)
        self.continuing: deque[_SessionState] = deque()  # sessions whose think time is over
        self.thinking: dict[asyncio.Task, _SessionState] = {}  # sessions whose user is thinking
        self.slots: list[asyncio.Task] = []
        self.aborting = False
        self.wake = asyncio.Event()
        self.gate = _SendGate()

    def next_state(self) -> _SessionState | None:
        if self.aborting:
            return None
        if self.continuing:
            return self.continuing.popleft()
        if self.arrivals and self.stop is not None and self.stop(self.records):
            self.arrivals.clear()  # no new session from now on
        if self.arrivals:
            return self.arrivals.popleft()
        return None

    async def run_slots(self, turn, count: int) -> None:
        """``count`` slots until no session is left (or the abort); a slot's own error is raised (send keeps each
        request's); no task of the run outlives it."""
        try:
            self.slots = [asyncio.create_task(self.slot(turn)) for _ in range(count)]
            finished, _ = await asyncio.wait(self.slots, return_when=asyncio.FIRST_EXCEPTION)
            for task in finished:
                error = None if task.cancelled() else task.exception()
                if error is not None:
                    raise error
        finally:
            await self.settle()

    async def send_turn(self, state: _SessionState, record: RequestRecord, sending) -> RequestRecord:
        """A turn of ``state``'s session: its send (``sending()``: client.send filling ``record``) once the gate lets
        it go, then its record kept (on_record told) and the abort asked. A turn cancelled by the abort is counted
        (cut_short) and leaves no record; its connection is closed (http1.Pool.post), so the server stops it."""
        try:
            await self.gate.wait()
            await sending()
        except asyncio.CancelledError:
            self.cut_short(state, turn_cancelled=True)
            raise
        self.records.append(record)
        if self.on_record is not None:
            self.on_record(record)
        self.ask_abort()
        return record

    def ask_abort(self) -> None:
        """After a request finished: abort the sessions under way if ``abort`` decides so."""
        if self.abort is not None and not self.aborting and self.abort.decided(self.records):
            self.abort.aborted = True
            self.abort_all()

    def abort_all(self) -> None:
        """Start no session or turn from now on; cancel every other slot (its turn under way: cut_short) and every
        thinking session; the sessions waiting to continue are cut short. The slot that asked returns by itself."""
        self.aborting = True
        self.arrivals.clear()
        while self.continuing:
            self.cut_short(self.continuing.popleft())
        current = asyncio.current_task()
        for task in [*self.slots, *self.thinking]:
            if task is not current:
                task.cancel()
        self.wake.set()

    def cut_short(self, state: _SessionState, turn_cancelled: bool = False) -> None:
        """Count a session cut short by the abort (a turn of it cancelled, or a turn still to come)."""
        if self.aborting and self.abort is not None:
            self.abort.turns += turn_cancelled
            self.abort.sessions.add(state.session.id)

    async def settle(self) -> None:
        """Cancel whatever of the run is still pending (an error or an outside cancellation ended it) and wait for it
        to end: no task of the run outlives it."""
        rest = [task for task in [*self.slots, *self.thinking] if not task.done()]
        for task in rest:
            task.cancel()
        if rest:
            await asyncio.gather(*rest, return_exceptions=True)

    async def think(self, state: _SessionState) -> None:
        try:
            await asyncio.sleep(self.load.think_time)
        except asyncio.CancelledError:
            self.cut_short(state)
            raise
        finally:
            self.thinking.pop(asyncio.current_task(), None)  # type: ignore[arg-type]
        state.t_ready = time.monotonic()
        self.continuing.append(state)
        self.wake.set()

    async def slot(self, turn) -> None:
        """One slot of the load until no session is left: ``turn(state)`` sends a session's next turn."""
        while True:
            state = self.next_state()
            if state is None:
                if self.aborting or (not self.thinking and not self.continuing):
                    self.wake.set()
                    return
                self.wake.clear()
                await self.wake.wait()
                continue
            if self.load.model == "closed" and state.turn == 0:
                state.t_ready = time.monotonic()  # closed loop: a session is due when a slot is free
            delay = state.t_ready - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await self.session_turns(state, turn)

    async def session_turns(self, state: _SessionState, turn) -> None:
        """A session's turns from ``state`` on, until it ends, fails, or its user thinks (the slot freed)."""
        while True:
            record = await turn(state)
            session = state.session
            if not record.ok or state.turn == len(session.followups):
                return
            if self.aborting:
                self.cut_short(state)  # a turn still to come: dropped
                return
            state.messages = state.messages + [
                {"role": "assistant", "content": record.output_text},
                session.followups[state.turn],
            ]
            state.turn += 1
            if self.load.think_time > 0:  # release the slot while the user thinks
                task = asyncio.get_running_loop().create_task(self.think(state))
                self.thinking[task] = state
                return
            state.t_ready = time.monotonic()


def _arrivals(sessions: list[Session], load: LoadModel, start: float) -> deque[_SessionState]:
    """Each session's first turn, due at ``start`` (closed loop: when a slot frees) or, under the Poisson model, at
    start + its arrival time (exponential gaps of mean 1 / rate, seeded by the load's seed), under the trace model
    at start + the session's own arrival (a traced request's replay time)."""
    arrivals: deque[_SessionState] = deque()
    clock = 0.0
    rng = random.Random(f"arrivals:{load.seed}")
    for s in sessions:
        if load.model == "poisson":
            clock += rng.expovariate(load.rate)
        due = {"poisson": clock, "trace": s.arrival or 0.0}.get(load.model, 0.0)
        arrivals.append(_SessionState(s, 0, list(s.messages), start + due))
    return arrivals


@contextmanager
def _collection_paused():
    """No garbage collection while the load runs (see run_sessions); collection as it was afterwards."""
    gc.freeze()
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.unfreeze()
        if collecting:
            gc.enable()


def measure(
    url: str,
    sessions: list[Session],
    concurrency: int,
    sampling: dict,
    timeout: float,
    thinking: bool = False,
    alive=None,
    load: LoadModel | None = None,
    on_chunk=None,
    on_record=None,
    stop=None,
    abort: Abort | None = None,
) -> list[RequestRecord]:
    """Synchronous wrapper around run_sessions."""
    return asyncio.run(
        run_sessions(
            url, sessions, concurrency, sampling, timeout, thinking, alive, load, on_chunk, on_record, stop, abort
        )
    )
