"""The simulated SGLang-compatible server: HTTP API and a continuous-batching engine.

Run as ``python -m specsweep.sim`` with SGLang's launch flags (the subset
specsweep uses) plus ``--sim-*`` flags for the emulated hardware. It waits
out each modelled engine step instead of computing, on an absolute schedule
(specsweep.sim.clock: a step ends at its modelled deadline, its own Python work
done inside it); steps whose work ran past their deadline are counted in
/server_info's ``sim_clock`` and /metrics' ``specsweep_sim:*`` counters. Every
response says ``simulated``.

``--sim-time-scale S`` runs its clock S times fast: every modelled duration (start-up, each engine step) lasts
1/S of its modelled seconds (the hang fault still never ends), while the durations it reports itself
(``e2e_latency`` and ``queue_time`` in meta_info) stay in modelled seconds. What a client measures then lasts
about 1/S of what it would at S = 1 (host overheads do not scale), so only checks of the workflow's plumbing use
it; ``/get_server_info`` gives ``sim_time_scale`` for the cell's provenance.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import signal
import sys
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from aiohttp import web

from .. import __version__, algorithms
from ..ddtree import DEFAULT_BUILD, RankProbe, builds as ddtree_builds, define as define_ddtree_builds
from ..text import chat_template, split_tokens
from ..workloads import WorkloadError, tokenizer
from ..modelling.acceptance import (
    Drafter,
    Skill,
    drafter_acceptance,
    random_weights_reply,
    reply_tokens,
    request_drafter,
    request_skill,
)
from ..modelling.cost import CHUNKED_PREFILL_SIZE, CostModel
from ..modelling.decoding import Decoding
from ..modelling.profiles import profiles
from .clock import StepClock
from .stream import EventStream

PAGE = 64  # prefix-cache granularity in tokens


def _merge_config_file(argv: list[str]) -> list[str]:
    """SGLang's --config FILE: launch options from a YAML file (key: value), given before the command line's."""
    if "--config" not in argv:
        return argv
    i = argv.index("--config")
    import yaml

    with open(argv[i + 1]) as handle:
        options = yaml.safe_load(handle) or {}
    extra = []
    for key, value in options.items():
        flag = "--" + str(key).replace("_", "-")
        if value is True:
            extra.append(flag)
        elif value not in (False, None):
            extra += [flag, str(value)]
    return extra + argv[:i] + argv[i + 2 :]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    argv = _merge_config_file(list(sys.argv[1:] if argv is None else argv))
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--sim-accept-flag", action="append", default=[])
    pre.add_argument("--sim-ddtree-builds", type=json.loads, default={})
    known = pre.parse_known_args(argv)[0]
    accepted = known.sim_accept_flag
    if known.sim_ddtree_builds:  # the configuration's own builds, before --sim-ddtree-build's choices
        define_ddtree_builds(known.sim_ddtree_builds)
    p = argparse.ArgumentParser(prog="python -m specsweep.sim", description=__doc__)
    p.add_argument("--api-key", help="require this key as a bearer token on every endpoint but /health")
    p.add_argument("--model-path", required=True)
    p.add_argument("--served-model-name")
    p.add_argument("--tp-size", "--tp", type=int, default=1)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--speculative-algorithm", choices=[a.sglang for a in algorithms.REGISTRY.values() if a.sglang])
    p.add_argument("--speculative-draft-model-path", "--speculative-draft-model")
    p.add_argument("--speculative-dflash-block-size", type=int)
    p.add_argument("--speculative-num-draft-tokens", type=int)
    p.add_argument("--speculative-num-steps", type=int)
    p.add_argument("--speculative-eagle-topk", type=int)
    p.add_argument("--speculative-ngram-max-bfs-breadth", type=int)
    p.add_argument("--speculative-ngram-match-type", choices=["BFS", "PROB"])
    p.add_argument("--speculative-ddtree-budget", type=int)
    p.add_argument("--page-size", type=int, default=1)
    p.add_argument("--max-running-requests", type=int, default=256)
    p.add_argument("--cuda-graph-max-bs", type=int)
    p.add_argument("--context-length", type=int, default=131072)
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--disable-overlap-schedule", action="store_true")
    p.add_argument("--random-seed", type=int, default=0)
    p.add_argument("--sim-gpu", default="H200")
    p.add_argument("--sim-model-profile", default="qwen3-8b")
    p.add_argument("--sim-startup-seconds", type=float, default=0.5)
    p.add_argument(
        "--sim-time-scale",
        type=_positive_float,
        default=1.0,
        metavar="S",
        help="run the clock S times fast: each modelled duration lasts 1/S of its seconds (tests of "
        "plumbing; reported durations stay modelled)",
    )
    p.add_argument(
        "--sim-ddtree-build",
        default=DEFAULT_BUILD,
        choices=sorted(ddtree_builds()),
        help="which build's DDTree to emulate (specsweep/data/ddtree_builds.yaml)",
    )
    p.add_argument(
        "--sim-ddtree-builds",
        metavar="JSON",
        help="DDTree builds of the configuration's own (ddtree_builds): {name: fields}",
    )
    p.add_argument("--sim-runtime", default="sglang", help="runtime profile: sglang or hf-eager")
    p.add_argument(
        "--sim-tokenizer",
        choices=["model", "approximate"],
        default="approximate",
        help="count prompt tokens with the model's tokenizer (as a real server) or the word splitter (sim.tokenizer)",
    )
    p.add_argument(
        "--sim-draft-model-profile",
        default="qwen3-0.6b",
        help="model profile of a STANDALONE drafter (EAGLE heads are sized from the target's profile)",
    )
    p.add_argument("--sim-profiles", help="JSON: profile overrides {gpus: {...}, models: {...}, runtimes: {...}}")
    p.add_argument(
        "--sim-acceptance", help="JSON: acceptance-model parameters (see specsweep.modelling.acceptance.ACCEPTANCE)"
    )
    p.add_argument(
        "--sim-accept-flag",
        action="append",
        default=[],
        metavar="FLAG:TYPE",
        help="accept (and ignore) a flag of a server build, e.g. --speculative-ddtree-foo:int",
    )
    p.add_argument(
        "--sim-crash-after",
        type=int,
        default=int(os.environ.get("SPECSWEEP_SIM_CRASH_AFTER", "0")),
        metavar="N",
        help="fault: exit abruptly when request N arrives (0: never; default from "
        "SPECSWEEP_SIM_CRASH_AFTER, so a method's env can set it)",
    )
    p.add_argument("--sim-crash-at-start", action="store_true", help="fault: fail while loading, before listening")
    p.add_argument("--sim-never-ready", action="store_true", help="fault: /health_generate never succeeds")
    p.add_argument(
        "--sim-hang-after-tokens",
        type=int,
        default=0,
        metavar="N",
        help="fault: every stream stops sending (without closing) after N tokens",
    )
    p.add_argument(
        "--sim-error-rate",
        type=float,
        default=0.0,
        metavar="P",
        help="fault: answer a share P of generation requests with HTTP 500 (seeded)",
    )
    p.add_argument(
        "--sim-truncate-rate",
        type=float,
        default=0.0,
        metavar="P",
        help="fault: cut a share P of streams mid-way, without [DONE] (seeded)",
    )
    p.add_argument(
        "--sim-corrupt-tree-from",
        type=int,
        default=0,
        metavar="K",
        help="fault: DDTree outputs go wrong from tree depth K on, as when state leaks between branches",
    )
    modelled = set(p._option_string_actions)  # the flags the simulator models (every later one it accepts only)
    _accept_sglang_flags(p, accepted)
    args = p.parse_args(argv)
    declared = {item.partition(":")[0] for item in accepted} - modelled
    # the declared build flags given, accepted and not modelled: logged, and in /server_info
    args.sim_unmodelled_flags = sorted(
        f for f in declared if getattr(args, algorithms.dest(f), None) not in (None, False)
    )
    if args.speculative_algorithm:
        spec = algorithms.by_sglang_name(args.speculative_algorithm)
        if spec.drafter and not args.speculative_draft_model_path:
            p.error(f"--speculative-draft-model-path is required with --speculative-algorithm {spec.sglang}")
        if spec.drafter is None and args.speculative_draft_model_path:
            p.error(f"--speculative-algorithm {spec.sglang} takes no draft model")
        block = args.speculative_dflash_block_size
        if block and args.speculative_num_draft_tokens and block != args.speculative_num_draft_tokens:
            p.error("--speculative-dflash-block-size and --speculative-num-draft-tokens disagree")
        try:
            decoding_from_args(args)
        except ValueError as exc:  # what SGLang refuses at start-up
            p.error(str(exc))
    return args


def _positive_float(text: str) -> float:
    value = float(text)
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive finite number, not {text}")
    return value


def _accept_sglang_flags(parser: argparse.ArgumentParser, extra: list[str]) -> None:
    """Accept every flag of the recorded SGLang releases (ignored when not modelled), and declared build flags."""
    from ..sglang_options import add_option, available_tables, load_table

    group = parser.add_argument_group("SGLang flags accepted and not modelled")
    for version in available_tables():
        for option in load_table(version)["options"]:
            add_option(group, option["flags"], option["nargs"], option["type"], None)
    for item in extra:
        flag, _, kind = item.partition(":")
        add_option(group, [flag], 0 if kind == "bool" else None, None if kind == "bool" else (kind or "str"), None)


def decoding_from_args(args: argparse.Namespace, env=None) -> Decoding:
    """What the server decodes with, read from SGLang's flags and environment as SGLang resolves them
    (specsweep.algorithms: each algorithm's own flags, SGLang's defaults where one is absent)."""
    env = os.environ if env is None else env
    if not args.speculative_algorithm:
        return Decoding()
    spec = algorithms.by_sglang_name(args.speculative_algorithm)
    params = spec.from_server(vars(args), env)
    if spec is algorithms.DDTREE:
        params = spec.resolve(dict(params, tree_build=args.sim_ddtree_build))
    return Decoding.of_params(spec.name, params, not args.disable_overlap_schedule, env)


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
        self.acceptance = drafter_acceptance(
            self.decoding, profiles(overrides), json.loads(args.sim_acceptance) if args.sim_acceptance else None
        )
        # dummy weights (--load-format dummy; the drafter's --speculative-draft-load-format, which follows the target's
        # where not given, as in SGLang): the target's greedy output loops, a drafter model never proposes its choice
        self.random_target = getattr(args, "load_format", None) == "dummy"
        drafter_format = getattr(args, "speculative_draft_load_format", None) or getattr(args, "load_format", None)
        self.random_drafter = drafter_format == "dummy"
        self.rank_probe = RankProbe(self.decoding.block_size - 1) if self.decoding.probes_ranks() else None
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
        req.queued = time.monotonic()
        self.waiting.append(req)
        self.wakeup.set()

    def count_tokens(self, prompt: str, approximate: int) -> int:
        """A prompt's tokens: the model's tokenizer's count (sim.tokenizer model), else the word splitter's."""
        if self.args.sim_tokenizer != "model":
            return approximate
        from ..workloads import count_tokens

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
        step = self.cost.decode_step(self.decoding, [r.length + r.produced for r in batch], self.shared_tokens(batch))
        return [], batch, step

    def commit_step(self, admitted: list[Request], batch: list[Request]) -> None:
        """Emit what one step produced: the admitted requests' first tokens, each decoding request's accepted ones."""
        self.counters["steps"] += 1
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
        if k and self.decoding.algorithm == "ddtree" and req.verify_ct and n > k and not req.corrupted:
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
        if self.decoding.algorithm != "ar":
            info["spec_verify_ct"] = verify_ct
            # SGLang's definition: completion tokens (the prefill token included) per verify round
            info["spec_accept_length"] = produced / verify_ct if verify_ct else 0.0
            # rounds by drafts accepted, as SGLang 0.5.16 reports them (index: drafts accepted, value: rounds)
            info["spec_correct_drafts_histogram"] = correct_drafts
        return info


def _crash_on_engine_error(task: asyncio.Task) -> None:
    """Like a real server whose scheduler fails: say why and exit, never hang with requests pending."""
    if not task.cancelled() and task.exception() is not None:
        import traceback

        traceback.print_exception(task.exception())
        print("engine loop failed; exiting", flush=True)
        os._exit(1)


class SimServer:
    """The HTTP API over one engine: each route a method, each answer as SGLang gives it (plus ``simulated``)."""

    def __init__(self, args: argparse.Namespace):
        self.args, self.engine = args, Engine(args)
        self.model_name = args.served_model_name or args.model_path
        self.launched = time.time()
        self.ids = iter(range(1, 1 << 62))
        self.generate_requests = 0
        self.fault_rng = random.Random(f"faults:{args.random_seed}")

    def decode(self, token_ids: list[int]) -> str:
        """The text of token ids, with the model's tokenizer where it is a local folder, else the Qwen tokenizer
        shipped with the workload data; placeholder words where neither is installed."""
        try:
            return tokenizer(self.args.model_path).decode(token_ids)
        except (ImportError, WorkloadError):
            return " ".join(f"t{i}" for i in token_ids)

    @staticmethod
    async def wait_done(req: Request) -> None:
        """Until the engine's last step for a request (non-streaming answers read the whole reply after it)."""
        while not (await req.queue.get()).done:
            pass

    def usage(self, req: Request, produced: int | None = None) -> dict:
        """OpenAI usage; as SGLang, cached prompt tokens are reported only with --enable-cache-report."""
        details = {"cached_tokens": req.cached_tokens} if getattr(self.args, "enable_cache_report", False) else None
        produced = req.produced if produced is None else produced
        return {
            "prompt_tokens": req.length,
            "completion_tokens": produced,
            "total_tokens": req.length + produced,
            "prompt_tokens_details": details,
        }

    @web.middleware
    async def require_key(self, request, handler):
        if self.args.api_key and request.path != "/health":
            if request.headers.get("Authorization", "") != f"Bearer {self.args.api_key}":
                return web.json_response({"error": "invalid or missing API key"}, status=401)
        return await handler(request)

    async def start_engine(self, app) -> None:
        app["engine_task"] = asyncio.create_task(self.engine.run())
        app["engine_task"].add_done_callback(_crash_on_engine_error)

    async def stop_engine(self, app) -> None:
        app["engine_task"].cancel()

    async def health(self, request):
        return web.Response(text="")

    async def health_generate(self, request):
        if self.args.sim_never_ready:
            raise web.HTTPServiceUnavailable(text="fault: never ready (--sim-never-ready)")
        req = self.engine.submit("<|im_start|>user\nhello<|im_end|>\n", {"max_new_tokens": 1, "temperature": 0})
        await self.wait_done(req)
        return web.Response(text="")

    async def model_info(self, request):
        return web.json_response(
            {
                "model_path": self.args.model_path,
                "tokenizer_path": self.args.model_path,
                "is_generation": True,
                "simulated": True,
            }
        )

    async def server_info(self, request):
        engine = self.engine
        verify = engine.counters["verify_calls"]
        avg = engine.counters["accepted_tokens"] / verify if verify else None
        info = {k.replace("-", "_"): v for k, v in vars(self.args).items()}
        info["chunked_prefill_size"] = engine.chunk  # as resolved (SGLang reports its own choice)
        decoding = engine.decoding
        shape = decoding.tree_shape()
        if shape:  # what the DDTree build runs at this budget
            info.update({"ddtree_build": decoding.tree_build, "ddtree_mode": shape[0], "ddtree_width": shape[1]})
        if decoding.spec.drafting in ("draft-model", "lookup"):  # the settings as SGLang resolved them
            topk = (decoding.topk or 1) if decoding.spec.drafting == "draft-model" else decoding.max_bfs_breadth
            info.update(
                {
                    "speculative_num_draft_tokens": decoding.num_draft_tokens,
                    "speculative_eagle_topk": topk,
                    "speculative_num_steps": decoding.num_steps or decoding.num_draft_tokens // topk,
                }
            )
            if decoding.spec.drafting == "lookup":
                info.update(
                    {
                        "speculative_ngram_max_bfs_breadth": decoding.max_bfs_breadth,
                        "speculative_ngram_match_type": decoding.match_type,
                    }
                )
        info.update(
            {
                "version": f"specsweep-sim {__version__}",
                "simulated": True,
                "sim_clock": engine.clock.report(),
                "internal_states": [{"avg_spec_accept_length": avg, "launched_at": self.launched}],
            }
        )
        return web.json_response(info)

    async def flush_cache(self, request):
        self.engine.flush()
        return web.Response(text="Cache flushed.\n")

    async def metrics(self, request):
        if not self.args.enable_metrics:
            raise web.HTTPNotFound(text="metrics are disabled; start with --enable-metrics")
        engine = self.engine
        escaped = self.model_name.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")  # as Prometheus asks
        c, label = engine.counters, f'{{model_name="{escaped}"}}'
        lines = []
        for name, value, kind in (
            ("sglang:prompt_tokens_total", c["prompt_tokens"], "counter"),
            ("sglang:generation_tokens_total", c["generation_tokens"], "counter"),
            ("sglang:num_requests_total", c["requests"], "counter"),
            ("sglang:cached_tokens_total", c["cached_tokens"], "counter"),
            ("sglang:spec_verify_calls_total", c["verify_calls"], "counter"),
            ("sglang:num_retracted_requests_total", 0, "counter"),
            ("sglang:cuda_graph_passes_total", c["steps"], "counter"),
            ("sglang:num_running_reqs", len(engine.running), "gauge"),
            ("sglang:num_queue_reqs", len(engine.waiting), "gauge"),
            ("specsweep_sim:steps_late_total", engine.clock.steps_late, "counter"),
            ("specsweep_sim:late_seconds_total", engine.clock.late_seconds, "counter"),
            ("specsweep_sim:scheduled_seconds_total", engine.clock.scheduled_seconds, "counter"),
        ):
            lines += [f"# TYPE {name} {kind}", f"{name}{label} {float(value)}"]
        lines.append("# specsweep simulated backend")
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def generate(self, request):
        """SGLang's native /generate: text or token ids in; one chunk per engine step when streaming."""
        args, engine = self.args, self.engine
        try:
            body = await request.json()
        except json.JSONDecodeError:
            raise web.HTTPBadRequest(text="request body is not JSON")
        text, input_ids = body.get("text"), body.get("input_ids")
        if text is None and isinstance(input_ids, list) and input_ids and all(isinstance(i, int) for i in input_ids):
            text = self.decode(input_ids)  # SGLang's own client sends token ids with --tokenize-prompt
        elif not isinstance(text, str):
            raise web.HTTPBadRequest(
                text="the simulated server accepts 'text' (one string) or 'input_ids' (one list of token ids) only"
            )
        else:
            input_ids = None
        sampling = body.get("sampling_params") or {}
        self.generate_requests += 1
        if args.sim_crash_after and self.generate_requests >= args.sim_crash_after:
            print(f"fault: crashing at request {self.generate_requests} (--sim-crash-after)", flush=True)
            os._exit(3)
        if args.sim_error_rate and self.fault_rng.random() < args.sim_error_rate:
            return web.json_response(
                {"error": {"message": "fault: injected internal error (--sim-error-rate)"}}, status=500
            )
        truncate = bool(args.sim_truncate_rate) and self.fault_rng.random() < args.sim_truncate_rate
        try:
            req = engine.submit(text, sampling, input_ids)
        except ValueError as exc:
            return web.json_response({"error": {"message": str(exc)}}, status=400)
        rid = f"sim-{next(self.ids)}"
        if not body.get("stream"):
            await self.wait_done(req)
            return web.json_response({"text": "".join(req.reply), "meta_info": engine.meta_info(req, rid)})
        stream = await EventStream.open(request)
        done, sent = False, 0
        incremental = bool(getattr(args, "incremental_streaming_output", False))
        while not done:  # one chunk per engine step, as SGLang streams
            step = await req.queue.get()
            done = step.done
            if args.sim_hang_after_tokens and step.produced >= args.sim_hang_after_tokens:
                await asyncio.sleep(3600)  # fault: the stream goes silent, the connection stays open
            if truncate and step.produced * 2 >= len(req.reply):
                request.transport.close()  # fault: the stream is cut mid-way
                return stream.response
            # as SGLang: the whole text so far, or with --incremental-streaming-output only the new segment
            text = "".join(req.reply[sent if incremental else 0 : step.produced])
            sent = step.produced
            await stream.send({"text": text, "meta_info": engine.meta_info(req, rid, step)})
        return await stream.close()

    async def openai(self, request, chat: bool):
        """/v1/chat/completions (chat) and /v1/completions, streaming or not."""
        model_name = self.model_name
        try:
            body = await request.json()
        except json.JSONDecodeError:
            raise web.HTTPBadRequest(text="request body is not JSON")
        if chat:
            thinking = (body.get("chat_template_kwargs") or {}).get("enable_thinking", True)
            try:  # the model folder's chat template, as SGLang applies it (Qwen ChatML without one)
                prompt = chat_template(self.args.model_path).render(body.get("messages") or [], thinking)
            except ValueError as exc:
                raise web.HTTPBadRequest(text=str(exc))
        else:
            prompt = body.get("prompt")
            if not isinstance(prompt, str):
                raise web.HTTPBadRequest(text="the simulated server accepts one string prompt")
        sampling = {
            "max_new_tokens": body.get("max_tokens") or body.get("max_completion_tokens") or 128,
            "temperature": body.get("temperature", 1.0),
            "ignore_eos": body.get("ignore_eos", False),
        }
        try:
            req = self.engine.submit(prompt, sampling)
        except ValueError as exc:
            return web.json_response({"object": "error", "message": str(exc), "code": 400}, status=400)
        rid, created = f"sim-{next(self.ids)}", int(time.time())
        kind = "chat.completion" if chat else "text_completion"

        def choice(text, finish):
            if chat:
                return {
                    "index": 0,
                    "delta": {"role": "assistant", "content": text} if text is not None else {},
                    "finish_reason": finish,
                }
            return {"index": 0, "text": text or "", "finish_reason": finish}

        if not body.get("stream"):
            await self.wait_done(req)
            text = "".join(req.reply)
            finish: str | None = "stop" if req.natural_stop else "length"
            ch = (
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
                if chat
                else {"index": 0, "text": text, "finish_reason": finish}
            )
            return web.json_response(
                {
                    "id": rid,
                    "object": kind,
                    "created": created,
                    "model": model_name,
                    "choices": [ch],
                    "usage": self.usage(req),
                    "simulated": True,
                }
            )
        options = body.get("stream_options") or {}
        stream = await EventStream.open(request)
        obj = kind + ".chunk" if chat else kind
        if chat:  # first chunk carries the role only
            await stream.send(
                {
                    "id": rid,
                    "object": obj,
                    "created": created,
                    "model": model_name,
                    "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
                }
            )
        sent, done = 0, False
        while not done:  # one chunk per engine step
            step = await req.queue.get()
            done = step.done
            text = "".join(req.reply[sent : step.produced])
            sent = step.produced
            finish = ("stop" if req.natural_stop else "length") if done else None
            payload = {
                "id": rid,
                "object": obj,
                "created": created,
                "model": model_name,
                "choices": [choice(text, finish)],
            }
            if options.get("continuous_usage_stats"):
                payload["usage"] = self.usage(req, step.produced)
            await stream.send(payload)
        if options.get("include_usage"):
            await stream.send(
                {
                    "id": rid,
                    "object": obj,
                    "created": created,
                    "model": model_name,
                    "choices": [],
                    "usage": self.usage(req),
                }
            )
        return await stream.close()

    async def chat_completions(self, request):
        return await self.openai(request, chat=True)

    async def completions(self, request):
        return await self.openai(request, chat=False)

    async def models(self, request):
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.model_name,
                        "object": "model",
                        "created": int(self.launched),
                        "owned_by": "specsweep-sim",
                    }
                ],
            }
        )

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self.require_key])
        app.on_startup.append(self.start_engine)
        app.on_cleanup.append(self.stop_engine)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/health_generate", self.health_generate)
        app.router.add_get("/get_model_info", self.model_info)
        app.router.add_get("/model_info", self.model_info)  # the newer name, which SGLang's bench_serving asks for
        app.router.add_get("/get_server_info", self.server_info)
        app.router.add_get("/server_info", self.server_info)
        app.router.add_route("*", "/flush_cache", self.flush_cache)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/generate", self.generate)
        return app


def build_app(args: argparse.Namespace) -> web.Application:
    return SimServer(args).app()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print(
        f"specsweep simulated SGLang server (SIMULATED, no GPU): {args.sim_model_profile} on "
        f"{args.sim_gpu} x{args.tp_size}, {decoding_from_args(args).describe()}"
        + (f", clock {args.sim_time_scale:g}x fast" if args.sim_time_scale != 1 else ""),
        flush=True,
    )
    if args.sim_unmodelled_flags:
        print(f"declared build flags, accepted and not modelled: {', '.join(args.sim_unmodelled_flags)}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    time.sleep(args.sim_startup_seconds / args.sim_time_scale)  # model load
    if args.sim_crash_at_start:
        raise SystemExit("fault: ImportError while loading the model (--sim-crash-at-start)")
    web.run_app(
        build_app(args),
        host=args.host,
        port=args.port,
        print=None,
        access_log=None,
        handle_signals=True,
        shutdown_timeout=1.0,
    )
