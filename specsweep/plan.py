"""The plan: what a configuration costs before it runs, and the order servers start in.

Each server's duration is predicted with the simulator's cost and acceptance
model for the configured hardware and model profile (``sim.gpu``,
``sim.model_profile``) and each TP size's cost model (``cost_model``: a
calibration measured on these GPUs, else the runtime profile ``sim.runtime``):
start-up (model load), then per cell the warm-up and the measured requests at
the cell's concurrency. Servers are packed onto the GPUs longest first (the
order the workflow uses, through job priorities); the plan reports the
predicted makespan against its lower bound.

Assumptions (stated in plan.md): outputs stop at 65% of max_new_tokens on
average (all of it with sampling.ignore_eos); a drafter with dummy weights
(model.load_format: dummy) is accepted no further than its bonus token, while
NGRAM drafts from the random model's output, a loop of its first three tokens;
SGLang start-up as the calibration measured it, cold for a server that starts
before any other on its host has finished starting (it compiles the kernels
and graphs), warm for later ones; without a measured start-up, weights read at
2 GB/s (none with dummy weights) + 60 s of initialisation and CUDA-graph
capture (the runtime profile's startup_seconds where it was measured) for
every server; hosts of as many GPUs as the calibration's host had (one host
without one); 3 s per server job for its own start; no overlap between a
server's cells.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

from . import engines, implied, sequential
from .cache import CellCache
from .calibration import choose
from .canon import atomic_write_json, atomic_write_text, digest, package_digest
from .cells import cell_digest, cell_key, cell_sessions
from .external import identity_digest
from .jobs import calibration_methods, cells_of_server, server_job, servers
from .methods import expand_methods
from .metrics import MIN_SESSIONS
from .layout import plan_memo_path, server_name
from .modelling.acceptance import mean_tau, model_drafter_family
from .modelling.cost import CostModel
from .modelling.decoding import Decoding
from .modelling.method import Method
from .modelling.profiles import profiles
from .text import chat_prompt
from .workloads import WARMUP_FILL_TOKENS, build, trace_span, warmup_fill

OUTPUT_SHARE = 0.65
# a run whose plan costs more than this many times the GPU-hours of the same plan with no calibration is refused
# unless confirm_plan_hours allows it: a calibration that makes a plan that much dearer is more likely broken than true
PLAN_BOUND = 10.0
SGLANG_INIT_SECONDS = 60.0
JOB_OVERHEAD_SECONDS = 3.0  # a server job's own start: interpreter, imports, server process, readiness polls
DISK_BYTES_PER_SECOND = 2e9


@lru_cache(maxsize=256)
def _workload_sample(workload_json: str, seed: int, model_path: str | None = None) -> tuple:
    """(sample prompts, mean first-turn tokens, turns per session) from a few sessions of a workload."""
    workload = json.loads(workload_json)
    sample = dict(workload, requests=4)
    if workload["family"] in ("long", "very_long"):  # the content is what matters; size it small to be quick
        sample["context_tokens"] = 1500
    return _sample_of(workload, build(sample, seed, model_path=model_path))


def _sample_of(workload: dict, sessions: list) -> tuple:
    """(prompts of the first four sessions, mean first-turn tokens, turns per session) of built sessions."""
    sessions = sessions[:4]
    prompts = tuple(chat_prompt(s.messages + s.followups) for s in sessions)
    turns = sum(1 + len(s.followups) for s in sessions) / len(sessions)
    tokens = sum(s.tokens for s in sessions) / len(sessions)
    if workload["family"] in ("long", "very_long"):
        tokens = workload.get("context_tokens", {"long": 8000, "very_long": 32000}[workload["family"]])
    return prompts, tokens, turns


@lru_cache(maxsize=1024)
def _tau(prompts: tuple, decoding: Decoding, sim_json: str, max_new_tokens: int, dummy: bool) -> float:
    """Predicted tokens per round: 1 for AR, and with dummy weights for every drafter model (their proposals are
    never the target's choice); NGRAM with dummy weights drafts from the random model's looping output."""
    if not decoding.spec.speculative or dummy and decoding.spec.drafting != "lookup":
        return 1.0
    sim = json.loads(sim_json)
    profile_set = profiles(sim.get("profiles"))
    return mean_tau(
        list(prompts),
        decoding,
        rounds=60,
        acceptance=sim.get("acceptance") or None,
        max_new_tokens=max_new_tokens,
        profile_set=profile_set,
        looping=dummy,
        family=model_drafter_family(profile_set, sim.get("model_profile", "qwen3-8b")),  # the target's drafters
    )


BACKEND_NOTE = {
    "sim": " - simulated backend",
    "external": " - servers at the methods' URLs, run by someone else: specsweep starts and stops none, and this plan "
    "does not price start-ups (the cells' times assume each server's speed as the cost model predicts it)",
}


def clock_scale(config: dict) -> float:
    """How many times fast the servers' clock runs: the simulated backend's sim.time_scale (1 on SGLang)."""
    return config["sim"]["time_scale"] if config["backend"] == "sim" else 1.0


def startup_seconds(config: dict, tp: int) -> tuple[float, float]:
    """Predicted server start-up (cold: the first server on a host; warm: a later one), each with the job's own
    start: the simulator's configured delay; on SGLang the TP size's calibrated start-ups, else for both weights
    read from disk (none with dummy weights) + initialisation and CUDA-graph capture (the runtime profile's
    startup_seconds where measured); on external servers (specsweep starts none) the job's own start only."""
    if config["backend"] == "external":
        return JOB_OVERHEAD_SECONDS, JOB_OVERHEAD_SECONDS
    if config["backend"] == "sim":
        seconds = config["sim"]["startup_seconds"] / clock_scale(config) + JOB_OVERHEAD_SECONDS
        return seconds, seconds
    measured = choose.of(config, tp)["startup"]
    if measured:
        return measured["cold_s"] + JOB_OVERHEAD_SECONDS, measured["warm_s"] + JOB_OVERHEAD_SECONDS
    sim = choose.sim_settings(config, tp)
    p = profiles(sim["profiles"])
    model, runtime = p["models"][sim["model_profile"]], p["runtimes"][sim["runtime"]]
    weights = 0.0 if config["model"].get("load_format") == "dummy" else model["weight_bytes"] / DISK_BYTES_PER_SECOND
    seconds = weights + runtime.get("startup_seconds", SGLANG_INIT_SECONDS) + JOB_OVERHEAD_SECONDS
    return seconds, seconds


def startup_text(config: dict, tp: int) -> str:
    """Where a TP size's predicted start-ups come from, for plan.md."""
    cold, warm = startup_seconds(config, tp)
    job = f"{JOB_OVERHEAD_SECONDS:g} s of job start included"
    if config["backend"] == "external":
        return f"not priced: backend external starts no server (only {job})"
    if config["backend"] == "sim":
        return f"simulated: {cold:.1f} s for every server (sim.startup_seconds on the servers' clock; {job})"
    if choose.of(config, tp)["startup"]:
        return f"measured: cold {cold:.0f} s (the first server on each host), warm {warm:.0f} s (later ones; {job})"
    return f"not measured: {cold:.0f} s for every server, cold or warm (weights, initialisation; {job})"


def cell_seconds(
    config: dict, tp: int, method: Method, workload: dict, concurrency: int, requests: int, sessions: list | None = None
) -> float:
    """Predicted time of ``requests`` sessions of a workload at a concurrency: rounds of (request latency + prefill
    + decode steps), on the servers' clock (a simulated clock run ``sim.time_scale`` times fast takes that many
    times less).

    ``sessions``, the workload's sessions where they are built already (a server job), spare building a sample.
    """
    sim = choose.sim_settings(config, tp)
    cost = CostModel.named(
        sim["gpu"], sim["model_profile"], sim["runtime"], tp, sim["profiles"], sim.get("draft_model_profile")
    )
    prompts, prompt_tokens, turns = (
        _sample_of(workload, sessions)
        if sessions
        else _workload_sample(json.dumps(workload, sort_keys=True), config["seed"], config["model"].get("path"))
    )
    decoding = method.decoding
    tau = _tau(
        prompts,
        decoding,
        json.dumps(
            {
                **{k: config["sim"].get(k) or {} for k in ("acceptance", "profiles")},
                "model_profile": config["sim"].get("model_profile") or "qwen3-8b",
            },
            sort_keys=True,
        ),
        workload["max_new_tokens"],
        config["model"].get("load_format") == "dummy",
    )
    output = workload["max_new_tokens"] * (1.0 if config["sampling"].get("ignore_eos") else OUTPUT_SHARE)
    batch = max(1, min(concurrency, requests))
    context = int(prompt_tokens + output / 2)
    step = cost.decode_step(decoding, [context] * batch)
    prefill = cost.request_latency(prompt_tokens) + cost.prefill(prompt_tokens, decoding=decoding)
    per_turn = prefill + math.ceil(output / tau) * step
    rounds = math.ceil(requests / batch)
    seconds = rounds * turns * per_turn / clock_scale(config)
    if workload.get("source") == "trace":  # open loop at the trace's times: at least until its last send
        seconds = max(
            seconds, trace_span(workload, requests, config["model"]["context_length"]) + per_turn / clock_scale(config)
        )
    return seconds


def predict(config: dict, memo_dir: str | None = None) -> list[dict]:
    """One row per cell with its predicted seconds (warm-up + measurement), and per server its start-up.

    With ``memo_dir`` (the cell cache's folder) the rows are kept in {memo_dir}/plan/{digest}.json, the digest
    being that of the configuration less ``report`` and of the package's code and data: every Snakemake
    invocation orders its server jobs by these predictions, and a later invocation of the same plan (a rerun, a
    dry run, the predictions job) reads them back instead of predicting again. A memo that cannot be written is
    skipped."""
    memo = None
    if memo_dir:
        measured = {k: v for k, v in config.items() if k not in NOT_PRICED}
        key = digest({"config": measured, "code": _code_digest()})
        memo = Path(plan_memo_path(memo_dir, key))
        try:
            return json.loads(memo.read_text())
        except (OSError, ValueError):
            pass
    rows = [
        row
        for server in servers(config)
        for row in predict_server(config, server["tp"], server["method"], server["repetition"])
    ]
    if memo is not None:
        try:
            atomic_write_json(memo, rows)
        except (OSError, ValueError):
            pass
    return rows


NOT_PRICED = ("report", "failures", "remeasure", "confirm_plan_hours", "slo")  # keys no predicted second depends on


@lru_cache(maxsize=1)
def _code_digest() -> str:
    """Digest of the package's code and data files (what predict depends on besides the configuration)."""
    root = Path(__file__).parent
    return package_digest(
        *sorted(
            str(p.relative_to(root))
            for p in root.rglob("*")
            if p.suffix in (".py", ".yaml", ".json", ".txt") and "__pycache__" not in p.parts
        )
    )


def _warmup_seconds(config: dict, tp: int, method: Method, workload: dict, concurrency: int, sessions) -> float:
    """Predicted time of a cell's warm-up: its ``warmup`` sessions, then the sessions filling its wave
    (workloads.warmup_fill), each of at most WARMUP_FILL_TOKENS tokens; priced one after the other (they run
    together: an upper bound)."""
    if not config["warmup"]:
        return 0.0
    seconds = cell_seconds(config, tp, method, workload, concurrency, config["warmup"], sessions)
    fill = warmup_fill(config["warmup"], concurrency, workload)
    if fill:
        capped = dict(workload, max_new_tokens=min(workload["max_new_tokens"], WARMUP_FILL_TOKENS))
        seconds += cell_seconds(config, tp, method, capped, concurrency, fill, sessions)
    return seconds


def predict_server(
    config: dict, tp: int, method_name: str, repetition: int | None = None, sessions: dict | None = None
) -> list[dict]:
    """The predicted rows of one server's cells (see predict); its first row carries the start-ups, cold and warm
    (``scheduled`` says which one it pays). ``sessions`` ({workload name: built sessions}) where a server job has
    them already."""
    method = next(m for m in expand_methods(config) if m.name == method_name)
    workloads = {w["name"]: w for w in config["workloads"]}
    priced = engines.view(config, method.engine)  # its engine's build and cost model (configuration engines)
    cold, warm = startup_seconds(priced, tp)
    rows = []
    for i, cell in enumerate(cells_of_server(config, tp, method.name, repetition)):
        w = workloads[cell["workload"]]
        built = (sessions or {}).get(w["name"])
        warmup = _warmup_seconds(priced, tp, method, w, cell["concurrency"], built)
        measure = cell_seconds(priced, tp, method, w, cell["concurrency"], cell["requests"], built)
        rows.append(
            {
                "server": server_name(tp, method.name, repetition),
                "tp": tp,
                "method": method.name,
                "repetition": repetition,
                "workload": cell["workload"],
                "concurrency": cell["concurrency"],
                "requests": cell["requests"],
                "path": cell["path"],
                "cold_startup_s": cold if i == 0 else 0.0,
                "warm_startup_s": warm if i == 0 else 0.0,
                "warmup_s": warmup,
                "measure_s": measure,
            }
        )
    return rows


class ServerCost(NamedTuple):
    """A server's predicted cost: its TP size, its seconds with a warm start-up, what a cold one adds, and how long
    a cold one takes (the host is warm once it is over)."""

    tp: int
    seconds: float
    cold_extra_s: float = 0.0
    cold_startup_s: float = 0.0


def server_durations(rows: list[dict]) -> dict[str, ServerCost]:
    """{server: ServerCost} from cell rows: start-up plus the cells not cached; a server whose cells are all cached
    is never started and costs nothing."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r["server"], []).append(r)
    out = {}
    for server, cells in groups.items():
        todo = [r for r in cells if not r.get("cached")]
        cold, warm = (sum(r[k] for r in cells) if todo else 0.0 for k in ("cold_startup_s", "warm_startup_s"))
        out[server] = ServerCost(
            cells[0]["tp"], warm + sum(r["warmup_s"] + r["measure_s"] for r in todo), cold - warm, cold
        )
    return out


def gpus_per_host(config: dict, gpus: int) -> int:
    """GPUs per host the plan packs onto: on SGLang as many as the calibrations' host had (their fingerprints'
    gpu_count), else all of them on one host."""
    counts = [choose.of(config, tp)["gpu_count"] for tp in config["tp"]]
    known = [c for c in counts if isinstance(c, int) and c > 0]
    return min(max(known), gpus) if config["backend"] == "sglang" and known and gpus else gpus


ORDERS = {
    "longest first": lambda d: (-d[1],),
    "widest first, then longest": lambda d: (-d[0], -d[1]),
    "largest GPU-time first": lambda d: (-d[0] * d[1],),
}


def pack(durations: Mapping[str, tuple], gpus: int, exclusive: bool = False, host_gpus: int | None = None) -> dict:
    """List scheduling of servers ({server: ServerCost or (tp, seconds)}) onto ``gpus`` GPUs, in hosts of
    ``host_gpus`` (default: one host), in the best of a few orders (longest first, widest first, largest GPU-time
    first): start times, which servers start cold, makespan and its lower bound."""
    best: dict = {}
    for name, key in ORDERS.items():
        order = sorted(durations, key=lambda s: key(durations[s]))
        result = _schedule(durations, order, gpus, exclusive, min(host_gpus or gpus, gpus))
        if not best or result["makespan_s"] < best["makespan_s"] - 1e-9:
            best = {**result, "heuristic": name}
    return best


def _schedule(durations: Mapping[str, tuple], order: list[str], gpus: int, exclusive: bool, host_gpus: int) -> dict:
    """Each server in turn on the GPUs that free first: those of one host where it fits on one (the host where it
    starts soonest), else the earliest of all. It starts cold where no server of its hosts has finished starting
    (their compiled kernels are not there yet) and warm on a host where one has."""
    costs = {server: ServerCost(*durations[server]) for server in durations}
    free_at = [0.0] * gpus  # when each GPU becomes free
    hosts = [list(range(h, min(h + host_gpus, gpus))) for h in range(0, gpus, host_gpus)] if gpus else []
    warm_from = [math.inf] * len(hosts)  # when a server on each host has finished starting
    starts: dict[str, float] = {}
    cold: dict[str, bool] = {}
    seconds: dict[str, float] = {}
    for server in order:
        cost = costs[server]
        need = gpus if exclusive else cost.tp
        if cost.seconds == 0:
            starts[server], cold[server], seconds[server] = 0.0, False, 0.0
            continue
        groups = [h for h in hosts if len(h) >= need] or [list(range(gpus))]
        slots = min(
            (sorted(h, key=lambda g: free_at[g])[:need] for h in groups), key=lambda s: max(free_at[g] for g in s)
        )
        start = max(free_at[g] for g in slots)
        touched = {g // host_gpus for g in slots}
        cold[server] = any(start < warm_from[h] for h in touched)
        seconds[server] = cost.seconds + (cost.cold_extra_s if cold[server] else 0.0)
        for h in touched:
            if start < warm_from[h]:
                warm_from[h] = min(warm_from[h], start + cost.cold_startup_s)
        for g in slots:
            free_at[g] = start + seconds[server]
        starts[server] = start
    makespan = max(free_at) if durations else 0.0
    width = {server: gpus if exclusive else cost.tp for server, cost in costs.items()}
    warm_gpu_seconds = sum(width[s] * cost.seconds for s, cost in costs.items())
    # any schedule starts one server cold at least, and no server takes less than its warm duration
    first = min((width[s] * cost.cold_extra_s for s, cost in costs.items() if cost.seconds), default=0.0)
    bound = max(
        (warm_gpu_seconds + first) / gpus if gpus else 0.0,
        max((cost.seconds for cost in costs.values()), default=0.0),
        min((cost.seconds + cost.cold_extra_s for cost in costs.values() if cost.seconds), default=0.0),
    )
    order = sorted(starts, key=lambda s: (starts[s], order.index(s)))
    return {
        "order": order,
        "starts": starts,
        "cold": cold,
        "seconds": seconds,
        "makespan_s": makespan,
        "lower_bound_s": bound,
        "gpu_seconds": sum(costs[s].tp * seconds[s] for s in seconds),
    }


def priorities(
    durations: Mapping[str, tuple], gpus: int, exclusive: bool = False, host_gpus: int | None = None
) -> dict[str, int]:
    """Snakemake priorities that start servers in the plan's packing order."""
    order = pack(durations, gpus, exclusive, host_gpus)["order"]
    return {server: len(order) - i for i, server in enumerate(order)}


