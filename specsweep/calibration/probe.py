"""The shapes a calibration measures through a running server's HTTP API, so that the same code measures a real
SGLang server and the simulated one:

- decode steps (AR server): for each batch b of ``calibration.batches`` and context c of ``calibration.contexts``,
  b requests of about c prompt tokens sent together, each asking for ``calibration.new_tokens`` tokens (ignore_eos,
  temperature 0); a step is a gap between two chunks of one request (one chunk per step, as SGLang and the
  simulator stream), taken while all b requests are in flight: the shape's step is the slope of each request's
  chunk arrival times against their number (least squares, so that a chunk that arrives late moves one point),
  averaged over the batch;
- verify rounds (each speculative method's server): the same shapes; a round's gap holds the drafter's pass and
  the target's verify of the method's width or tree, which the HTTP API cannot separate (the fit splits them
  through the drafter's parameters: DFlash's drafter_fraction, the draft models' draft_*);
- prefill (every server): a request of c tokens admitted while another one streams; the streaming request's gap
  across the admission is the step that prefills it (both ends of the gap on one stream, so the client's own
  latency cancels), the median of ``calibration.prefill_repeats``;
- first token (every server): a lone request of c tokens (one new token) on an idle server, its first token's arrival
  after it was sent (the least of ``calibration.prefill_repeats``: a busy host only adds to a lone request's
  time, through the client's and the server's event loops): its prefill's steps plus the time a request
  spends in the server outside them (the HTTP server, tokenization, the hand-offs to the scheduler and back from
  the detokenizer: the runtime's request_latency + request_latency_per_token x prompt tokens), which the batch and
  prefill shapes cannot see (both ends of their gaps are on one stream).

A shape the server refuses (an HTTP error, or longer than model.context_length), cannot hold (its KV cache holds
fewer than b x (c + new tokens), a request was retracted, or the b requests were never in flight together) or
that the time bound leaves no room for is kept in the table with the reason, and out of the fit. A server's shapes
run cheapest first (batch x context), and a shape is skipped when the time left to its server is shorter than the
longest shape measured so far on it.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from ..canon import canonical_json
from ..client import RequestRecord, send
from ..counters import scrape, server_info
from ..errors import CalibrationError
from ..http1 import Pool
from ..modelling.cost import CHUNKED_PREFILL_SIZE
from ..modelling.decoding import Decoding
from ..text import ChatTemplate


RAW = ChatTemplate("calibration: the prompt text as sent", "{{ messages[0]['content'] }}")


def _words(count: int, rng: random.Random) -> str:
    """Text of ``count`` random words: one token each for the simulator, a few each for a real tokenizer."""
    return "".join(f" w{rng.randrange(10**6)}" for _ in range(count))


@dataclass
class Probe:
    """How the measurements reach one running server."""

    url: str
    headers: dict
    alive: Callable[[], bool]  # whether the server process still runs
    timeout: float
    tokens_per_word: float = 1.0  # the server's prompt tokens per word of ``_words`` (measured at start)
    capacity: int | None = None  # tokens its KV cache holds (SGLang's max_total_num_tokens), where it says
    context_length: int = 1 << 30
    time_scale: float = 1.0  # the simulated server's fast clock (sim_time_scale): measured x this = modelled
    chunk: int = (
        CHUNKED_PREFILL_SIZE  # new prompt tokens a prefill step takes at most (SGLang's chunked_prefill_size; -1: all)
    )

    def requests(self, prompts: list[str], new_tokens: int) -> list[RequestRecord]:
        """Send the prompts together, each asking for exactly ``new_tokens`` tokens; their records, in order."""

        async def run() -> list[RequestRecord]:
            pool = Pool(self.url, self.headers)
            records = [RequestRecord(f"calibration-{i}", 0, "calibration") for i in range(len(prompts))]
            sampling = {"max_new_tokens": new_tokens, "ignore_eos": True, "temperature": 0.0}
            try:
                await asyncio.gather(
                    *(
                        send(
                            pool,
                            [{"role": "user", "content": p}],
                            sampling,
                            r,
                            self.timeout,
                            alive=self.alive,
                            incremental=True,
                            template=RAW,
                        )
                        for p, r in zip(prompts, records)
                    )
                )
            finally:
                pool.close()
            return records

        return asyncio.run(run())

    def prompt(self, tokens: int, rng: random.Random) -> str:
        return _words(max(1, round(tokens / self.tokens_per_word)), rng)


def open_probe(url: str, headers: dict, alive, timeout: float, context_length: int) -> Probe:
    """A probe of a ready server: its prompt tokens per word (one request of 256 words), its KV capacity."""
    probe = Probe(url, headers, alive, timeout, context_length=context_length)
    record = probe.requests([_words(256, random.Random("tokens per word"))], 2)[0]
    if record.error or not record.prompt_tokens:
        raise CalibrationError(f"server {url}: a first request failed ({record.error}: {record.error_detail})")
    probe.tokens_per_word = record.prompt_tokens / 256
    info = server_info(url, headers)
    capacity = info.get("max_total_num_tokens") or (info.get("internal_states") or [{}])[0].get("max_total_num_tokens")
    probe.capacity = int(capacity) if capacity else None
    probe.time_scale = float(info.get("sim_time_scale") or 1.0)
    probe.chunk = int(info.get("chunked_prefill_size") or probe.chunk)
    return probe


def steady_steps(records: list[RequestRecord]) -> tuple[float, float, int]:
    """(seconds per step, mean context, steps) of a batch while every request of it was in flight (from the last
    first chunk to the first last chunk): per request, the slope of its chunks' arrival times against their
    number (least squares: a chunk that arrives late moves one point, not the span), weighted by its steps;
    the context is the request's prompt plus the tokens generated before each of those steps."""
    start = max(r.chunk_times[0] for r in records)
    end = min(r.chunk_times[-1] for r in records)
    slopes, weights, contexts = [], [], []
    for r in records:
        inside = [i for i, t in enumerate(r.chunk_times) if start <= t <= end]
        if len(inside) < 3:
            continue
        times = np.array([r.chunk_times[i] for i in inside])
        slopes.append(float(np.polyfit(np.arange(len(times)), times, 1)[0]))
        weights.append(len(times) - 1)
        produced = np.cumsum(r.chunk_tokens)
        contexts += [r.prompt_tokens + int(produced[i]) for i in inside[:-1]]
    if not weights:
        return 0.0, 0.0, 0
    return float(np.average(slopes, weights=weights)), float(np.mean(contexts)), sum(weights)


