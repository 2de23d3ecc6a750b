"""Calibration: measure an engine's steps through its HTTP API and fit the simulator's runtime profile to them.

``snakemake calibrate`` runs ``calibrate`` once per configured TP. It starts one server per method as the workflow
starts them (``bench.start_server``, its GPUs from the pool): first AR, then every configured speculative method,
and measures through the HTTP API only, so that the same code measures a real SGLang server and the simulated one:

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
  prefill shapes cannot see (both ends of their gaps are on one stream);
- start-up: each server's launch to ready; the first server the job starts on the host (cold: kernel compilation
  and caches) and the later ones (warm); every start of a server is kept (``startups``).

A shape the server refuses (an HTTP error, or longer than model.context_length), cannot hold (its KV cache holds
fewer than b x (c + new tokens), a request was retracted, or the b requests were never in flight together) or
that the time bound leaves no room for is kept in the table with the reason, and out of the fit.

Time bound: ``calibration.max_seconds_per_tp`` for all servers of one TP, start-ups included. Each server to
measure gets an equal share of what is left when it starts (a server that used less leaves it to the next);
its shapes run cheapest first (batch x context), and a shape is skipped when the share left is shorter than the
longest shape measured so far on that server.

The fit: the runtime parameters of the simulator's cost model (specsweep.sim.model.CostModel) that
``FITTED`` names start from ``prior()`` (the generic roofline runtime ``sglang`` with generic values for the
parameters it lacks) and are fitted to every measured shape by least squares on log(modelled / measured)
(Levenberg-Marquardt in log coordinates, efficiencies through a logistic; Huber's weights at two scatters, the
scatter from the median residual, so that one shape a hiccup of the host slowed does not pull the fit). The gpu
and model profiles (``sim.gpu``, ``sim.model_profile``) are given, not fitted; the parameters outside FITTED
come from the configured runtime (``sim.runtime``) or the prior: bandwidth_efficiency (one model at one TP cannot
tell a faster weight read from a larger fixed cost per layer), allreduce_latency (at one TP a per-layer constant
like layer_overhead, which absorbs it: a profile is fitted per TP), and the costs no HTTP measurement reaches
(the DDTree heap and rank probe, hybrid models' recurrent state). A fitted parameter is identified when the
measurements pin it to within ``IDENTIFIED_WITHIN`` (one standard error of its log, from the fit's Jacobian
and scatter). The others are not identified: a parameter no measured shape depends on, or one the shapes cannot
tell from another, is held (at the prior, or where the fit drove it, such as a cost put at zero); the rest keep
the fit's value, pinned less well (for instance cpu_step when the overlap scheduler hides the CPU behind every
measured step, or the NGRAM and draft-model parameters when no such method is configured).

Each server's measurements are cached like cells (``{cache_dir}/calibration/``, verified on reuse: key, digest of
the content, fingerprint) under a key of the fingerprint, the method as its server runs it and the calibration
settings, after every shape (an interrupted calibration keeps what its servers finished): a rerun measures a server
again only when one of them changes or shapes are missing, and one whose servers are all cached starts none. The
fit keeps every parameter within its bounds (sim.model.RUNTIME_BOUNDS). The profile and its table are written
under ``results/calibration/`` named by a short digest of the fingerprint (GPU model and count, driver, engine
version and commit, model, TP), the profile with its content digest (cost_model.calibration_text).
"""

from __future__ import annotations

import asyncio
import csv
import io
import math
import random
import signal
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import yaml

from . import __version__, cost_model, ddtree, engines
from .cache import CellCache
from .canon import atomic_write_text, canonical_json, digest, package_digest
from .client import LoadModel, RequestRecord, send
from .counters import scrape, server_info
from .http1 import Pool
from .jobs import ServerJob, server_job
from .methods import expand_methods
from .sim.model import CHUNKED_PREFILL_SIZE, RUNTIME_BOUNDS, CostModel, Decoding, profiles, runtime_problems
from .text import ChatTemplate

CALIBRATION_VERSION = 2  # part of every cached measurement's key: bump it when what is measured changes
FOLDER = "results/calibration"
FINGERPRINTS = f"{FOLDER}/fingerprints.json"
FINGERPRINT_KEYS = ("gpu", "gpu_count", "driver", "engine_version", "engine_commit", "model", "tp")
IDENTIFIED_WITHIN = 0.015  # a parameter is identified when one standard error of its log is below this
NOISE_FLOOR = 0.003  # the smallest residual scatter assumed (log units) when the fit is closer than this
RAW = ChatTemplate("calibration: the prompt text as sent", "{{ messages[0]['content'] }}")

