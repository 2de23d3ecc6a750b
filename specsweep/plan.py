"""The plan: what a configuration costs before it runs, and the order servers start in.

Each server's duration is predicted with the simulator's cost and acceptance
model for the configured hardware and model profile (``sim.gpu``,
``sim.model_profile``): start-up (model load), then per cell the warm-up and
the measured requests at the cell's concurrency. Servers are packed onto the
GPUs longest first (the order the workflow uses, through job priorities);
the plan reports the predicted makespan against the lower bound
max(total GPU-seconds / GPUs, longest server).

Assumptions (stated in plan.md): outputs stop at 65% of max_new_tokens on
average (all of it with sampling.ignore_eos); a drafter with dummy weights
(model.load_format: dummy) is accepted no further than its bonus token, while
NGRAM drafts from the random model's output, a loop of its first three tokens;
SGLang start-up = weights read at 2 GB/s (none with dummy weights) + 60 s of
initialisation and CUDA-graph capture (the runtime profile's startup_seconds
where it was measured); 3 s per server job for its own start; no overlap
between a server's cells.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path

from .cache import CellCache
from .canon import atomic_write_json, atomic_write_text, digest, package_digest
from .cells import cell_digest, cell_key, cell_sessions
from .jobs import cells_of_server, server_job, servers
from .methods import expand_methods
from .layout import plan_memo_path, server_name
from .sim.calibration import mean_tau
from .sim.model import CostModel, Decoding, profiles
from .text import chat_prompt
from .workloads import build

OUTPUT_SHARE = 0.65
SGLANG_INIT_SECONDS = 60.0
JOB_OVERHEAD_SECONDS = 3.0  # a server job's own start: interpreter, imports, server process, readiness polls
DISK_BYTES_PER_SECOND = 2e9


def method_decoding(method) -> Decoding:
    """How the simulator decodes for a configured method (its algorithm and parameters, flags and env)."""
    if method.algorithm == "ar":
        return Decoding("ar")
    return Decoding.of_params(
        method.algorithm, method.params, "--disable-overlap-schedule" not in method.flags, method.env
    )


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
    if decoding.algorithm == "ar" or dummy and decoding.spec.drafting != "lookup":
        return 1.0
    sim = json.loads(sim_json)
    return mean_tau(
        list(prompts),
        decoding,
        rounds=60,
        acceptance=sim.get("acceptance") or None,
        max_new_tokens=max_new_tokens,
        profile_set=profiles(sim.get("profiles")),
        looping=dummy,
    )


def clock_scale(config: dict) -> float:
    """How many times fast the servers' clock runs: the simulated backend's sim.time_scale (1 on SGLang)."""
    return config["sim"]["time_scale"] if config["backend"] == "sim" else 1.0


def startup_seconds(config: dict, tp: int) -> float:
    """Predicted server start-up: the simulator's configured delay, or weights read from disk (none with dummy
    weights) + initialisation and CUDA-graph capture (the runtime profile's startup_seconds where measured)."""
    if config["backend"] == "sim":
        return config["sim"]["startup_seconds"] / clock_scale(config) + JOB_OVERHEAD_SECONDS
    p = profiles(config["sim"]["profiles"])
    model, runtime = p["models"][config["sim"]["model_profile"]], p["runtimes"][config["sim"]["runtime"]]
    weights = 0.0 if config["model"].get("load_format") == "dummy" else model["weight_bytes"] / DISK_BYTES_PER_SECOND
    return weights + runtime.get("startup_seconds", SGLANG_INIT_SECONDS) + JOB_OVERHEAD_SECONDS


def cell_seconds(
    config: dict, tp: int, method, workload: dict, concurrency: int, requests: int, sessions: list | None = None
) -> float:
    """Predicted time of ``requests`` sessions of a workload at a concurrency: rounds of (prefill + decode steps),
    on the servers' clock (a simulated clock run ``sim.time_scale`` times fast takes that many times less).

    ``sessions``, the workload's sessions where they are built already (a server job), spare building a sample.
    """
    sim = config["sim"]
    cost = CostModel.named(
        sim["gpu"], sim["model_profile"], sim["runtime"], tp, sim["profiles"], sim.get("draft_model_profile")
    )
    prompts, prompt_tokens, turns = (
        _sample_of(workload, sessions)
        if sessions
        else _workload_sample(json.dumps(workload, sort_keys=True), config["seed"], config["model"].get("path"))
    )
    decoding = method_decoding(method)
    tau = _tau(
        prompts,
        decoding,
        json.dumps({k: sim.get(k) or {} for k in ("acceptance", "profiles")}, sort_keys=True),
        workload["max_new_tokens"],
        config["model"].get("load_format") == "dummy",
    )
    output = workload["max_new_tokens"] * (1.0 if config["sampling"].get("ignore_eos") else OUTPUT_SHARE)
    batch = max(1, min(concurrency, requests))
    context = int(prompt_tokens + output / 2)
    step = cost.decode_step(decoding, [context] * batch)
    per_turn = cost.prefill(prompt_tokens) + math.ceil(output / tau) * step
    rounds = math.ceil(requests / batch)
    return rounds * turns * per_turn / clock_scale(config)


def predict(config: dict, memo_dir: str | None = None) -> list[dict]:
    """One row per cell with its predicted seconds (warm-up + measurement), and per server its start-up.

    With ``memo_dir`` (the cell cache's folder) the rows are kept in {memo_dir}/plan/{digest}.json, the digest
    being that of the configuration less ``report`` and of the package's code and data: every Snakemake
    invocation orders its server jobs by these predictions, and a later invocation of the same plan (a rerun, a
    dry run, the predictions job) reads them back instead of predicting again. A memo that cannot be written is
    skipped."""
    memo = None
    if memo_dir:
        measured = {k: v for k, v in config.items() if k not in ("report", "failures", "remeasure")}
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


def predict_server(
    config: dict, tp: int, method_name: str, repetition: int | None = None, sessions: dict | None = None
) -> list[dict]:
    """The predicted rows of one server's cells (see predict); its first row carries the start-up.
    ``sessions`` ({workload name: built sessions}) where a server job has them already."""
    method = next(m for m in expand_methods(config) if m.name == method_name)
    workloads = {w["name"]: w for w in config["workloads"]}
    start = startup_seconds(config, tp)
    rows = []
    for i, cell in enumerate(cells_of_server(config, tp, method.name, repetition)):
        w = workloads[cell["workload"]]
        built = (sessions or {}).get(w["name"])
        warm = (
            cell_seconds(config, tp, method, w, cell["concurrency"], config["warmup"], built)
            if config["warmup"]
            else 0.0
        )
        measure = cell_seconds(config, tp, method, w, cell["concurrency"], cell["requests"], built)
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
                "startup_s": start if i == 0 else 0.0,
                "warmup_s": warm,
                "measure_s": measure,
            }
        )
    return rows