SHAPE_KINDS = ("step", "prefill", "first-token")  # the table's measured shapes (its other rows: start-ups)


TIME_BOUND = "time bound (calibration.max_seconds_per_tp)"  # why a shape the time bound left no room for is skipped


MIN_STEPS = 4  # a shape needs at least this many steps with its whole batch in flight


LATE_SHARE = 0.01  # a simulated shape whose steps the server ran late by more than this share is measured again


LATE_RETRIES = 2


def measure_batch(probe: Probe, batch: int, context: int, new_tokens: int, seed: str) -> dict:
    """One decode or verify shape: ``batch`` requests of ``context`` tokens together (see the module's text).
    {"seconds", "context", "gaps"} (and "late_share" where the simulated server says its clock fell behind), or
    {"skipped": why}. On the simulated backend a shape during which the server ran its steps late by more than
    LATE_SHARE of their modelled time (its specsweep_sim counters: the host did not run it in time, which no real
    engine's step would show) is measured again, at most LATE_RETRIES times, and the last kept with its share."""
    for _ in range(LATE_RETRIES + 1):
        result = _measure_batch_once(probe, batch, context, new_tokens, seed)
        if result.get("late_share", 0.0) <= LATE_SHARE:
            break
    return result


def _measure_batch_once(probe: Probe, batch: int, context: int, new_tokens: int, seed: str) -> dict:
    if context + new_tokens > probe.context_length:
        why = f"{context} + {new_tokens} tokens exceed model.context_length {probe.context_length}"
        return {"skipped": why, "lasting": True}
    if probe.capacity and batch * (context + new_tokens) > probe.capacity:
        why = f"needs {batch * (context + new_tokens)} tokens of KV cache; the server holds {probe.capacity}"
        return {"skipped": why, "lasting": True}
    rng = random.Random(seed)
    before = scrape(probe.url, probe.headers)
    records = probe.requests([probe.prompt(context, rng) for _ in range(batch)], new_tokens)
    after = scrape(probe.url, probe.headers)

    def grown(counter: str) -> float:
        return after.get(counter, 0.0) - before.get(counter, 0.0)

    failed = [r for r in records if r.error]
    if failed:
        return {"skipped": f"refused: {failed[0].error}: {failed[0].error_detail[:200]}"}
    retracted = grown("sglang:num_retracted_requests_total")
    if retracted > 0:
        return {"skipped": f"the server could not hold the batch: {retracted:g} request(s) retracted"}
    if any(len(r.chunk_times) < 2 for r in records):
        return {"skipped": "a request streamed fewer than two chunks"}
    seconds, mean_context, steps = steady_steps(records)
    if steps < MIN_STEPS * batch:
        return {"skipped": f"the server did not hold the batch: {steps // batch} step(s) with all {batch} in flight"}
    result = {"seconds": seconds * probe.time_scale, "context": round(mean_context), "gaps": steps}
    scheduled = grown("specsweep_sim:scheduled_seconds_total")
    if scheduled > 0:
        result["late_share"] = round(grown("specsweep_sim:late_seconds_total") / scheduled, 5)
    return result