# the parameters the fit may move (every one the HTTP measurements can reach)
FITTED = (
    "compute_efficiency",
    "roofline_exponent",
    "layer_overhead",
    "attention_bandwidth_efficiency",
    "attention_request_bandwidth",
    "attention_compute_efficiency",
    "prefill_fixed",
    "cpu_step",
    "spec_cpu_per_request",
    "drafter_fraction",
    "verify_attention_reads",
    "verify_request_attention_reads",
    "verify_per_request",
    "shared_kv_reads",
    "draft_step_overhead",
    "draft_layer_overhead",
    "draft_attention_reads",
    "draft_per_request",
    "draft_tree_per_node",
    "ngram_step_overhead",
    "ngram_cpu_per_request",
    "ngram_cpu_per_node",
    "request_latency",
    "request_latency_per_token",
    "drafter_prefill_fraction",
    "drafter_prefill_fixed",
)
# where the fit starts: the generic roofline runtime plus generic values for what it lacks
GENERIC = {
    "roofline_exponent": 4.0,
    "attention_bandwidth_efficiency": 0.5,
    "attention_request_bandwidth": 5e11,
    "attention_compute_efficiency": 0.3,
    "prefill_fixed": 5e-3,
    "cpu_step": 1e-3,
    "spec_cpu_per_request": 1e-6,
    "verify_attention_reads": 3.0,
    "verify_request_attention_reads": 3.0,
    "verify_per_request": 5e-5,
    "shared_kv_reads": 0.5,
    "drafter_per_token": True,
    "draft_step_overhead": 2e-4,
    "draft_layer_overhead": 4e-5,
    "draft_attention_reads": 3.0,
    "draft_per_request": 5e-5,
    "draft_tree_per_node": 5e-6,
    "ngram_step_overhead": 1e-3,
    "ngram_cpu_per_request": 2.5e-4,
    "ngram_cpu_per_node": 2e-6,
    "request_latency": 5e-3,
    "request_latency_per_token": 5e-7,
    "drafter_prefill_fraction": 0.2,
    "drafter_prefill_fixed": 2e-3,
}


class CalibrationError(RuntimeError):
    """A calibration could not be made; the message names the TP, the server or the file, and what to do."""


def prior() -> dict:
    """The runtime the fit starts from: the shipped generic ``sglang`` runtime with GENERIC's values added."""
    return {**profiles()["runtimes"]["sglang"], **GENERIC}


# ------------------------------------------------------------------ what is measured, and under which name


def fingerprint(environment: dict, config: dict, tp: int) -> dict:
    """What a calibration measured: {gpu, gpu_count, driver, engine_version, engine_commit, model, tp}, from the
    environment record (results/env/<backend>.json) and the configuration. On SGLang the engine commit is the
    build's source commit, else the digest of the wheel it was installed from, else the configured build label.
    On the simulated backend the GPU is the simulated one (``sim.gpu``, "(simulated)"), tp of them, and the
    engine commit a digest of the profiles it emulates and of its cost model's code."""
    model = config["model"]["name"]
    if environment["backend"] == "sim":
        sim = config["sim"]
        return {
            "gpu": f"{sim['gpu']} (simulated)",
            "gpu_count": tp,
            "driver": None,
            "engine_version": f"specsweep-sim {environment['server'].get('version', __version__)}",
            "engine_commit": cost_model.sim_engine_commit(config),
            "model": model,
            "tp": tp,
        }
    return {**cost_model.host_fingerprint(environment), "model": model, "tp": tp}


def fingerprint_digest(value: dict) -> str:
    """The short digest that names a calibration's files: 12 hex digits of the fingerprint's canonical JSON."""
    return digest({k: value[k] for k in FINGERPRINT_KEYS})[:12]


def profile_path(name: str) -> str:
    return f"{FOLDER}/{name}.yaml"


def table_path(name: str) -> str:
    return f"{FOLDER}/{name}.csv"


def fingerprints(environments: dict, config: dict) -> list[dict]:
    """[{tp, engine, fingerprint, digest}] for every configured TP of every engine (what the calibrate target's
    checkpoint writes): ``environments`` maps each engine's name (None: the one build of a configuration without
    ``engines``) to its environment record; each engine is fingerprinted in its own view of the configuration
    (engines.view: its build, its sim keys). Engines whose fingerprints agree share one calibration."""
    out, named = [], set()
    for engine, environment in environments.items():
        view = engines.view(config, engine)
        for tp in config["tp"]:
            value = fingerprint(environment, view, tp)
            name = fingerprint_digest(value)
            if name not in named:
                named.add(name)
                out.append({"tp": tp, "engine": engine, "fingerprint": value, "digest": name})
    return out


def calibration_methods(config: dict) -> list[dict]:
    """The methods whose servers a calibration starts, AR first (the configured AR method, else a plain one), then
    every configured speculative method (Method.as_dict)."""
    methods = [m.as_dict() for m in expand_methods(config)]
    ar = next((m for m in methods if m["algorithm"] == "ar"), None)
    if ar is None:
        ar = {"name": "ar", "algorithm": "ar", "params": {}, "flags": [], "env": {}, "attention_backend": None}
        ar["min_free_slots_delay"] = None
    return [ar] + [m for m in methods if m["algorithm"] != "ar"]


