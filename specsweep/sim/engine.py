"""The simulated server's engine: continuous batching as SGLang schedules it, one modelled step at a time.

Each step's duration is the cost model's (specsweep.modelling.cost) and what each verify round commits the
acceptance model's (specsweep.modelling.acceptance). It waits out each modelled step instead of computing, on an
absolute schedule (specsweep.sim.clock: a step ends at its modelled deadline, its own Python work done inside it);
steps whose work ran past their deadline are counted (the clock's report, the API's ``specsweep_sim:*`` counters).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from ..ddtree import RankProbe
from ..ddtree_profile import SimulatedProfiler, simulated_split
from ..modelling.acceptance import (
    Drafter,
    Skill,
    drafter_acceptance,
    model_drafter_family,
    random_weights_reply,
    reply_tokens,
    request_drafter,
    request_skill,
)
from ..modelling.cost import CHUNKED_PREFILL_SIZE, CostModel, ngram_trie_tokens
from ..modelling.decoding import Decoding
from ..modelling.profiles import profiles
from ..text import split_tokens
from ..workloads import count_tokens
from .args import decoding_from_args
from .clock import StepClock

PAGE = 64  # prefix-cache granularity in tokens


@dataclass(frozen=True)
class Step:
    """What one engine step emitted for a request: its tokens, the request's totals right after it, and which of the
    engine's steps it was (counted from launch)."""

    tokens: int
    produced: int
    verify_ct: int
    done: bool
    index: int
    correct_drafts: tuple = ()  # the request's rounds by drafts accepted (index: accepted drafts, value: rounds)


@dataclass
class Request:
    prompt: str
    prompt_tokens: list[str]  # the simulator's own units: its prefix-cache pages and n-gram lookup run on them
    reply: list[str]
    natural_stop: bool
    skill: Skill  # the drafter's on its content (specsweep.modelling.acceptance.request_skill)
    rng: random.Random
    queue: asyncio.Queue
    drafter: Drafter | None = None  # its rounds' drafts (specsweep.modelling.acceptance.request_drafter); None for AR
    page_keys: list[str] = field(default_factory=list)  # its prompt's prefix-cache pages
    cached_tokens: int = 0
    produced: int = 0
    verify_ct: int = 0
    correct_drafts: list[int] = field(default_factory=list)  # SGLang's spec_correct_drafts_histogram
    prefilled: bool = False
    prefill_done: int = 0  # prompt tokens prefilled so far (chunked prefill: a long prompt takes several steps)
    length: int = 0  # prompt tokens as the model counts them (sim.tokenizer): what its steps are priced by
    corrupted: bool = False
    started: float = field(default_factory=time.monotonic)
    queued: float | None = None  # when it reached the engine's queue (its request_latency after it started)
    admitted: float | None = None  # when the engine took it from the queue
    aborted: bool = False  # its client went away before its end (Engine.abort)