PREFILL_LEAD = 4  # chunks the streaming request streams before the long request is sent


def measure_prefill(probe: Probe, context: int, repeats: int, new_tokens: int, seed: str) -> dict:
    """One prefill shape: while a short request streams (``new_tokens`` tokens), a request of ``context`` tokens
    (one new token) is admitted. The admitting step's chunk of the streaming request is the one that arrives with
    (or, on SGLang, first after) the new request's first chunk; the three gaps around it (one before, one after),
    less two of the stream's usual steps, are the admitting step. Three: the long request's arrival may hold the
    server's loop, so that the chunk before the admission comes late, and the admission's own bookkeeping may
    delay the chunk that ends it, while the chunks one step further on keep their schedule. {"seconds",
    "stream_context", "context", "gaps"} (medians of ``repeats``), or {"skipped": why}."""
    if context + 1 > probe.context_length:
        return {"skipped": f"{context} tokens exceed model.context_length {probe.context_length}", "lasting": True}
    rng = random.Random(seed)
    steps, stream_contexts, contexts = [], [], []
    for _ in range(repeats):
        stream, admitted = _admit_during_stream(probe, probe.prompt(128, rng), probe.prompt(context, rng), new_tokens)
        for r in (stream, admitted):
            if r.error or not r.chunk_times:
                return {"skipped": f"refused: {r.error}: {r.error_detail[:200]}"}
        first, times = admitted.chunk_times[0], stream.chunk_times
        after = [i for i in range(2, len(times) - 1) if times[i] >= first - 0.002]
        if not after:
            return {"skipped": "the streaming request ended before the long request was admitted"}
        i = min(after, key=lambda j: abs(times[j] - first))
        usual = [b - a for j, (a, b) in enumerate(zip(times, times[1:])) if not i - 2 <= j <= i]
        if not usual:
            return {"skipped": "the streaming request has no usual step besides the admission"}
        step = times[i + 1] - times[i - 2] - 2 * statistics.fmean(usual)
        if step <= 0:
            return {"skipped": "the prefill is too short to tell from the stream's own steps"}
        steps.append(step)
        stream_contexts.append(stream.prompt_tokens + sum(stream.chunk_tokens[:i]))
        contexts.append(admitted.prompt_tokens)
    return {
        "seconds": statistics.median(steps) * probe.time_scale,
        "stream_context": round(statistics.fmean(stream_contexts)),
        "context": round(statistics.fmean(contexts)),
        "gaps": len(steps),
        "chunk": probe.chunk,
    }


def measure_first_token(probe: Probe, context: int, repeats: int, seed: str) -> dict:
    """One first-token shape: ``repeats`` lone requests of ``context`` tokens, one new token each, one after the
    other (each prompt new, so that no prefix is cached); {"seconds": the least time from a request's sending to
    its first token (a busy host, whose processes wait for a core, only adds to it), "context", "gaps": repeats},
    or {"skipped": why}."""
    if context + 1 > probe.context_length:
        return {"skipped": f"{context} tokens exceed model.context_length {probe.context_length}", "lasting": True}
    rng = random.Random(seed)
    firsts, contexts = [], []
    for _ in range(repeats):
        record = probe.requests([probe.prompt(context, rng)], 1)[0]
        if record.error or not record.chunk_times:
            return {"skipped": f"refused: {record.error}: {record.error_detail[:200]}"}
        firsts.append(record.chunk_times[0] - record.t0)
        contexts.append(record.prompt_tokens)
    return {
        "seconds": min(firsts) * probe.time_scale,
        "context": round(statistics.fmean(contexts)),
        "gaps": len(firsts),
        "chunk": probe.chunk,
    }