def calibration_job(config: dict, environment: dict, tp: int) -> dict:
    """Everything one TP's calibration depends on (and nothing else): the rule's params, as canonical JSON."""
    value = fingerprint(environment, config, tp)
    # on the simulated backend, sim.calibration auto would otherwise run the servers on the profile this job wrote
    job = server_job(cost_model.uncalibrated(config), tp, expand_methods(config)[0].name).as_dict()
    job.update(workloads=[], warmup=0, adaptive=None, repetition=None)
    job["load"] = {"protocol": "native"}
    # --max-running-requests twice the largest batch: SGLang 0.5.16 at exactly 64 admitted 63 of a burst of 64 and
    # queued the last until the first finished, so that batch was never in flight together
    job["concurrency"] = [2 * max(config["calibration"]["batches"])]
    return {
        "fingerprint": value,
        "digest": fingerprint_digest(value),
        "server_job": job,
        "methods": calibration_methods(config),
        "settings": dict(config["calibration"]),
        "ddtree_builds": dict(config.get("ddtree_builds") or {}),  # the configuration's own, which its methods name
        "sim_profiles": cost_model.emulated_profiles(config),
        "profile_names": {"gpu": config["sim"]["gpu"], "model": config["sim"]["model_profile"]},
    }


def plan_line(config: dict) -> str:
    """The line plan.md gives calibration: its time bound and whether the default target runs it."""
    settings = config["calibration"]
    where = (
        "part of the default target (calibration.in_default_target)"
        if settings["in_default_target"]
        else "not part of the default target"
    )
    return (
        f"- calibration (`snakemake calibrate`, {where}): at most {settings['max_seconds_per_tp']:g} s per TP "
        f"(calibration.max_seconds_per_tp) for {len(calibration_methods(config))} server(s) each, start-ups included"
    )


# ------------------------------------------------------------------ measuring through the HTTP API


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


# ------------------------------------------------------------------ the modelled steps and the fit


def modelled_seconds(cost: CostModel, row: dict) -> float:
    """The simulator's seconds for a measured row, as its engine charges a step (sim.server.Engine.next_step):
    a prefill row: the prefill of c tokens in steps of its server's chunked-prefill size (8192 where the row does
    not say; each step prefill(n, n x done + n^2 / 2) with the server's drafter's extend) + an AR step of the
    admitted request + the streaming request's step of the server's decoding;
    a first-token row: the request's request_latency + the same prefill steps and AR step of the request alone;
    a step row: one decode_step of its decoding over ``batch`` requests at its context."""
    decoding = Decoding(**row["decoding"])
    if row["kind"] in ("prefill", "first-token"):
        c, chunk = row["context"], row.get("chunk") or CHUNKED_PREFILL_SIZE
        size = chunk if chunk > 0 else c
        parts = [min(size, c - done) for done in range(0, c, size)]
        alone = sum(cost.prefill(n, n * (i * size) + n * n / 2, decoding) for i, n in enumerate(parts))
        alone += cost.decode_step(Decoding(), [c])
        if row["kind"] == "first-token":
            return cost.request_latency(c) + alone
        return alone + cost.decode_step(decoding, [row["stream_context"]])
    if row["kind"] == "one-batch-prefill":  # bench_one_batch's prefill of the whole batch, no decode
        tokens = row["batch"] * row["width"]
        return cost.prefill(tokens, row["batch"] * row["width"] ** 2 / 2)
    return cost.decode_step(decoding, [row["context"]] * row["batch"], row.get("shared", 0.0))


def _from_free(name: str, x: float) -> float:
    """A parameter from its unbounded coordinate: an efficiency (a share of the GPU's datasheet bandwidth or
    compute) stays in (0, 1) through a logistic, every other parameter stays positive through exp."""
    return 1 / (1 + math.exp(-x)) if name.endswith("_efficiency") else math.exp(x)


def _to_free(name: str, value: float) -> float:
    value = min(max(value, 1e-9), 1 - 1e-9) if name.endswith("_efficiency") else max(value, 1e-12)
    return math.log(value / (1 - value)) if name.endswith("_efficiency") else math.log(value)


def _jacobian(residuals, x: np.ndarray, r: np.ndarray, h: float = 1e-6) -> np.ndarray:
    columns = []
    for j in range(len(x)):
        step = np.zeros_like(x)
        step[j] = h
        columns.append((residuals(x + step) - r) / h)
    return np.array(columns).T