def server_durations(rows: list[dict]) -> dict[str, tuple[int, float]]:
    """{server: (tp, predicted seconds)} from cell rows: start-up plus the cells not cached; a server whose
    cells are all cached is never started and costs nothing."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r["server"], []).append(r)
    out = {}
    for server, cells in groups.items():
        todo = [r for r in cells if not r.get("cached")]
        startup = sum(r["startup_s"] for r in cells) if todo else 0.0
        out[server] = (cells[0]["tp"], startup + sum(r["warmup_s"] + r["measure_s"] for r in todo))
    return out


ORDERS = {
    "longest first": lambda d: (-d[1],),
    "widest first, then longest": lambda d: (-d[0], -d[1]),
    "largest GPU-time first": lambda d: (-d[0] * d[1],),
}


def pack(durations: dict[str, tuple[int, float]], gpus: int, exclusive: bool = False) -> dict:
    """List scheduling of servers onto ``gpus`` GPUs in the best of a few orders (longest first, widest first,
    largest GPU-time first): start times, makespan and its lower bound."""
    best: dict = {}
    for name, key in ORDERS.items():
        order = sorted(durations, key=lambda s: key(durations[s]))
        result = _schedule(durations, order, gpus, exclusive)
        if not best or result["makespan_s"] < best["makespan_s"] - 1e-9:
            best = {**result, "heuristic": name}
    return best


def _schedule(durations: dict, order: list[str], gpus: int, exclusive: bool) -> dict:
    free_at = [0.0] * gpus  # when each GPU becomes free
    starts = {}
    for server in order:
        tp, seconds = durations[server]
        need = gpus if exclusive else tp
        if seconds == 0:
            starts[server] = 0.0
            continue
        slots = sorted(range(gpus), key=lambda g: free_at[g])[:need]
        start = max(free_at[g] for g in slots)
        for g in slots:
            free_at[g] = start + seconds
        starts[server] = start
    makespan = max(free_at) if durations else 0.0
    gpu_seconds = sum((gpus if exclusive else tp) * s for tp, s in durations.values())
    bound = max(gpu_seconds / gpus if gpus else 0.0, max((s for _, s in durations.values()), default=0.0))
    order = sorted(starts, key=lambda s: (starts[s], order.index(s)))
    return {
        "order": order,
        "starts": starts,
        "makespan_s": makespan,
        "lower_bound_s": bound,
        "gpu_seconds": sum(tp * s for tp, s in durations.values()),
    }


def priorities(durations: dict[str, tuple[int, float]], gpus: int, exclusive: bool = False) -> dict[str, int]:
    """Snakemake priorities that start servers in the plan's packing order."""
    order = pack(durations, gpus, exclusive)["order"]
    return {server: len(order) - i for i, server in enumerate(order)}


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
            cache.get(cell_key(job, cell, cell_digest(sessions, cell), environment["identity_digest"])) is not None
        )
    return True


