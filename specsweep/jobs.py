"""Jobs: the server jobs and cells a configuration asks for, and what each server job depends on.

One server job per (tp, method[, repetition]); its cells are every (workload, concurrency) it measures. A
calibration (`snakemake calibrate`) starts a server of each of ``calibration_methods`` per TP.
"""

from __future__ import annotations

import os
import random
from typing import cast

from . import algorithms, engines, external
from .calibration.choose import sim_settings
from .errors import ConfigError
from .layout import cell_path
from .methods import expand_methods
from .modelling.method import Method
from .sections import LoadSection, ModelSection, SamplingSection, ServerSection, SimSection
from .server_job import ServerJob
from .workloads import warmup_fill


def servers(config: dict) -> list[dict]:
    """One row per server job: (tp, method), and the repetition when cells are repeated.

    With repetitions, each repetition is its own server launch, so that the
    order of methods can be randomised per repetition (see method_order).
    """
    reps = range(config["repetitions"]) if config["repetitions"] > 1 else [None]
    return [
        {"tp": tp, "method": m.name, "repetition": r}
        for r in reps
        for tp in config["tp"]
        for m in expand_methods(config)
    ]


def method_order(config: dict, tp: int, repetition: int) -> list[str]:
    """Order in which the methods of one (tp, repetition) run: shuffled by the seed, the same on every run."""
    names = [m.name for m in expand_methods(config)]
    random.Random(f"order:{config['seed']}:{tp}:{repetition}").shuffle(names)
    return names


def server_priority(config: dict, tp: int, method: str, repetition: int | None) -> int:
    """Snakemake priority of a server job: repetitions in order, methods in their shuffled order within one."""
    if repetition is None:
        return 0
    order = method_order(config, tp, repetition)
    return (config["repetitions"] - repetition) * 1000 + (len(order) - order.index(method))


MIN_WAVES = 2  # a closed-loop cell needs this many sessions per slot to hold its concurrency after the first wave


def workload_concurrency(config: dict, workload: dict) -> list[int]:
    """The concurrency levels a workload is measured at: its own list, else the configuration's (both sorted by
    normalise)."""
    return workload.get("concurrency") or config["concurrency"]


def cell_requests(workload: dict, concurrency: int, load: LoadSection) -> int:
    """Sessions a cell sends: the workload's ``requests`` when set, else max(load.min_requests, load.waves x
    concurrency), so that the concurrency is held for several waves of requests (a steady state) at every level."""
    if workload.get("requests"):
        return workload["requests"]
    return max(load["min_requests"], load["waves"] * concurrency)


def cells_of_server(config: dict, tp: int, method: str, repetition: int | None = None) -> list[dict]:
    """Every cell (workload, concurrency) one server job measures, in measurement order, with its session count."""
    return [
        {
            "tp": tp,
            "method": method,
            "workload": w["name"],
            "concurrency": c,
            "repetition": repetition or 0,
            "requests": cell_requests(w, c, config["load"]),
            "path": cell_path(tp, method, w["name"], c, repetition),
        }
        for w in config["workloads"]
        for c in workload_concurrency(config, w)
    ]


def warmup_fills(config: dict) -> bool:
    """Whether some cell's warm-up is filled to one wave of its concurrency (workloads.warmup_fill)."""
    return any(
        warmup_fill(config["warmup"], c, w) for w in config["workloads"] for c in workload_concurrency(config, w)
    )


def all_cells(config: dict) -> list[dict]:
    return [cell for s in servers(config) for cell in cells_of_server(config, s["tp"], s["method"], s["repetition"])]


def simulated_gpus(config: dict) -> int | None:
    """The simulated host's GPU count (sim.gpus) where it is the pool's: on the simulated backend, gpu_pool.devices
    not set; else None."""
    if config["backend"] == "sim" and config["gpu_pool"]["devices"] is None:
        return config["sim"].get("gpus")
    return None


def gpu_pool(config: dict) -> dict:
    """The GPU pool server jobs take GPUs from: ``gpu_pool``, or the simulated host's (simulated_gpus): that many
    devices, their locks under <cache_dir>/gpu-locks unless gpu_pool.lock_dir says where. Simulated GPUs belong to
    the run, not to the machine: another workflow on it (a test, another copy) never waits for them."""
    pool = dict(config["gpu_pool"])
    simulated = simulated_gpus(config)
    if simulated:
        pool["devices"] = simulated
        pool["lock_dir"] = pool["lock_dir"] or os.path.join(config["cache_dir"], "gpu-locks")
    return pool


