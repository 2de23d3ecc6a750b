"""A closed-loop cell on the simulated engine in virtual time: the engine's own steps, no sleeping, no HTTP.

Used where many independent cells are needed quickly and deterministically (the
statistical checks of the confidence intervals): the records are those the
client would write if the host added no delay (nor the server's request_latency
outside its steps). Numbers from it are simulated.
"""

from __future__ import annotations

import json
from collections import deque

from .. import algorithms
from ..client import RequestRecord
from ..text import chat_prompt
from .args import parse_args
from .engine import Engine


def engine(
    algorithm: str = algorithms.BASELINE,
    block_size: int = 16,
    budget: int = 0,
    tp: int = 1,
    gpu: str = "H200",
    model_profile: str = "qwen3-8b",
    max_running: int = 256,
    tree_build: str | None = None,
    load_format: str | None = None,
    runtime: dict | None = None,
    random_seed: int = 0,
    overlap: bool = True,
    **params,
) -> Engine:
    """A simulated engine decoding with ``algorithm`` (a name of specsweep.algorithms.REGISTRY), started with
    the flags its registry spelling gives for these parameters (the registry's defaults for the others; DDTree as
    ``tree_build`` builds its tree, default the pull request's); ``runtime`` a runtime profile of its own (default
    the generic sglang one), ``random_seed`` its drafts' seed (SGLang's --random-seed), ``overlap``: False for
    --disable-overlap-schedule."""
    spec = algorithms.get(algorithm)
    argv = [
        "--model-path",
        "sim",
        "--tp-size",
        str(tp),
        "--sim-gpu",
        gpu,
        "--sim-model-profile",
        model_profile,
        "--max-running-requests",
        str(max_running),
    ]
    if spec.speculative:
        given = {"block_size": block_size, "budget": budget, **params}
        argv += spec.server_flags(
            spec.resolve({p.name: given.get(p.name, p.default) for p in spec.parameters}), "sim-drafter"
        )
    if tree_build is not None:
        argv += ["--sim-ddtree-build", tree_build]
    if load_format is not None:  # dummy: random weights for the target and its drafter
        argv += ["--load-format", load_format]
    if runtime is not None:
        argv += ["--sim-runtime", "given", "--sim-profiles", json.dumps({"runtimes": {"given": runtime}})]
    if not overlap:
        argv.append("--disable-overlap-schedule")
    return Engine(parse_args(argv + ["--random-seed", str(random_seed)]))


def closed_loop(sim: Engine, sessions: list, concurrency: int, sampling: dict | None = None) -> list[dict]:
    """Sessions through ``concurrency`` closed-loop slots; request records (dicts) in virtual seconds. A multi-turn
    session keeps its slot: its next turn (the conversation so far, the reply, its follow-up message) is sent as its
    turn ends, without think time, as the client does under load.think_time 0."""
    sampling = {"temperature": 0.0, **(sampling or {})}
    pending, flying, records, clock = deque(sessions), {}, [], 0.0

    def send(session, turn: int, messages: list[dict]) -> None:
        record = RequestRecord(session.id, turn, session.kind, t_sched=clock, t0=clock)
        req = sim.submit(chat_prompt(messages), dict(sampling, max_new_tokens=session.max_new_tokens))
        record.prompt_tokens = len(req.prompt_tokens)
        flying[id(req)] = (req, record, session, turn, messages)

    def start_next() -> None:
        first = pending.popleft()
        send(first, 0, list(first.messages))

    while pending and len(flying) < concurrency:
        start_next()
    while flying:
        admitted, batch, seconds = sim.next_step()
        clock += seconds
        sim.commit_step(admitted, batch)
        for key, (req, record, session, turn, messages) in list(flying.items()):
            done = False
            while not req.queue.empty():
                step = req.queue.get_nowait()
                done = step.done
                record.chunk_times.append(clock)
                record.chunk_tokens.append(step.tokens)
            record.output_tokens = req.produced
            record.verify_ct = req.verify_ct or None
            if done:
                record.t_end = clock
                records.append(record.as_dict())
                del flying[key]
                if turn < len(session.followups):
                    reply = {"role": "assistant", "content": " ".join(req.reply[: req.produced])}
                    send(session, turn + 1, messages + [reply, session.followups[turn]])
                elif pending:
                    start_next()
    return records