def _admit_during_stream(probe: Probe, stream_prompt: str, long_prompt: str, new_tokens: int):
    """(the streaming request's record, the admitted one's): the second sent once the first has streamed
    PREFILL_LEAD chunks."""

    async def run() -> tuple[RequestRecord, RequestRecord]:
        pool = Pool(probe.url, probe.headers)
        stream, admitted = RequestRecord("stream", 0, "calibration"), RequestRecord("prefill", 0, "calibration")

        def request(prompt: str, tokens: int, record: RequestRecord):
            sampling = {"ignore_eos": True, "temperature": 0.0, "max_new_tokens": tokens}
            messages = [{"role": "user", "content": prompt}]
            return send(
                pool, messages, sampling, record, probe.timeout, alive=probe.alive, incremental=True, template=RAW
            )

        try:
            task = asyncio.ensure_future(request(stream_prompt, new_tokens, stream))
            deadline = time.monotonic() + probe.timeout
            while len(stream.chunk_times) < PREFILL_LEAD and not task.done() and time.monotonic() < deadline:
                await asyncio.sleep(0.0005)
            await request(long_prompt, 1, admitted)
            await task
        finally:
            pool.close()
        return stream, admitted

    return asyncio.run(run())


def method_decoding(method: dict) -> Decoding:
    """How the simulator decodes a method (its algorithm, parameters, scheduler and environment)."""
    return Decoding.of_params(
        method["algorithm"], method["params"], "--disable-overlap-schedule" not in method["flags"], method["env"]
    )


def server_shapes(method: dict, settings: dict) -> list[dict]:
    """The shapes one server measures, cheapest first: prefill and first token (a block drafter's server's prefill
    steps hold its drafter's extend; a draft model's server, whose drafter extend the cost model does not price,
    measures none), then every batch x context."""
    batch_shapes = [
        {"kind": "step", "batch": b, "context": c} for b in settings["batches"] for c in settings["contexts"]
    ]
    batch_shapes.sort(key=lambda s: (s["batch"] * (s["context"] + settings["new_tokens"]), s["batch"]))
    lone = [
        {"kind": k, "batch": 1, "context": c} for k in ("prefill", "first-token") for c in sorted(settings["contexts"])
    ]
    priced = method_decoding(method).spec.drafting != "draft-model"
    return (lone if priced else []) + batch_shapes


def shape_of(row: dict) -> tuple:
    """The shape a table row measured, (kind, batch, nominal context): its ``context`` is what was measured."""
    return (row["kind"], row["batch"], row["shape_context"])


def shape_key(shape: dict) -> tuple:
    """A shape of server_shapes as shape_of names a row of it."""
    return (shape["kind"], shape["batch"], shape["context"])


def measure_shapes(
    probe: Probe,
    method: dict,
    settings: dict,
    deadline: float,
    log=sys.stderr,
    shapes: list[dict] | None = None,
    keep: Callable[[list[dict]], object] | None = None,
) -> list[dict]:
    """Each shape (default: every shape of the server, ``server_shapes``) as a table row, measured or skipped with
    its reason; ``keep`` is given the rows so far after each one (what an interrupted calibration keeps)."""
    decoding = asdict(method_decoding(method))
    rows: list[dict] = []
    longest, warm = 0.0, False
    for shape in server_shapes(method, settings) if shapes is None else shapes:
        if shape["kind"] == "prefill" and not warm:  # the server's first admission during a stream, not timed: on
            warm = True  # SGLang 0.5.16's DFlash server it took 82 ms at 256 tokens where the same shape takes 20
            rng = random.Random(f"warm-up {method['name']}")
            _admit_during_stream(probe, probe.prompt(128, rng), probe.prompt(256, rng), settings["new_tokens"])
        seed = canonical_json([method["name"], shape])
        row = {"server": method["name"], **shape, "width": Decoding(**decoding).verify_width(), "decoding": decoding}
        row["shape_context"] = shape["context"]
        if time.monotonic() + longest > deadline:
            rows.append({**row, "skipped": TIME_BOUND})
            if keep is not None:
                keep(rows)
            continue
        started = time.monotonic()
        if shape["kind"] == "prefill":
            # the streaming request asks for new_tokens rounds' worth: a speculative server commits up to its verify
            # width a round, and the stream must outlast the admission
            stream = settings["new_tokens"] * row["width"]
            row["width"] = shape["context"]
            result = measure_prefill(probe, shape["context"], settings["prefill_repeats"], stream, seed)
        elif shape["kind"] == "first-token":
            row["width"] = shape["context"]
            result = measure_first_token(probe, shape["context"], settings["prefill_repeats"], seed)
        else:
            result = measure_batch(probe, shape["batch"], shape["context"], settings["new_tokens"], seed)
        longest = max(longest, time.monotonic() - started)
        rows.append({**row, **result})
        if keep is not None:
            keep(rows)
        what = f"{1000 * result['seconds']:.2f} ms" if "seconds" in result else f"skipped: {result['skipped']}"
        print(f"calibration {method['name']} {shape['kind']} b{shape['batch']} c{shape['context']}: {what}", file=log)
        if not probe.alive():
            raise CalibrationError(f"server {method['name']} died while it was measured")
    return rows