def scheduled(rows: list[dict], packing: dict) -> list[dict]:
    """The rows with the start-up each server pays in the packing (``startup_s``: cold or warm, on its first row;
    none for a server never started, its cells all cached) and whether it starts cold (``cold_start``)."""
    out = []
    for r in rows:
        is_cold = bool(packing["cold"].get(r["server"]))
        startup = r["cold_startup_s"] if is_cold else r["warm_startup_s"]
        started = packing["seconds"].get(r["server"], 1.0) > 0
        out.append({**r, "startup_s": startup if started else 0.0, "cold_start": is_cold})
    return out


def mark_cached(config: dict, rows: list[dict], environment: dict | None) -> bool:
    """Mark cells already in the cell cache (needs the probed environment); False when it cannot tell."""
    if environment is None or not Path(config["cache_dir"]).is_dir() or not any(Path(config["cache_dir"]).iterdir()):
        return environment is not None
    cache = CellCache(config["cache_dir"])
    sessions = cell_sessions(
        config["workloads"],
        rows,
        config["seed"],
        config["sampling"]["thinking"],
        config["model"].get("path"),
        config["model"]["context_length"],
    )
    for r in rows:
        job = server_job(config, r["tp"], r["method"], r["repetition"])
        cell = {
            "workload": r["workload"],
            "concurrency": r["concurrency"],
            "repetition": r["repetition"] or 0,
            "requests": r["requests"],
        }
        r["cached"] = (
            cache.get(cell_key(job, cell, cell_digest(sessions, cell), identity_digest(environment, job))) is not None
        )
    return True