def _free_limits(names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(lower, upper) of each parameter's unbounded coordinate: its RUNTIME_BOUNDS (the fit never leaves a
    parameter's physically sensible range), within -40..40."""
    lower = [_to_free(n, RUNTIME_BOUNDS[n].low) if RUNTIME_BOUNDS[n].low > 0 else -40.0 for n in names]
    upper = [40.0 if n.endswith("_efficiency") else _to_free(n, RUNTIME_BOUNDS[n].high) for n in names]
    return np.clip(lower, -40, 40), np.clip(upper, -40, 40)


def least_squares(residuals, x0, iterations: int = 200, limits: tuple | None = None) -> np.ndarray:
    """Minimise sum(residuals(x)^2) from x0 (Levenberg-Marquardt with Marquardt's scaling; a coordinate the
    residuals do not depend on stays where it starts), each coordinate within ``limits`` (lower, upper; default
    -40..40). Stops when a step gains less than 1e-12 of the cost; with no coordinate, returns at once."""
    lower, upper = limits if limits is not None else (-40.0, 40.0)
    x = np.clip(np.array(x0, float), lower, upper)
    if x.size == 0:  # nothing to move (no measured shape depends on any parameter left free)
        return x
    r = residuals(x)
    cost, damping = float(r @ r), 1e-3
    for _ in range(iterations):
        jac = _jacobian(residuals, x, r)
        gradient, normal = jac.T @ r, jac.T @ jac
        scale = np.diag(np.diag(normal)) + 1e-12 * np.eye(len(x))
        while True:
            step = np.linalg.solve(normal + damping * scale, -gradient)
            trial = np.clip(x + step, lower, upper)
            r_trial = residuals(trial)
            if float(r_trial @ r_trial) < cost:
                gain = cost - float(r_trial @ r_trial)
                x, r, cost, damping = trial, r_trial, float(r_trial @ r_trial), max(damping / 3, 1e-12)
                break
            damping *= 4
            if damping > 1e12:
                return x
        if gain <= 1e-12 * max(cost, 1e-30) or cost < 1e-20:
            break
    return x


def _standard_errors(jac: np.ndarray, scatter: float) -> np.ndarray:
    """One standard error of each coordinate, scatter x sqrt(diag((J'J)^-1)) from J's singular values; infinite
    for a coordinate with a share in a direction the residuals do not see (a singular value below 1e-9 of the
    largest, or beyond the number of rows)."""
    _, values, vt = np.linalg.svd(jac, full_matrices=True)
    values = np.concatenate([values, np.zeros(len(vt) - len(values))])
    blind = values <= (values.max() if values.size else 0) * 1e-9
    inverse = np.where(blind, np.inf, 1 / np.where(blind, 1, values) ** 2)
    shares = vt**2
    contributions = np.where(shares > 1e-20, shares, 0.0) * np.where(shares > 1e-20, inverse[:, None], 0.0)
    return scatter * np.sqrt(contributions.sum(axis=0))


def _scatter(raw: np.ndarray, parameters: int) -> float:
    """The residuals' typical size (log): 1.4826 x their median absolute value (the standard deviation of normal
    errors, unmoved by a few shapes far off), scaled up for the degrees of freedom the fit took; at least
    NOISE_FLOOR."""
    dof = max(len(raw) - parameters, 1)
    return max(1.4826 * float(np.median(np.abs(raw))) * math.sqrt(len(raw) / dof), NOISE_FLOOR)


def _huber_weights(raw: np.ndarray, parameters: int, k: float = 2.0) -> np.ndarray:
    """Huber's weights: 1 for a residual within k scatters, k x scatter / |residual| beyond (a shape that a
    hiccup of the host made slow pulls the fit by k scatters, not by its whole error)."""
    limit = k * _scatter(raw, parameters)
    return np.minimum(1.0, limit / np.maximum(np.abs(raw), 1e-300))


@dataclass
class Fit:
    """A fitted runtime; ``identified``: the parameters the measurements pin within IDENTIFIED_WITHIN;
    ``not_identified``: the others, of which ``held`` (no measurement tells them apart from the rest) keep the
    prior's value and the rest keep the fit's, pinned less well; ``scatter``: the residuals' RMS (log)."""

    runtime: dict
    identified: list[str]
    not_identified: list[str]
    scatter: float
    held: list[str]


def fit_runtime(
    rows: list[dict], gpu: dict, model: dict, draft_model: dict | None, tp: int, fixed: dict | None = None
) -> Fit:
    """The runtime profile fitted to measured rows (each with ``seconds``): see the module's text. ``fixed``: the
    values of the parameters outside FITTED (default: the prior's)."""
    measured = [r for r in rows if r.get("seconds")]
    if not measured:
        raise CalibrationError("no shape was measured: nothing to fit (see the table's reasons)")
    start = {**prior(), **(fixed or {})}
    start.update({k: prior()[k] for k in FITTED})
    scatter = NOISE_FLOOR
    seconds = np.array([r["seconds"] for r in measured])

    def runtime_of(names, x) -> dict:
        return {**start, **{n: _from_free(n, v) for n, v in zip(names, x)}}

    weights = np.ones(len(measured))  # Huber's: a shape far off the others' fit counts less (see _reweigh)

    def residuals_for(names):
        def residuals(x):
            cost = CostModel(gpu, model, runtime_of(names, x), tp, draft_model)
            return np.sqrt(weights) * np.log(np.array([modelled_seconds(cost, r) for r in measured]) / seconds)

        return residuals

    def fit(names, x0) -> np.ndarray:
        """Least squares, reweighed until the weights settle (at most 4 times)."""
        x = np.asarray(x0, float)
        for _ in range(4):
            x = least_squares(residuals_for(names), x, limits=_free_limits(names))
            raw = residuals_for(names)(x) / np.sqrt(weights)
            new = _huber_weights(raw, len(names))
            if np.allclose(new, weights, atol=1e-3):
                break
            weights[:] = new
        return x

    free = list(FITTED)
    x = fit(free, [_to_free(n, start[n]) for n in free])
    # a parameter no measured shape depends on at the fit is held where the fit left it: at the prior when nothing
    # moved it, else where it drove it (a cost at nothing, whose log the shapes no longer see)
    residuals = residuals_for(free)
    sensitive = np.max(np.abs(_jacobian(residuals, x, residuals(x))), axis=0) > 1e-4
    start.update({n: _from_free(n, v) for n, v, keep in zip(FITTED, x, sensitive) if not keep})
    free, x = [n for n, keep in zip(FITTED, sensitive) if keep], x[sensitive]
    errors = np.array([])
    x = fit(free, x)
    while free:
        residuals = residuals_for(free)
        r = residuals(x)
        scatter = _scatter(r / np.sqrt(weights), len(free))
        jac = _jacobian(residuals, x, r)
        errors = _standard_errors(jac, scatter)
        if not np.isinf(errors).any():
            break
        # of the parameters the measurements cannot tell apart, the one they see least is held: at the prior when
        # the others then fit as well (its effect is theirs too), else where the fit put it (a cost it drove to
        # nothing, say, which the log scale no longer sees)
        blind = np.flatnonzero(np.isinf(errors))
        worst = int(blind[np.argmin(np.linalg.norm(jac[:, blind], axis=0))])
        keep = [i for i in range(len(free)) if i != worst]
        name, value = free[worst], _from_free(free[worst], x[worst])
        free = [free[i] for i in keep]
        x_prior = least_squares(residuals_for(free), x[keep], limits=_free_limits(free))
        r_prior = residuals_for(free)(x_prior)
        if float(r_prior @ r_prior) <= 1.1 * float(r @ r) + len(r) * NOISE_FLOOR**2:
            x = x_prior
        else:
            start[name] = value
            x = least_squares(residuals_for(free), x[keep], limits=_free_limits(free))
    identified = [n for n, e in zip(free, errors) if e <= IDENTIFIED_WITHIN]
    runtime = runtime_of(free, x)
    rounded = {k: float(f"{v:.4g}") if isinstance(v, float) else v for k, v in runtime.items()}
    return Fit(
        rounded, identified, [n for n in FITTED if n not in identified], scatter, [n for n in FITTED if n not in free]
    )


# ------------------------------------------------------------------ one TP: cache, servers, fit, files


def entry_key(job: dict, method: dict) -> str:
    """The cache key of one server's measurements: the fingerprint, the method as its server runs it, what the
    servers are started with, how a shape is measured (calibration.new_tokens, prefill_repeats) and
    CALIBRATION_VERSION. Not which shapes (batches, contexts) nor the time bound: an entry holds every shape measured
    under its key, and a calibration with more shapes measures only those it lacks (see missing_shapes)."""
    return server_key(job, method, {k: job["settings"][k] for k in ("new_tokens", "prefill_repeats")})


def server_key(job: dict, method: dict, settings: dict, version: int = CALIBRATION_VERSION) -> str:
    """The digest entry_key takes of one server's measurements with these settings and this CALIBRATION_VERSION
    (another version's key: benchmarks/gpu/rekey_calibration.py). Names are not part of it: neither the method's
    nor its engine's (the fingerprint holds the engine's build by its content), as a cell's key holds neither."""
    server_job = job["server_job"]
    return digest(
        {
            "fingerprint": job["fingerprint"],
            "method": {k: v for k, v in method.items() if k not in ("name", "engine")},
            "model": server_job["model"],
            "server": {k: server_job["server"].get(k) for k in ("flags", "env", "min_free_slots_delay")},
            "sim": server_job["sim"],
            "settings": settings,
            "version": version,
        }
    )


def entry_problem(entry, key: str, fingerprint_value: dict) -> str | None:
    """Why a cached entry cannot stand for the measurements of ``key``, or None."""
    if not isinstance(entry, dict) or not entry:
        return "it is empty or not a JSON object"
    if entry.get("digest") != digest({k: v for k, v in entry.items() if k != "digest"}):
        return "its content does not match its digest"
    if entry.get("key") != key:
        return f"it holds the measurements of key {str(entry.get('key'))[:12]}, not {key[:12]}"
    if entry.get("fingerprint") != fingerprint_value:
        return "its fingerprint is not this calibration's"
    if not isinstance(entry.get("rows"), list) or not isinstance(entry.get("startup_s"), (int, float)):
        return "it has no rows or no start-up time"
    return None


def _cache(job: dict) -> CellCache:
    return CellCache(Path(job["server_job"]["cache_dir"]) / "calibration")


def cached_entries(job: dict, log=sys.stderr) -> dict[str, dict]:
    """{method name: its verified cache entry} for the methods of ``job`` that have one; an entry that fails a
    check is named with the reason, and its server measured again."""
    cache, out = _cache(job), {}
    for method in job["methods"]:
        key = entry_key(job, method)
        entry, why = cache.read(key)
        if entry is not None:
            why = entry_problem(entry, key, job["fingerprint"])
        if why is None and entry is not None:
            out[method["name"]] = entry
        elif why is not None:
            print(f"calibration: cache entry {cache.path(key)} not used: {why}; measuring again", file=log)
    return out


def missing_shapes(method: dict, settings: dict, entry: dict | None) -> list[dict]:
    """The shapes of a server (server_shapes) its cache entry has no measurement for: a skipped shape counts as
    missing (the time bound, a batch never in flight together, a refusal may not recur) unless it was skipped for
    what the server and model are (``lasting``: its KV cache, the context length)."""
    known = {shape_of(r) for r in (entry or {}).get("rows", []) if r.get("seconds") or r.get("lasting")}
    return [s for s in server_shapes(method, settings) if shape_key(s) not in known]


def measure_servers(
    job: dict, environment: dict, missing: list[dict], log_dir: Path, log=sys.stderr, cached: dict | None = None
) -> list[dict]:
    """Start each missing method's server in turn (the job's GPUs held from the pool throughout), measure the
    shapes its cache entry (``cached``, by method name) lacks within the time bound, always stop it; each server's
    entry (its earlier rows of other shapes kept, this start-up's time) is cached after every shape, so that a
    calibration interrupted (Ctrl-C, SIGTERM, a server that dies) keeps the shapes its servers finished and a rerun
    measures only the others."""
    cached = cached or {}
    from .gpus import GpuPool, lock_folder, visible_devices

    base = ServerJob.from_dict(job["server_job"])
    settings, cache = job["settings"], _cache(job)
    entries = []
    budget_end = time.monotonic() + settings["max_seconds_per_tp"]
    pooled = base.backend == "sglang" or base.gpu_pool["devices"]
    devices = visible_devices(base.gpu_pool["devices"]) if pooled else []
    with ExitStack() as stack:
        gpus = None
        if devices:
            pool = GpuPool(lock_folder(base.gpu_pool["lock_dir"]), devices)
            need = len(devices) if base.gpu_pool["exclusive"] else base.tp
            print(f"calibration tp{base.tp}: waiting for {need} GPU(s) from the pool", file=log, flush=True)
            gpus = stack.enter_context(pool.acquire(need, holder=f"calibration tp{base.tp}"))
        previous = signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops the servers too
        stack.callback(signal.signal, signal.SIGTERM, previous)
        for index, method in enumerate(missing):
            share_end = time.monotonic() + (budget_end - time.monotonic()) / (len(missing) - index)
            print(f"calibration tp{base.tp}: starting the {method['name']} server", file=log, flush=True)
            before = cached.get(method["name"])

            def keep(startup_s: float, rows: list[dict], method=method, before=before, first=index == 0) -> dict:
                """Cache the server's entry: its earlier rows of the shapes not measured again, then ``rows``."""
                now = datetime.now(timezone.utc).isoformat()
                measured = {shape_of(r) for r in rows}
                entry = {
                    "key": entry_key(job, method),
                    "fingerprint": job["fingerprint"],
                    "method": method,
                    "startup_s": startup_s,
                    "first_on_host": first,
                    "startups": startups(before) + [{"seconds": startup_s, "first_on_host": first, "at": now}],
                    "measured_at": now,
                    "rows": [r for r in (before or {}).get("rows", []) if shape_of(r) not in measured] + rows,
                }
                entry["digest"] = digest(entry)
                cache.put(entry["key"], entry)
                return entry

            shapes = missing_shapes(method, settings, before)
            startup_s, rows = _measure_server(
                replace(base, method=method), settings, environment, gpus, log_dir, share_end, log, shapes, keep
            )
            entries.append(keep(startup_s, rows))
    return entries


def _measure_server(
    job: ServerJob,
    settings: dict,
    environment: dict,
    gpus,
    log_dir: Path,
    share_end: float,
    log,
    shapes: list[dict],
    keep: Callable[[float, list[dict]], object],
) -> tuple[float, list[dict]]:
    """(start-up seconds, the table rows) of one method's server, started as the workflow starts it and always
    stopped; ``keep`` is given the start-up and the rows so far after each shape."""
    from .bench import start_server
    from .gpus import wait_until_released
    from .launcher import ApiKeyFile, Server

    log_path = log_dir / f"server-calibration-tp{job.tp}-{job.method['name']}.log"
    server: Server | None = None
    with ApiKeyFile(job.server.get("api_key_env")) as key:
        try:
            server, _, _ = start_server(job, {}, environment, log_path, gpus, key.args, key.headers)
            key.remove()  # the server read it when it started
            timeout, context_length = job.server["request_timeout"], job.model["context_length"]
            probe = open_probe(server.url, key.headers, server.alive, timeout, context_length)
            startup_s = float(server.startup_seconds or 0.0)
            rows = measure_shapes(
                probe, job.method, settings, share_end, log, shapes, lambda so_far: keep(startup_s, so_far)
            )
            return startup_s, rows
        finally:
            if server is not None:
                server.stop()
                if gpus and job.backend == "sglang":
                    wait_until_released(gpus)


def startups(entry: dict | None) -> list[dict]:
    """Every start of an entry's server so far, [{"seconds", "first_on_host", "at"}]: a server started again for
    shapes its entry lacks adds its start to the earlier ones (an entry written before they were kept has one)."""
    if not entry:
        return []
    if "startups" in entry:
        return list(entry["startups"])
    return [{"seconds": entry["startup_s"], "first_on_host": entry["first_on_host"], "at": entry["measured_at"]}]


def startup(entries: list[dict]) -> dict:
    """{cold_s, warm_s} over every start of the entries' servers (``startups``): cold, the longest start of a server
    a calibration run started first on the host (a first start on a host whose kernel caches an earlier run filled
    is as fast as a warm one: the longest is the one that filled them); warm, the median of the others'. A
    calibration of one server has no warm start: its warm is its cold (a later server starts no slower than the
    first), and one whose every start was warm has its longest as cold."""
    starts = [s for e in entries for s in startups(e)]
    cold = [s["seconds"] for s in starts if s["first_on_host"]]
    warm = [s["seconds"] for s in starts if not s["first_on_host"]]
    cold_s = max(cold) if cold else max(warm, default=None)
    warm_s = statistics.median(warm) if warm else cold_s
    return {
        "cold_s": round(cold_s, 3) if cold_s is not None else None,
        "warm_s": round(warm_s, 3) if warm_s is not None else None,
    }


TABLE_COLUMNS = (
    "server",
    "kind",
    "batch",
    "width",
    "context",
    "measured_s",
    "fitted_s",
    "deviation",
    "gaps",
    "skipped",
    "decoding",
)


def table_rows(entries: list[dict], cost: CostModel, cold_warm: dict) -> list[dict]:
    """The measured table: every shape (measured or skipped) and every server's start-up, with the fitted
    seconds and deviation = fitted / measured - 1."""
    out = []
    for entry in entries:
        for start in startups(entry):
            fitted = cold_warm["cold_s" if start["first_on_host"] else "warm_s"]
            out.append(
                {
                    "server": entry["method"]["name"],
                    "kind": "startup-cold" if start["first_on_host"] else "startup-warm",
                    "measured_s": start["seconds"],
                    "fitted_s": fitted,
                    "deviation": fitted / start["seconds"] - 1 if fitted and start["seconds"] else None,
                }
            )
        for row in entry["rows"]:
            modelled = modelled_seconds(cost, row) if row.get("seconds") else None
            out.append(
                {
                    **{k: row.get(k) for k in ("server", "kind", "batch", "width", "context", "gaps", "skipped")},
                    "measured_s": row.get("seconds"),
                    "fitted_s": modelled,
                    "deviation": modelled / row["seconds"] - 1 if modelled else None,
                    "decoding": canonical_json(row["decoding"]),
                }
            )
    return out


def _csv(rows: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=TABLE_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if row.get(k) is None else row[k]) for k in TABLE_COLUMNS})
    return out.getvalue()


