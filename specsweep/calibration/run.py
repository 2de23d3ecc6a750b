"""One TP's calibration (``snakemake calibrate`` runs ``calibrate`` once per configured TP and engine): its
servers measured (probe), the runtime fitted (fit), the profile and its table written.

It starts one server per method as the workflow starts them (``launcher.start_server``, its GPUs from the pool):
first AR, then every configured speculative method (jobs.calibration_methods), and measures each through its HTTP
API (probe.measure_shapes). Start-up: each server's launch to ready; the first server the job starts on the host
(cold: kernel compilation and caches) and the later ones (warm); every start of a server is kept (``startups``).

Time bound: ``calibration.max_seconds_per_tp`` for all servers of one TP, start-ups included. Each server to
measure gets an equal share of what is left when it starts (a server that used less leaves it to the next).

Each server's measurements are cached like cells (``{cache_dir}/calibration/``, verified on reuse: key, digest of
the content, fingerprint) under a key of the fingerprint, the method as its server runs it and the calibration
settings, after every shape (an interrupted calibration keeps what its servers finished): a rerun measures a server
again only when one of them changes or shapes are missing, and one whose servers are all cached starts none. The
profile and its table are written under ``results/calibration/`` named by a short digest of the fingerprint (GPU
model and count, driver, engine version and commit, model, TP: choose.fingerprint), the profile with its content
digest (choose.calibration_text).
"""

from __future__ import annotations

import csv
import io
import signal
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import yaml

from .. import ddtree, engines
from ..cache import CellCache
from ..canon import atomic_write_text, canonical_json, digest
from ..errors import CalibrationError
from ..gpus import GpuPool, lock_folder, visible_devices, wait_until_released
from ..jobs import calibration_methods, server_job
from ..launcher import ApiKeyFile, Server, start_server
from ..methods import expand_methods
from ..server_job import ServerJob
from ..modelling.cost import CostModel, runtime_problems
from . import choose
from .fit import FITTED, Fit, fit_runtime, modelled_seconds, prior
from .probe import SHAPE_KINDS, measure_shapes, open_probe, server_shapes, shape_key, shape_of

CALIBRATION_VERSION = 2  # part of every cached measurement's key: bump it when what is measured changes


def fingerprints(environments: dict, config: dict) -> list[dict]:
    """[{tp, engine, fingerprint, digest}] for every configured TP of every engine (what the calibrate target's
    checkpoint writes): ``environments`` maps each engine's name (None: the one build of a configuration without
    ``engines``) to its environment record; each engine is fingerprinted in its own view of the configuration
    (engines.view: its build, its sim keys). Engines whose fingerprints agree share one calibration."""
    out, named = [], set()
    for engine, environment in environments.items():
        view = engines.view(config, engine)
        for tp in config["tp"]:
            value = choose.fingerprint(environment, view, tp)
            name = choose.fingerprint_digest(value)
            if name not in named:
                named.add(name)
                out.append({"tp": tp, "engine": engine, "fingerprint": value, "digest": name})
    return out


def calibration_job(config: dict, environment: dict, tp: int) -> dict:
    """Everything one TP's calibration depends on (and nothing else): the rule's params, as canonical JSON."""
    value = choose.fingerprint(environment, config, tp)
    # on the simulated backend, sim.calibration auto would otherwise run the servers on the profile this job wrote
    job = server_job(choose.uncalibrated(config), tp, expand_methods(config)[0].name).as_dict()
    job.update(workloads=[], warmup=0, adaptive=None, repetition=None)
    job["load"] = {"protocol": "native"}
    # --max-running-requests twice the largest batch: SGLang 0.5.16 at exactly 64 admitted 63 of a burst of 64 and
    # queued the last until the first finished, so that batch was never in flight together
    job["concurrency"] = [2 * max(config["calibration"]["batches"])]
    return {
        "fingerprint": value,
        "digest": choose.fingerprint_digest(value),
        "server_job": job,
        "methods": calibration_methods(config),
        "settings": dict(config["calibration"]),
        "ddtree_builds": dict(config.get("ddtree_builds") or {}),  # the configuration's own, which its methods name
        "sim_profiles": choose.emulated_profiles(config),
        "profile_names": {"gpu": config["sim"]["gpu"], "model": config["sim"]["model_profile"]},
    }


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
    emulated, tp = job["sim_profiles"], job["fingerprint"]["tp"]
    fixed = _given(job, environment)
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
    profile = {
        "fingerprint": job["fingerprint"],
        "digest": job["digest"],
        "measured_on": {"gpu": job["fingerprint"]["gpu"], "date": max(e["measured_at"] for e in entries)[:10]},
        "largest_deviation": round(max(deviations), 4),
        **_fitted(fit, cold_warm),
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
    atomic_write_text(profile_out, choose.calibration_text(profile))
    print(
        f"calibration tp{tp}: {len(started)} server(s) started, {len(set(cached) - set(started))} wholly cached; "
        f"{len(deviations)} shapes, largest deviation {max(deviations):.1%}; not identified: "
        f"{', '.join(fit.not_identified) or 'none'}",
        file=log,
        flush=True,
    )
    return {"measured": started, "cached": sorted(set(cached) - set(started)), "profile": profile}


def _given(job: dict, environment: dict) -> dict:
    """The runtime parameters a calibration takes as given (the configured runtime's, outside FITTED), checked before
    any server starts: the environment record must give the job's fingerprint, and the given parameters with the
    prior's must price a step (CalibrationError otherwise, saying what to do)."""
    tp = job["fingerprint"]["tp"]
    if job["fingerprint"] != choose.fingerprint(environment, _config_view(job), tp):
        raise CalibrationError(
            f"calibration tp{tp}: the environment record does not give this job's "
            "fingerprint (it changed since the plan of this run): run snakemake calibrate again"
        )
    runtime = job["sim_profiles"]["runtime"]
    fixed = {k: v for k, v in runtime.items() if k not in FITTED and not k.startswith("eager_")}
    problems = runtime_problems({**prior(), **fixed})
    if problems:
        raise CalibrationError(
            f"calibration tp{tp}: the runtime sim.runtime names cannot price a step ({'; '.join(problems)}); mend "
            "that profile (sim.profiles.runtimes)"
        )
    return fixed


def _fitted(fit: Fit, cold_warm: dict) -> dict:
    """A profile's account of its fit: the parameters not identified, held and identified, the start-ups, and the
    runtime fitted (its startup_seconds the cold start-up)."""
    return {
        "not_identified": fit.not_identified,
        "held": fit.held,
        "identified": fit.identified,
        "startup": cold_warm,
        "runtime": {**fit.runtime, "startup_seconds": cold_warm["cold_s"]},
    }


def _config_view(job: dict) -> dict:
    """What ``fingerprint`` reads of the configuration, from a calibration job."""
    return {"model": job["server_job"]["model"], "sim": job["server_job"]["sim"]}


def read_profile(path: str | Path) -> dict:
    """A calibration profile written by ``calibrate`` (YAML), verified (choose.read_calibration: its digest, its
    runtime's bounds)."""
    try:
        choose.read_calibration(path)
        return yaml.safe_load(Path(path).read_text())
    except (CalibrationError, OSError, yaml.YAMLError) as exc:
        raise CalibrationError(f"cannot read the calibration profile: {exc}", path=str(path)) from exc