def server_job(config: dict, tp: int, method_name: str, repetition: int | None = None) -> ServerJob:
    """The ServerJob of one server: everything its bench job depends on (and nothing else)."""
    method = next((m for m in expand_methods(config) if m.name == method_name), None)
    if method is None:
        raise ConfigError(f"no method named '{method_name}' in the configuration")
    config = engines.view(config, method.engine)  # its engine's build (and simulated cost model)
    sim = sim_settings(config, tp) if config["backend"] == "sim" else None
    defined = config.get("ddtree_builds") or {}
    if sim is not None and method.params.get("tree_build") in defined:  # a build of the configuration's: its fields
        sim["ddtree_builds"] = {method.params["tree_build"]: defined[method.params["tree_build"]]}
    return ServerJob(
        backend=config["backend"],
        model=cast(ModelSection, dict(config["model"])),
        tp=tp,
        method=method,
        server=cast(ServerSection, dict(config["server"])),
        sim=cast("SimSection | None", sim),
        sglang=(
            dict(config["sglang"])
            if config["backend"] == "sglang"
            else {k: config["sglang"][k] for k in ("options_table", "extra_flags")}
        ),
        gpu_pool=gpu_pool(config),
        workloads=[dict(w) for w in config["workloads"]],
        concurrency=list(config["concurrency"]),
        warmup=config["warmup"],
        repetition=repetition,
        seed=config["seed"],
        sampling=cast(SamplingSection, dict(config["sampling"])),
        load=cast(LoadSection, dict(config["load"])),
        adaptive=dict(config["adaptive"]) if config["adaptive"]["enabled"] else None,
        cache_dir=config["cache_dir"],
        endpoint=external.endpoint(config, method.name) if config["backend"] == "external" else None,
        budget=dict(config["verdict_stopping"]) if verdict_reference_method(config, method) else None,
    )


def verdict_reference_method(config: dict, method: Method) -> Method | None:
    """Under ``budget: verdict``, the AR method (algorithm ar) on ``method``'s engine that its cells stop against;
    None for AR itself, under ``budget: exhaustive``, or where that engine has no AR method (its cells are then
    measured in full)."""
    if config.get("budget", "exhaustive") != "verdict" or not method.spec.speculative:
        return None
    return next(
        (m for m in expand_methods(config) if not m.spec.speculative and m.engine == method.engine),
        None,
    )


def verdict_reference_cells(config: dict, tp: int, method_name: str, repetition: int | None = None) -> list[str]:
    """The cell outputs of AR's server at ``tp`` that the server (tp, method_name) stops its cells against under
    ``budget: verdict`` (AR's server then runs first: a DAG edge, rules/bench.smk), [] where it stops against none."""
    method = next(m for m in expand_methods(config) if m.name == method_name)
    reference = verdict_reference_method(config, method)
    return [c["path"] for c in cells_of_server(config, tp, reference.name, repetition)] if reference else []


def calibration_methods(config: dict) -> list[Method]:
    """The methods whose servers a calibration starts, the baseline (AR) first (the configured one, else a plain one
    named after it), then every configured speculative method."""
    methods = expand_methods(config)
    baseline = next((m for m in methods if not m.spec.speculative), None)
    if baseline is None:
        baseline = Method(algorithms.BASELINE, algorithms.BASELINE, {}, (), {})
    return [baseline] + [m for m in methods if m.spec.speculative]


def external_servers(config: dict) -> list[ServerJob]:
    """The server job of each external server, once (repetitions measure the same server again): the servers the
    environment record describes (external.describe_servers), keyed as external.server_key."""
    pairs = dict.fromkeys((s["tp"], s["method"]) for s in servers(config))
    return [server_job(config, tp, method) for tp, method in pairs]


def verdict_family_cells(config: dict, tp: int, method_name: str, repetition: int | None = None) -> list[str]:
    """Under ``budget: verdict``, for a server above the smallest TP size: the cell outputs at the smallest TP of
    every setting of its algorithm on its engine (itself among them), from which it learns where it is dominated
    (implied.dominated; its server then waits for them: a DAG edge); [] otherwise, and where the algorithm has one
    setting."""
    method = next(m for m in expand_methods(config) if m.name == method_name)
    smallest = min(config["tp"])
    if verdict_reference_method(config, method) is None or tp == smallest:
        return []
    family = [m for m in expand_methods(config) if m.algorithm == method.algorithm and m.engine == method.engine]
    if len(family) < 2:
        return []
    return [c["path"] for m in family for c in cells_of_server(config, smallest, m.name, repetition)]