def packed(config: dict, rows: list[dict], gpus: int) -> tuple[list[dict], dict]:
    """(the rows with the start-up each server pays, the packing) of a configuration's predicted rows on ``gpus``
    GPUs (see pack, scheduled)."""
    packing = pack(server_durations(rows), gpus, config["gpu_pool"]["exclusive"], gpus_per_host(config, gpus))
    return scheduled(rows, packing), packing


def write_predictions(config: dict, out_csv: str, gpus: int) -> None:
    """The predicted rows of every cell (see predict), each server's start-up as the packing on ``gpus`` GPUs
    starts it (cold or warm), as CSV: what the report compares each server's run with. Imported here: pandas (a
    second and more to load, and every Snakemake process of a run imports this module for its prices)."""
    import pandas as pd

    rows, _ = packed(config, predict(config, config["cache_dir"]), gpus)
    atomic_write_text(out_csv, pd.DataFrame(rows, columns=PREDICTION_COLUMNS).to_csv(index=False))


PREDICTION_COLUMNS = [
    "server",
    "tp",
    "method",
    "repetition",
    "workload",
    "concurrency",
    "requests",
    "path",
    "startup_s",
    "cold_start",
    "cold_startup_s",
    "warm_startup_s",
    "warmup_s",
    "measure_s",
]