class Engine:
    """Continuous batching: admit up to max-running requests, one modelled step at a time."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.decoding = decoding_from_args(args)
        overrides = json.loads(args.sim_profiles) if args.sim_profiles else None
        self.cost = CostModel.named(
            args.sim_gpu,
            args.sim_model_profile,
            args.sim_runtime,
            args.tp_size,
            overrides,
            args.sim_draft_model_profile,
        )
        profile_set = profiles(overrides)
        self.drafter_family = model_drafter_family(profile_set, args.sim_model_profile)  # whose drafters it runs
        self.acceptance = drafter_acceptance(
            self.decoding,
            profile_set,
            json.loads(args.sim_acceptance) if args.sim_acceptance else None,
            self.drafter_family,
        )
        # dummy weights (--load-format dummy; the drafter's --speculative-draft-load-format, which follows the target's
        # where not given, as in SGLang): the target's greedy output loops, a drafter model never proposes its choice
        self.random_target = getattr(args, "load_format", None) == "dummy"
        drafter_format = getattr(args, "speculative_draft_load_format", None) or getattr(args, "load_format", None)
        self.random_drafter = drafter_format == "dummy"
        self.rank_probe = RankProbe(self.decoding.block_size - 1) if self.decoding.probes_ranks() else None
        # a DDTree build's stage profiler (--speculative-ddtree-profile): the cost model's split of each round
        self.stage_profiler = (
            SimulatedProfiler(args.speculative_ddtree_profile_output, args.speculative_ddtree_profile_interval)
            if self.decoding.spec.builds_trees
            and args.speculative_ddtree_profile
            and args.speculative_ddtree_profile_output
            else None
        )
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.prefilling: Request | None = None  # the request whose prompt a prefill step left unfinished
        self.batch_full = False  # no request is admitted until a running one finishes (see next_step)
        self.real_time = False  # set by run: requests wait their request_latency before the queue
        self.holding: deque[tuple[float, Request]] = deque()  # (when it reaches the queue, request), in arrival order
        self.chunk = getattr(args, "chunked_prefill_size", None) or CHUNKED_PREFILL_SIZE
        self.wakeup = asyncio.Event()
        self.prefix_cache: OrderedDict[str, None] = OrderedDict()
        self._shared: tuple[tuple, int] = ((), 0)  # (the batch's request ids, its shared tokens)
        self.counters = {
            "prompt_tokens": 0,
            "generation_tokens": 0,
            "requests": 0,
            "verify_calls": 0,
            "accepted_tokens": 0,
            "cached_tokens": 0,
            "steps": 0,
            "aborted_requests": 0,
        }
        self.clock = StepClock(args.sim_time_scale)

    # prefix cache ----------------------------------------------------------
    @staticmethod
    def _page_keys(tokens: list[str]) -> list[str]:
        keys, h = [], hashlib.blake2b(digest_size=16)
        for i in range(0, len(tokens) - len(tokens) % PAGE, PAGE):
            h.update("".join(tokens[i : i + PAGE]).encode())
            keys.append(h.copy().hexdigest())
        return keys

    def cached_prefix(self, keys: list[str]) -> int:
        """Tokens of the longest cached prefix of a prompt with these page keys."""
        hit = 0
        for n, key in enumerate(keys, start=1):
            if key not in self.prefix_cache:
                break
            self.prefix_cache.move_to_end(key)
            hit = n * PAGE
        return hit

    def remember(self, tokens: list[str]) -> None:
        for key in self._page_keys(tokens):
            self.prefix_cache[key] = None
            self.prefix_cache.move_to_end(key)
        while len(self.prefix_cache) > 200_000:
            self.prefix_cache.popitem(last=False)

    def flush(self) -> None:
        self.prefix_cache.clear()

    def shared_tokens(self, batch: list[Request]) -> int:
        """Prompt tokens of the batch held once for several of its requests (the same prompt pages in flight more
        than once: the radix cache keeps one copy): PAGE x (pages of every request - distinct pages); counted again
        only when the batch's requests change."""
        members = tuple(map(id, batch))
        if self._shared[0] != members:
            pages = [key for req in batch for key in req.page_keys]
            self._shared = (members, PAGE * (len(pages) - len(set(pages))))
        return self._shared[1]

    # requests --------------------------------------------------------------
    def submit(self, prompt: str, sampling: dict, input_ids: list[int] | None = None) -> Request:
        """Queue a request; ``input_ids`` (SGLang's pre-tokenised prompt) are its tokens where given. Where the engine
        runs in real time (``run``), the request reaches the queue its request_latency after it arrived, and never
        before one that arrived earlier (SGLang's tokenizer hands requests to the scheduler in order)."""
        arrived = time.monotonic()
        max_new = int(sampling.get("max_new_tokens", 128))
        temperature = float(sampling.get("temperature", 1.0))
        tokens = [str(i) for i in input_ids] if input_ids is not None else split_tokens(prompt)
        length = len(tokens) if input_ids is not None else self.count_tokens(prompt, len(tokens))
        if length + max_new > self.args.context_length:
            raise ValueError(
                f"prompt of {length} tokens + max_new_tokens {max_new} "
                f"exceeds the context length {self.args.context_length}"
            )
        reply, natural = reply_tokens(prompt, max_new, bool(sampling.get("ignore_eos")))
        if self.random_target:
            reply = random_weights_reply(reply)
        thinking = not prompt.rstrip().endswith("</think>")
        a = request_skill(prompt, temperature, thinking and "<|im_start|>" in prompt, self.acceptance)
        rng = random.Random(f"{prompt}|{self.decoding}|{self.args.random_seed}")
        req = Request(prompt, tokens, reply, natural, a, rng, asyncio.Queue(), page_keys=self._page_keys(tokens))
        req.started, req.length = arrived, length
        req.drafter = request_drafter(self.decoding, a, rng, self.acceptance, tokens, reply, self.random_drafter)
        self.counters["requests"] += 1
        if not self.real_time:  # stepped in virtual time (specsweep.sim.replay): the steps alone, no latency
            self._enqueue(req)
            return req
        # on the absolute schedule: from its arrival, in arrival order (the ready times never decrease)
        ready = max(
            self.holding[-1][0] if self.holding else 0.0,
            arrived + self.cost.request_latency(length) / self.args.sim_time_scale,
        )
        self.holding.append((ready, req))
        asyncio.get_running_loop().call_later(max(0.0, ready - time.monotonic()), self._release)
        return req

    def _release(self) -> None:
        """The held requests whose request_latency has passed reach the queue, in the order they arrived."""
        now = time.monotonic()
        while self.holding and self.holding[0][0] <= now:
            self._enqueue(self.holding.popleft()[1])

    def _enqueue(self, req: Request) -> None:
        """The request reaches the scheduler's queue (after its request_latency: the server's hand-offs)."""
        if req.aborted:
            return
        req.queued = time.monotonic()
        self.waiting.append(req)
        self.wakeup.set()

    def abort(self, req: Request) -> None:
        """Stop a request whose client has gone away before its end, as SGLang does (its HTTP server aborts a
        streaming request whose client disconnects: TokenizerManager.abort_request, and the scheduler drops it from
        its queue or running batch): it leaves the queue, the prefill under way or the running batch, so the next
        step runs without it and a new request may take its slot; a step under way that holds it emits nothing for
        it. The tokens it produced stay counted; it is counted in ``aborted_requests``."""
        if req.aborted or req.produced >= len(req.reply):
            return
        req.aborted = True
        self.counters["aborted_requests"] += 1
        self.waiting = [r for r in self.waiting if r is not req]
        if self.prefilling is req:
            self.prefilling = None
        if any(r is req for r in self.running):
            self.running = [r for r in self.running if r is not req]
            self.batch_full = False  # a running slot is free, as when a request finishes
        self.wakeup.set()

    def count_tokens(self, prompt: str, approximate: int) -> int:
        """A prompt's tokens: the model's tokenizer's count (sim.tokenizer model), else the word splitter's."""
        if self.args.sim_tokenizer != "model":
            return approximate
        return count_tokens(prompt, self.args.model_path)

    def next_step(self) -> tuple[list[Request], list[Request], float]:
        """The next step as SGLang schedules it by default (chunked prefill, no mixed batches): while requests wait
        and a running slot is free, a prefill step of at most --chunked-prefill-size new prompt tokens (8192, as
        SGLang 0.5.16 picks on an H200; -1: no limit), the request that goes past it continuing in the next step,
        the running batch held meanwhile; else a decode (or verify) step of the running batch. As SGLang 0.5.16
        does, a step that continues a chunked prompt counts that request twice against --max-running-requests, and
        a request refused for the limit keeps every later one out until a running request finishes: a burst of 16
        prompts of 4k tokens at --max-running-requests 16 runs 15, the 16th waiting for the first to finish (the
        real server's record: benchmarks/gpu/calibrate-2026-12-01, the long workload at concurrency 16). Returns
        (requests whose prefill this step completes, each getting its first token; the decoding batch; modelled
        seconds)."""
        limit = self.args.max_running_requests
        budget = self.chunk if self.chunk > 0 else 1 << 62
        new, pairs, step = 0, 0.0, 0.0
        done: list[Request] = []
        # SGLang 0.5.16 counts a chunked request it continues in this step twice against the limit; once a new
        # request cannot be admitted, none is until a running one finishes (its batch_is_full latch)
        again = 1 if self.prefilling is not None else 0
        while budget > 0 and (self.prefilling or (self.waiting and not self.batch_full)):
            if self.prefilling is None and len(self.running) + len(done) + again >= limit:
                self.batch_full = True
                break
            if self.prefilling is None:
                req = self.waiting.pop(0)
                req.admitted = time.monotonic()
                cached = self.cached_prefix(req.page_keys)  # in the simulator's units, counted as the model's
                req.cached_tokens = min(req.length, round(cached * req.length / max(len(req.prompt_tokens), 1)))
                req.prefill_done = req.cached_tokens
                self.prefilling = req
            req = self.prefilling
            part = min(req.length - req.prefill_done, budget)
            new += part
            pairs += part * req.prefill_done + part * part / 2
            req.prefill_done += part
            budget -= part
            if req.prefill_done >= req.length:
                done.append(req)
                self.prefilling = None
        if new or done:  # a prefill step: the completed requests' first tokens (their logits) come with it
            step = self.cost.prefill(new, pairs, self.decoding)
            if done:
                step += self.cost.decode_step(Decoding(), [r.length for r in done])
            return done, [], step
        batch = list(self.running)
        contexts, shared = [r.length + r.produced for r in batch], self.shared_tokens(batch)
        trie = ngram_trie_tokens([r.length for r in batch], [r.produced for r in batch])
        step = self.cost.decode_step(self.decoding, contexts, shared, trie)
        if self.stage_profiler is not None and batch:
            self.stage_profiler.record_round(
                simulated_split(self.cost, self.decoding, contexts, shared),
                batch_size=len(batch),
                verify_width=self.decoding.verify_width(),
                tree_budget=self.decoding.budget,
                block_size=self.decoding.block_size,
            )
        return [], batch, step

    def commit_step(self, admitted: list[Request], batch: list[Request]) -> None:
        """Emit what one step produced: the admitted requests' first tokens, each decoding request's accepted ones."""
        self.counters["steps"] += 1
        admitted = [r for r in admitted if not r.aborted]
        batch = [r for r in batch if not r.aborted]
        for req in admitted:
            req.prefilled = True
            self._emit(req, 1)
        first = batch[0] if batch else None  # the build counts a step by its batch's first request's context
        probe = self.rank_probe if first and first.length + first.produced >= RankProbe.MIN_CONTEXT else None
        for req in batch:
            if req.drafter is None:
                self._emit(req, 1)
                continue
            n, ranks = req.drafter.round(req.produced, len(batch))
            if probe and ranks is not None:  # the probe runs on DDTree, whose drafter ranks its candidates
                probe.record(ranks, n - 1)
            req.verify_ct += 1
            req.correct_drafts.extend([0] * (n - len(req.correct_drafts)))
            req.correct_drafts[n - 1] += 1  # n tokens a round: n - 1 drafts accepted and the target's own
            self.counters["verify_calls"] += 1
            self.counters["accepted_tokens"] += n
            self._emit(req, n)
        table = probe.step() if probe else None
        if table:
            print(table, flush=True)
        before, was_running = len(self.running) + len(admitted), bool(self.running)
        self.running = [r for r in self.running + admitted if r.produced < len(r.reply)]
        if len(self.running) < before or not was_running:  # a request finished, or a new running batch began
            self.batch_full = False

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running and self.prefilling is None

    async def run(self) -> None:
        """Steps in real time on an absolute schedule (specsweep.sim.clock): each one ends at its deadline, the end of
        the step before + its modelled seconds / --sim-time-scale, its own work done inside it; a step whose work
        passes its deadline is counted late and the next one starts when it ends (no debt carried)."""
        self.real_time = True
        while True:
            if self.idle:
                self.wakeup.clear()
                await self.wakeup.wait()
                self.clock.restart()
            admitted, batch, step = self.next_step()
            wait = self.clock.step(step)
            if wait > 0:
                await asyncio.sleep(wait)
            self.commit_step(admitted, batch)

    def _emit(self, req: Request, n: int) -> None:
        n = min(n, len(req.reply) - req.produced)
        k = self.args.sim_corrupt_tree_from
        if k and self.decoding.spec.builds_trees and req.verify_ct and n > k and not req.corrupted:
            req.corrupted = True  # the accepted path went past depth k: the rest of the reply diverges
            start = req.produced + k
            req.reply[start:] = [tok.upper() if tok.upper() != tok else tok + "x" for tok in req.reply[start:]]
        req.produced += n
        self.counters["generation_tokens"] += n
        done = req.produced >= len(req.reply)
        if done:
            self.counters["prompt_tokens"] += req.length
            self.counters["cached_tokens"] += req.cached_tokens
            self.remember(req.prompt_tokens + req.reply)
        req.queue.put_nowait(
            Step(n, req.produced, req.verify_ct, done, self.counters["steps"], tuple(req.correct_drafts))
        )

    def meta_info(self, req: Request, rid: str, step: Step | None = None) -> dict:
        """SGLang's meta_info for a request as it stood after ``step`` (default: now)."""
        produced = step.produced if step is not None else req.produced
        scale = self.args.sim_time_scale
        verify_ct = step.verify_ct if step is not None else req.verify_ct
        correct_drafts = list(step.correct_drafts) if step is not None else list(req.correct_drafts)
        finished = produced >= len(req.reply)
        info = {
            "id": rid,
            "prompt_tokens": req.length,
            "completion_tokens": produced,
            "cached_tokens": req.cached_tokens,
            "finish_reason": (
                {"type": "stop", "matched": 151645}
                if req.natural_stop
                else {"type": "length", "length": len(req.reply)}
            )
            if finished
            else None,
            "e2e_latency": (time.monotonic() - req.started) * scale,  # modelled seconds
            "queue_time": (req.admitted - (req.queued or req.started)) * scale if req.admitted is not None else None,
            "simulated": True,
        }
        if step is not None:  # the engine step that sent this chunk (all chunks of one step share it)
            info["sim_step"] = step.index
        if self.decoding.spec.speculative:
            info["spec_verify_ct"] = verify_ct
            # SGLang's definition: completion tokens (the prefill token included) per verify round
            info["spec_accept_length"] = produced / verify_ct if verify_ct else 0.0
            # rounds by drafts accepted, as SGLang 0.5.16 reports them (index: drafts accepted, value: rounds)
            info["spec_correct_drafts_histogram"] = correct_drafts
        return info