def write_predictions(config: dict, out_csv: str) -> None:
    """The predicted rows of every cell (see predict) as CSV: what the report compares each server's run with."""
    import pandas as pd

    atomic_write_text(
        out_csv, pd.DataFrame(predict(config, config["cache_dir"]), columns=PREDICTION_COLUMNS).to_csv(index=False)
    )


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
    "warmup_s",
    "measure_s",
]


def write_plan(config: dict, environment: dict | None, gpus: int, out_md: str, out_csv: str) -> dict:
    """plan.csv (one row per cell) and plan.md (totals, packing, per-server table, assumptions)."""
    import pandas as pd

    rows = predict(config, config["cache_dir"])
    known = mark_cached(config, rows, environment)
    durations = server_durations(rows)
    packing = pack(durations, gpus, config["gpu_pool"]["exclusive"])
    frame = pd.DataFrame(rows)
    frame["cached"] = frame.get("cached", False)
    atomic_write_text(out_csv, frame.to_csv(index=False))
    hours = packing["gpu_seconds"] / 3600
    lines = [
        f"# Plan: {len(durations)} servers, {len(rows)} cells",
        "",
        f"- backend: {config['backend']}; cost model: {config['sim']['model_profile']} on {config['sim']['gpu']} "
        f"({config['sim']['runtime']} runtime)" + (" - simulated backend" if config["backend"] == "sim" else ""),
        f"- cells already cached: {int(frame['cached'].sum())} of {len(rows)}"
        + (
            ""
            if known
            else " (environment not probed yet: run `snakemake results/env/"
            f"{config['backend']}.json` to check the cache)"
        ),
        f"- GPU-hours: {hours:.2f} (sum over servers of TP x predicted duration)",
        f"- GPUs: {gpus}"
        + (" (all servers serialised: gpu_pool.exclusive)" if config["gpu_pool"]["exclusive"] else ""),
        __import__("specsweep.calibrate", fromlist=["plan_line"]).plan_line(config),
        f"- predicted makespan: {packing['makespan_s'] / 3600:.2f} h ({packing['makespan_s']:.0f} s), order: "
        f"{packing['heuristic']}; "
        f"lower bound {packing['lower_bound_s'] / 3600:.2f} h "
        f"(ratio {packing['makespan_s'] / packing['lower_bound_s'] if packing['lower_bound_s'] else 1:.3f})",
        "",
        "| start order | server | TP | predicted duration (s) | predicted start (s) | cells cached |",
        "|---|---|---|---|---|---|",
    ]
    for i, server in enumerate(packing["order"], start=1):
        tp, seconds = durations[server]
        cached = frame[frame["server"] == server]["cached"]
        lines.append(
            f"| {i} | {server} | {tp} | {seconds:.0f} | {packing['starts'][server]:.0f} | "
            f"{int(cached.sum())}/{len(cached)} |"
        )
    lines += ["", "Assumptions: " + " ".join(__doc__.split("Assumptions (stated in plan.md): ")[1].split())]
    atomic_write_text(out_md, "\n".join(lines) + "\n")
    return {"servers": len(durations), "cells": len(rows), "gpu_hours": hours, **packing}