def write_plan(
    config: dict, environment: dict | None, gpus: int, out_md: str, out_csv: str, gpus_from: str = ""
) -> dict:
    """plan.csv (one row per cell) and plan.md (totals, packing, per-server table, assumptions); ``gpus_from``: where
    the number of GPUs comes from (gpus.plan_gpus), said beside it. Imported here: pandas (see write_predictions)."""
    import pandas as pd

    rows = predict(config, config["cache_dir"])
    known = mark_cached(config, rows, environment)
    rows, packing = packed(config, rows, gpus)
    frame = pd.DataFrame(rows)
    frame["cached"] = frame.get("cached", False)
    atomic_write_text(out_csv, frame.to_csv(index=False))
    hours = packing["gpu_seconds"] / 3600
    lines = [
        f"# Plan: {len(packing['order'])} servers, {len(rows)} cells",
        "",
        f"- backend: {config['backend']}" + BACKEND_NOTE.get(config["backend"], ""),
        *cost_model_lines(config),
        *bound_line(plan_bound(config, config["cache_dir"])),
        f"- cells already cached: {int(frame['cached'].sum())} of {len(rows)}"
        + (
            ""
            if known
            else " (environment not probed yet: run `snakemake results/env/"
            f"{config['backend']}.json` to check the cache)"
        ),
        f"- GPU-hours: {hours:.2f} (sum over servers of TP x predicted duration)",
        *budget_lines(config, rows),
        f"- GPUs: {gpus}"
        + (" (all servers serialised: gpu_pool.exclusive)" if config["gpu_pool"]["exclusive"] else "")
        + (f", on hosts of {gpus_per_host(config, gpus)}" if gpus_per_host(config, gpus) < gpus else "")
        + (f" ({gpus_from})" if gpus_from else ""),
        calibration_line(config),
        f"- predicted makespan: {packing['makespan_s'] / 3600:.2f} h ({packing['makespan_s']:.0f} s), order: "
        f"{packing['heuristic']}; "
        f"lower bound {packing['lower_bound_s'] / 3600:.2f} h "
        f"(ratio {packing['makespan_s'] / packing['lower_bound_s'] if packing['lower_bound_s'] else 1:.3f})",
        "",
        "| start order | server | TP | predicted duration (s) | predicted start (s) | cells cached | start-up |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, server in enumerate(packing["order"], start=1):
        seconds = packing["seconds"][server]
        cells = frame[frame["server"] == server]
        cached = cells["cached"]
        first = cells.iloc[0]
        kind = ("cold " if packing["cold"][server] else "warm ") if first.cold_startup_s != first.warm_startup_s else ""
        startup = f"{kind}{cells['startup_s'].sum():.0f} s" if seconds else "none (all cached)"
        lines.append(
            f"| {i} | {server} | {int(cells['tp'].iloc[0])} | {seconds:.0f} | {packing['starts'][server]:.0f} | "
            f"{int(cached.sum())}/{len(cached)} | {startup} |"
        )
    lines += ["", "Assumptions: " + " ".join(__doc__.split("Assumptions (stated in plan.md): ")[1].split())]
    atomic_write_text(out_md, "\n".join(lines) + "\n")
    return {"servers": len(packing["order"]), "cells": len(rows), "gpu_hours": hours, **packing}


def cold_hours(rows: list[dict]) -> dict[tuple, float]:
    """GPU-hours of the predicted rows by (TP, engine), every server started cold: the sum over its servers of TP x
    (cold start-up + every cell's warm-up and measurement), / 3600 (cached or not: what the plan would cost from
    nothing)."""
    out: dict[tuple, float] = {}
    for r in rows:
        group = (r["tp"], engines.split(r["method"])[1])
        out[group] = out.get(group, 0.0) + r["tp"] * (r["cold_startup_s"] + r["warmup_s"] + r["measure_s"]) / 3600
    return out


def plan_bound(config: dict, memo_dir: str | None = None) -> dict | None:
    """The plan against the same plan with no calibration (choose.uncalibrated), in cold_hours: {"hours",
    "uncalibrated_hours", "ratio", "over": [{tp, engine, calibration, hours, uncalibrated_hours}, ...] (the TP sizes
    and engines whose calibration makes them more than PLAN_BOUND times dearer), "allowed" (the ratio within
    PLAN_BOUND, or confirm_plan_hours at least the plan's hours), "problem" (why a run is refused, naming the
    calibration files and the key; None when allowed)}; None when no calibration prices the plan."""
    views = {None: config} | {e: engines.view(config, e) for e in engines.names(config)}
    files = {(tp, e): choose.of(v, tp)["calibration"] for e, v in views.items() for tp in config["tp"]}
    if not any(files.values()):
        return None
    calibrated, uncalibrated = (cold_hours(predict(c, memo_dir)) for c in (config, choose.uncalibrated(config)))
    hours, base = sum(calibrated.values()), sum(uncalibrated.values())
    ratio = hours / base if base else 1.0
    over = [
        {"tp": tp, "engine": e, "calibration": files[(tp, e)], "hours": h, "uncalibrated_hours": uncalibrated[(tp, e)]}
        for (tp, e), h in calibrated.items()
        if files.get((tp, e)) and h > PLAN_BOUND * uncalibrated[(tp, e)]
    ]
    confirmed = config.get("confirm_plan_hours")
    allowed = ratio <= PLAN_BOUND or (confirmed is not None and confirmed >= hours)
    problem = None
    if not allowed:
        named = "; ".join(
            f"TP {o['tp']}" + (f" (engine {o['engine']})" if o["engine"] else "") + f": priced by {o['calibration']}, "
            f"{_hours(o['hours'])} GPU-hours against {_hours(o['uncalibrated_hours'])}"
            for o in over
        )
        problem = (
            f"the plan is {_hours(hours)} GPU-hours (every server started cold), {ratio:,.0f} times the "
            f"{_hours(base)} of the same plan without calibration, past the bound of {PLAN_BOUND:g} times ({named}): "
            f"check that calibration (`snakemake calibrate` measures it again, `snakemake plan` prices it), or set "
            f"confirm_plan_hours: {math.ceil(hours)} to run this plan"
        )
    return {
        "hours": hours,
        "uncalibrated_hours": base,
        "ratio": ratio,
        "over": over,
        "allowed": allowed,
        "problem": problem,
    }


def _hours(value: float) -> str:
    return f"{value:,.2f}" if value >= 1 else f"{value:.2g}"


def bound_line(bound: dict | None) -> list[str]:
    """plan.md's line on the plan bound (none without a calibration)."""
    if bound is None:
        return []
    line = (
        f"- plan bound: {_hours(bound['hours'])} GPU-hours with every server started cold, {bound['ratio']:.2f} "
        f"times the same plan without calibration ({_hours(bound['uncalibrated_hours'])}); a run past "
        f"{PLAN_BOUND:g} times is refused unless confirm_plan_hours allows it"
    )
    if bound["problem"]:
        line += f". A run is refused: {bound['problem']}"
    return [line]


def calibration_line(config: dict) -> str:
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


def cost_model_lines(config: dict) -> list[str]:
    """plan.md's account of its cost models: per TP size what prices its steps (choose.label, the file and the
    profiles) and its start-ups, then every calibration found and not used, and why."""
    lines = []
    for tp in config["tp"]:
        chosen, sim = choose.of(config, tp), choose.sim_settings(config, tp)
        where = f"{chosen['calibration']}; " if chosen["calibration"] else ""
        lines.append(
            f"- cost model, TP {tp}: {chosen['label']} ({where}{sim['model_profile']} on {sim['gpu']}, "
            f"{sim['runtime']} runtime)"
        )
        lines.append(f"- start-up, TP {tp}: {startup_text(config, tp)}")
    ignored = (config.get("cost_model") or {}).get("ignored", [])
    if ignored:
        lines.append("- calibrations not used: " + "; ".join(ignored))
    return lines


def budget_lines(config: dict, rows: list[dict]) -> list[str]:
    """plan.md's budgets (packed rows: each with its start-up): GPU-hours under budget: exhaustive (every session of
    every cell), under budget: verdict as a range, and a lower bound, each the sum over cells of TP x seconds:

    - verdict, most: every speculative cell reaches its cap (nothing decided early, nothing implied);
    - verdict, least: each speculative cell stops at the first look whose sessions its interval needs at the cost
      model's predicted speedup over AR's cell and a predicted per-session spread (sequential.stopping_sessions),
      priced as that share of its sessions (the sessions under way when it decides are aborted, not waited for;
      approximately: a look waits for the slowest of its sessions, so where it counts no more sessions than the
      concurrency the cell still pays about one session's whole time),
      and the cells the implied-slower rule skips where the cost model predicts slower from a concurrency up to the
      highest (specsweep.implied) cost nothing;
    - lower bound: every server's start-up, AR's cells in full, and each speculative cell not predicted implied only
      the sessions its interval needs (sequential.sessions_needed at the whole alpha, at least MIN_SESSIONS)."""
    settings = config.get("verdict_stopping") or {}
    level = float(settings.get("level", sequential.DEFAULTS["level"]))
    equivalence = float(settings.get("equivalence", sequential.DEFAULTS["equivalence"]))
    baseline = {m.name for m in expand_methods(config) if not m.spec.speculative}
    ar = {(r["tp"], r["workload"], r["concurrency"]): r["measure_s"] for r in rows if r["method"] in baseline}
    fixed = sum(r["tp"] * (r["startup_s"] + r["warmup_s"]) for r in rows)
    fixed += sum(r["tp"] * r["measure_s"] for r in rows if r["method"] in baseline)
    full = least = bound = fixed
    skipped = _predicted_implied(rows, ar)
    for r in rows:
        base = ar.get((r["tp"], r["workload"], r["concurrency"]))
        if r["method"] in baseline:
            continue
        full += r["tp"] * r["measure_s"]
        if not base or not r["measure_s"]:
            least, bound = least + r["tp"] * r["measure_s"], bound + r["tp"] * r["measure_s"]
            continue
        speedup, n = base / r["measure_s"], r["requests"]
        stops = sequential.stopping_sessions(n, speedup, settings, concurrency=r["concurrency"])
        if r["path"] in skipped:
            continue
        least += r["tp"] * r["measure_s"] * stops / n
        needed = min(n, max(MIN_SESSIONS, sequential.sessions_needed(speedup, 1 - level, equivalence)))
        bound += r["tp"] * r["measure_s"] * needed / n
    chosen = config.get("budget", "exhaustive")
    return [
        f"- budget (`budget: {chosen}`): exhaustive {_hours(full / 3600)} GPU-hours; verdict {_hours(least / 3600)} "
        f"to {_hours(full / 3600)} GPU-hours (at the least: each cell stops at the first look its predicted speedup "
        f"and a per-session spread of {sequential.SESSION_SPREAD} decide, and the cells the cost model predicts "
        f"{implied.IMPLIED_SLOWER.removeprefix('not measured: ')} cost nothing; at the most: every cell to its cap); "
        f"lower bound {_hours(bound / 3600)} GPU-hours (start-ups, AR's cells, and the sessions each interval needs)"
    ]


def _predicted_implied(rows: list[dict], ar: dict) -> set[str]:
    """The cell paths implied.next_concurrency would skip if every cell were decided as the cost model predicts it
    (slower where its predicted speedup is below 1)."""
    groups: dict = {}
    for r in rows:
        base = ar.get((r["tp"], r["workload"], r["concurrency"]))
        if base and r["measure_s"]:
            groups.setdefault((r["tp"], r["method"], r["workload"]), {})[r["concurrency"]] = (base / r["measure_s"], r)
    out = set()
    for cells in groups.values():
        predicted = {c: s for c, (s, _) in cells.items()}
        decisions: dict = {}
        while True:
            nxt, skipped = implied.next_concurrency(list(cells), decisions, predicted)
            if nxt is None:
                break
            decisions[nxt] = "slower" if predicted[nxt] < 1 else "faster"
        out |= {cells[c][1]["path"] for c in skipped}
    return out


def uncertainty(rows: list[dict], config: dict) -> dict[str, float]:
    """Per speculative server: the predicted GPU-seconds its cells spend before they decide under budget: verdict
    (each cell's predicted seconds x the share of its sessions sequential.stopping_sessions predicts it needs at its
    predicted speedup over AR's cell), over its cells' predicted seconds: 1 where no cell is predicted to decide
    before its cap, small where every cell decides at its first look."""
    settings = config.get("verdict_stopping") or {}
    baseline = {m.name for m in expand_methods(config) if not m.spec.speculative}
    ar = {(r["tp"], r["workload"], r["concurrency"]): r["measure_s"] for r in rows if r["method"] in baseline}
    spent: dict[str, list[float]] = {}
    for r in rows:
        base = ar.get((r["tp"], r["workload"], r["concurrency"]))
        if r["method"] in baseline or not base or not r["measure_s"]:
            continue
        stops = sequential.stopping_sessions(
            r["requests"], base / r["measure_s"], settings, concurrency=r["concurrency"]
        )
        share = stops / r["requests"]
        part = spent.setdefault(r["server"], [0.0, 0.0])
        part[0] += r["measure_s"] * share
        part[1] += r["measure_s"]
    return {server: a / b if b else 1.0 for server, (a, b) in spent.items()}


def verdict_priorities(rows: list[dict], config: dict, packing: Mapping[str, int]) -> dict[str, int]:
    """Snakemake priorities under budget: verdict: AR's servers first (every other cell decides against theirs),
    then the speculative servers whose verdicts are most uncertain by the plan's prediction (uncertainty), ties in
    the plan's packing order (``packing``: priorities), so that a run cut short has decided the cells the plan could
    not call."""
    score = uncertainty(rows, config)
    servers = sorted({r["server"] for r in rows}, key=lambda s: (s in score, -score.get(s, 0.0), -packing.get(s, 0)))
    return {server: len(servers) - i for i, server in enumerate(servers)}