def calibrate(
    job: dict,
    environment: dict,
    profile_out: str,
    table_out: str,
    log_dir: Path,
    log=sys.stderr,
    measure: bool = True,
) -> dict:
    """One TP's calibration: its servers' verified cache entries, the shapes they lack measured (see
    measure_servers; with ``measure`` False none is, and the fit takes what the cache holds: a refit after a change
    of the cost model, away from the GPUs), the runtime fitted to every measured shape, the profile and its table
    written (atomically). Returns {"measured": [servers started], "cached": [servers wholly from the cache],
    "profile": the profile}."""
    ddtree.define(job.get("ddtree_builds"))  # the builds its DDTree methods name, in this (a job's) process
    if job["fingerprint"] != fingerprint(environment, _config_view(job), job["fingerprint"]["tp"]):
        raise CalibrationError(
            f"calibration tp{job['fingerprint']['tp']}: the environment record does not give this job's "
            "fingerprint (it changed since the plan of this run): run snakemake calibrate again"
        )
    emulated, tp = job["sim_profiles"], job["fingerprint"]["tp"]
    fixed = {k: v for k, v in emulated["runtime"].items() if k not in FITTED and not k.startswith("eager_")}
    problems = runtime_problems({**prior(), **fixed})
    if problems:  # before any server starts: what the fit takes as given from the configured runtime
        raise CalibrationError(
            f"calibration tp{tp}: the runtime sim.runtime names cannot price a step ({'; '.join(problems)}); mend "
            "that profile (sim.profiles.runtimes)"
        )
    cached = cached_entries(job, log)
    settings = job["settings"]
    missing = [m for m in job["methods"] if measure and missing_shapes(m, settings, cached.get(m["name"]))]
    if not measure and len(cached) < len(job["methods"]):
        raise CalibrationError(f"calibration tp{job['fingerprint']['tp']}: a refit needs every server's cache entry")
    measured = measure_servers(job, environment, missing, log_dir, log, cached) if missing else []
    by_name = {**cached, **{e["method"]["name"]: e for e in measured}}
    started = [e["method"]["name"] for e in measured]
    entries = [by_name[m["name"]] for m in job["methods"]]
    for entry in entries:  # the configured shapes only (an entry may hold more, from an earlier calibration)
        wanted = {shape_key(s) for s in server_shapes(entry["method"], settings)}
        entry["rows"] = [r for r in entry["rows"] if shape_of(r) in wanted]
    rows = [row for e in entries for row in e["rows"]]
    fit = fit_runtime(rows, emulated["gpu"], emulated["model"], emulated["draft_model"], tp, fixed)
    cost = CostModel(emulated["gpu"], emulated["model"], fit.runtime, tp, emulated["draft_model"])
    cold_warm = startup(entries)
    table = table_rows(entries, cost, cold_warm)
    deviations = [abs(r["deviation"]) for r in table if r["deviation"] is not None and r["kind"] in SHAPE_KINDS]
    latest = max(e["measured_at"] for e in entries)
    profile = {
        "fingerprint": job["fingerprint"],
        "digest": job["digest"],
        "measured_on": {"gpu": job["fingerprint"]["gpu"], "date": latest[:10]},
        "largest_deviation": round(max(deviations), 4),
        "not_identified": fit.not_identified,
        "held": fit.held,
        "identified": fit.identified,
        "startup": cold_warm,
        "runtime": {**fit.runtime, "startup_seconds": cold_warm["cold_s"]},
        "simulated": environment["backend"] == "sim",
        "time_bound_s": job["settings"]["max_seconds_per_tp"],
        "shapes": {"measured": len(deviations), "skipped": sum(1 for r in table if r.get("skipped"))},
        "table": Path(table_out).name,
        "profiles": job["profile_names"],  # the GPU and model profiles the runtime was fitted on
    }
    problems = runtime_problems(profile["runtime"])
    if problems:  # never written: a file the cost model cannot read back
        raise CalibrationError(f"calibration tp{tp}: the fitted runtime cannot price a step ({'; '.join(problems)})")
    atomic_write_text(table_out, _csv(table))
    atomic_write_text(profile_out, cost_model.calibration_text(profile))
    print(
        f"calibration tp{tp}: {len(started)} server(s) started, {len(set(cached) - set(started))} wholly cached; "
        f"{len(deviations)} shapes, largest deviation {max(deviations):.1%}; not identified: "
        f"{', '.join(fit.not_identified) or 'none'}",
        file=log,
        flush=True,
    )
    return {"measured": started, "cached": sorted(set(cached) - set(started)), "profile": profile}


def _config_view(job: dict) -> dict:
    """What ``fingerprint`` reads of the configuration, from a calibration job."""
    return {"model": job["server_job"]["model"], "sim": job["server_job"]["sim"]}


def read_profile(path: str | Path) -> dict:
    """A calibration profile written by ``calibrate`` (YAML), verified (cost_model.read_calibration: its digest, its
    runtime's bounds)."""
    try:
        cost_model.read_calibration(path)
        return yaml.safe_load(Path(path).read_text())
    except (cost_model.CalibrationError, OSError, yaml.YAMLError) as exc:
        raise CalibrationError(f"cannot read the calibration profile: {exc}") from exc
