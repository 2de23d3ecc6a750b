"""One bench job: every cell of one server (tp, method[, repetition]), measuring only what the cache lacks.

The job checks every configured method against the installed server, matches its outputs to its cells by path,
verifies each cell's cache entry, starts the server only if a cell has no usable entry (holding its GPUs from the
pool), measures those cells one by one, caches the final ones, records each failure beside the outputs and in the
job's journal, always stops the server, and writes every cell to its output.
"""

from __future__ import annotations

import fnmatch
import json
import os
import signal
import sys
import tempfile
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from datetime import datetime, timezone
from pathlib import Path

from .cache import CellCache, Journal, journal_events, write_run_record
from .canon import atomic_write_json
from .cells import (
    DEFAULT_FAILURES,
    IDENTITY,
    CellError,
    as_named,
    cell_problem,
    keyed_cells,
    measure_cell,
    unfinished,
)
from .modelling.method import Method
from .server_job import ServerJob
from .environment import check_methods
from . import external
from .gpus import GpuPool, lock_folder, visible_devices, wait_until_released
from . import implied, layout, runs
from .layout import failure_path
from .launcher import ApiKeyFile, ServerError, check_host_environment, start_server
from .progress import Progress


def _match_outputs(server_name: str, cells: list[dict], outputs: list[str]) -> None:
    """Give each cell its output (matched by path, not position), or refuse outputs that do not name the cells."""
    by_path = {os.path.normpath(out): out for out in outputs}
    unmatched = [c["path"] for c in cells if os.path.normpath(c["path"]) not in by_path]
    if unmatched or len(cells) != len(outputs):
        raise CellError(
            f"server {server_name}: the job's {len(outputs)} outputs do not match its {len(cells)} cells "
            f"(no output for {', '.join(unmatched[:3]) or 'none'}): the rule's outputs and "
            "layout.cell_path must name the same files"
        )
    for cell in cells:
        cell["output"] = by_path[os.path.normpath(cell["path"])]


def _from_cache(
    server_name: str,
    cells: list[dict],
    store: tuple[CellCache, Journal],
    failures: dict,
    asked: set[str],
    results: dict[str, dict],
) -> list[dict]:
    """Put each cell's usable cache entry in ``results`` (journalled as a hit); return the cells to measure: those
    without an entry, with one refused (said on stderr and in the journal, with why) or named in ``asked``."""
    cache, journal = store
    missing = []
    for cell in cells:
        entry, why = _usable_entry(cache, cell, failures)
        if entry is not None and os.path.normpath(cell["output"]) in asked:
            why = "remeasure asks for it"
        if why is None and entry is not None:
            results[cell["output"]] = entry
            journal.write("cache_hit", server=server_name, cell=cell["output"], key=cell["key"])
            continue
        if why is not None:
            print(
                f"server {server_name}: cache entry {cache.path(cell['key'])} for {cell['output']} not used: {why}; "
                "measuring the cell again",
                file=sys.stderr,
                flush=True,
            )
            journal.write("cache_refused", server=server_name, cell=cell["output"], key=cell["key"], reason=why)
        missing.append(cell)
    return missing


def bench_server(
    job: ServerJob,
    outputs: list[str],
    environment: dict,
    log_dir: str | Path,
    run_record: str | Path | None = None,
    all_methods: list[Method] | None = None,
    planned=None,
    failures: dict | None = None,
    remeasure: Sequence[str] = (),
    reference: Sequence[str] = (),
    predicted: Mapping[tuple, float] | None = None,
    family: Sequence[str] = (),
) -> dict:
    """Produce every cell output of one server, measuring only what the cache lacks.

    ``all_methods`` (every configured method) are checked against the server's capabilities first, so that any job stops
    the workflow before a server starts. ``planned(sessions)`` returns {cell output: predicted seconds} for the progress
    lines' time left; it is asked only when a cell is to be measured, once the workloads are built. A cache entry is
    used only when it is verified (cells.cell_problem) and final under ``failures`` (cells.unfinished); any other entry
    is refused with a warning naming it, and the cell is measured again, as are the outputs named in ``remeasure``.
    ``reference``: AR's cell files of this TP, which the cells stop against under ``budget: verdict`` (job.budget;
    jobs.verdict_reference_cells). A measured cell that is not final is not cached: the job says so and fails after its
    other cells (their outputs are then removed, the cache keeps them), or, with ``failures.keep_going``, writes it to
    its output and records it as failed, so that the next run measures it again. What the job does goes to the server's
    journal (layout.journal_path, in the cache); ``run_record`` (the job's declared output) gets its run record. Under
    ``budget: verdict`` the cells that decided cells imply are not measured (implied; ``predicted``: the cost model's
    {(workload, concurrency): speedup}, ``family``: the cell files of this algorithm's settings at the smallest TP):
    each gets its skipped_record. Returns {"hits": n, "measured": n, "skipped": n, "server_started" (on backend
    external "server_reached"): bool, "not_final": [outputs]}. Long because this docstring is the bench job's
    contract, in one place.
    """
    failures = failures or DEFAULT_FAILURES
    check_host_environment()
    check_methods(all_methods or [job.method], environment, job.sglang["extra_flags"])
    if job.backend == "external":  # the server as it describes itself now: checked, and its identity keys the cells
        environment = external.environment(environment, job, job.endpoint["url"] if job.endpoint else "")
    server_name = job.name
    run = runs.current()
    journal = Journal(layout.journal_path(job.cache_dir, job.tp, job.method.name, job.repetition, run), run)
    cache = CellCache(job.cache_dir)
    adaptive = job.adaptive
    cells, sessions = keyed_cells(job, environment["identity_digest"], adaptive["max_requests"] if adaptive else 0)
    _match_outputs(server_name, cells, outputs)
    asked = {os.path.normpath(p) for p in remeasure}  # the outputs to measure again
    results: dict[str, dict] = {}
    missing = _from_cache(server_name, cells, (cache, journal), failures, asked, results)
    order = None
    if job.budget is not None:
        skip = _skipper(cells, results, journal, server_name, environment["simulated"])
        for cell in _dominated_cells(job, cells, missing, family, asked):
            skip(cell, *cell.pop("dominated"))
            missing.remove(cell)
        for cell in missing:
            cell["ar_records"] = _reference_records(reference, cell)
        order = _verdict_order(cells, results, predicted or {}, asked, skip)
    not_final: list[tuple[str, str]] = []
    started = bool(missing) and _measure_missing(
        job,
        cells,
        missing,
        sessions,
        environment,
        Path(log_dir),
        planned,
        failures,
        asked,
        (cache, journal),
        results,
        not_final,
        order,
    )
    if not_final and not failures["keep_going"]:
        raise _not_final_error(server_name, not_final)
    for cell in cells:  # verified cache entries and final measurements, as the cache holds them
        atomic_write_json(cell["output"], results[cell["output"]])
    skipped = sum(implied.is_skipped(results[c["output"]]) for c in cells)
    measured = len([c for c in missing if not implied.is_skipped(results[c["output"]])])
    done = {
        "hits": len(cells) - measured - skipped,
        "measured": measured,
        "skipped": skipped,
        # an external server is reached, never started (its operator's): "reached" where the run reached it
        ("server_reached" if job.backend == "external" else "server_started"): started,
        "not_final": [output for output, _ in not_final],
    }
    if run_record is not None:
        write_run_record(run_record, server_name, journal, {c["key"] for c in cells})
    return done


def _skipper(cells: list[dict], results: dict[str, dict], journal: Journal, server_name: str, simulated: bool):
    """skip(cell, reason, implied_by): a cell not measured, its skipped_record its result, said in the journal."""

    def skip(cell: dict, reason: str, implied_by: Sequence[str]) -> None:
        results[cell["output"]] = implied.skipped_record(cell, reason, implied_by, bool(simulated))
        journal.write("cell_skipped", server=server_name, cell=cell["output"], key=cell["key"], reason=reason)
        print(f"server {server_name}: cell {cell['output']} {reason}", file=sys.stderr, flush=True)

    return skip


def _dominated_cells(
    job: ServerJob, cells: list[dict], missing: list[dict], family: Sequence[str], asked: set[str]
) -> list[dict]:
    """The ``missing`` cells (none that remeasure names) on workloads where this setting is dominated at the
    smallest TP by another of its algorithm (implied.dominated over the ``family`` cell files' last looks), each
    with ``dominated``: (reason, the cells it is implied from)."""
    intervals: dict = {}  # {workload: {method: {concurrency: (lo, hi)}}}
    paths: dict = {}
    tp = None
    for path in family:
        cell = json.loads(Path(path).read_text())
        c = cell["cell"]
        tp = c["tp"]
        paths.setdefault(c["workload"], {}).setdefault(c["method"], []).append(path)
        mine = intervals.setdefault(c["workload"], {}).setdefault(c["method"], {})
        if implied.is_skipped(cell):
            continue  # not measured: absent
        looks = (cell.get("precision") or {}).get("looks_taken") or []
        mine[c["concurrency"]] = tuple(looks[-1]["speedup_ci"]) if looks and looks[-1]["speedup_ci"] else None
    out = []
    for workload in dict.fromkeys(c["workload"] for c in cells):
        levels = [c["concurrency"] for c in cells if c["workload"] == workload]
        by = implied.dominated(job.method.name, intervals.get(workload, {}), levels)
        if by is None:
            continue
        basis = paths[workload].get(job.method.name, []) + paths[workload].get(by, [])
        for cell in missing:
            if cell["workload"] == workload and os.path.normpath(cell["output"]) not in asked:
                cell["dominated"] = (f"{implied.DOMINATED.format(tp=tp)} by {by}", basis)
                out.append(cell)
    return out


def _verdict_order(cells: list[dict], results: dict[str, dict], predicted: Mapping[tuple, float], asked: set, skip):
    """order(missing): the missing cells of a job under budget: verdict in the order it measures them: per workload
    as implied.next_concurrency gives them from the decisions so far (``results``, read each time a cell is asked
    for, after the one before it was measured), the cells it skips given to ``skip`` as they are found (never one
    that remeasure names)."""

    def decision(cell: dict, yielded: set) -> str | None:
        result = results.get(cell["output"])
        if result is None:  # not measured yet, or measured but not final (not kept): undecided
            return "undecided" if cell["output"] in yielded else None
        if implied.is_skipped(result):
            return "not measured"
        return (result.get("precision") or {}).get("decision") or "undecided"

    def order(missing: list[dict]):
        yielded: set = set()
        for workload in dict.fromkeys(c["workload"] for c in missing):
            mine = {c["concurrency"]: c for c in cells if c["workload"] == workload}
            while True:
                decisions = {k: d for k, c in mine.items() if (d := decision(c, yielded)) is not None}
                predicted_here = {k: predicted.get((workload, k), 1.0) for k in mine}
                nxt, skipped = implied.next_concurrency(list(mine), decisions, predicted_here)
                for k, (why, basis) in skipped.items():
                    if mine[k] in missing and os.path.normpath(mine[k]["output"]) not in asked:
                        skip(mine[k], why, [mine[b]["output"] for b in basis])
                if nxt is None or mine[nxt] not in missing:
                    break
                yielded.add(mine[nxt]["output"])
                yield mine[nxt]
        # any cell the order did not reach (none expected) is measured rather than left without an output
        yield from [c for c in missing if c["output"] not in yielded and c["output"] not in results]

    return order


def _reference_records(reference: Sequence[str], cell: dict) -> list[dict]:
    """The records of AR's cell (among the ``reference`` files) at the cell's workload and concurrency, which a cell
    under ``budget: verdict`` stops against; a clear error where it is missing (AR's server measures it first)."""
    for path in reference:
        try:
            ar = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise CellError(
                f"cell {cell['output']}: AR's cell {path} cannot be read ({exc}); rerun to measure it"
            ) from exc
        if (ar["cell"]["workload"], ar["cell"]["concurrency"]) == (cell["workload"], cell["concurrency"]):
            return ar["requests"]
    raise CellError(
        f"cell {cell['output']}: budget: verdict stops it against AR's cell of {cell['workload']} at concurrency "
        f"{cell['concurrency']}, which none of {len(reference)} reference file(s) is; the workflow measures AR's "
        "server first (rules/bench.smk): run it through Snakemake, or set budget: exhaustive"
    )


def _not_final_error(server_name: str, not_final: list[tuple[str, str]]) -> CellError:
    """The error of a job whose measured cells are not all final: each output and why, and what to do."""
    return CellError(
        f"server {server_name}: {len(not_final)} cell(s) not final, so not cached:\n  "
        + "\n  ".join(f"{output}: {why}" for output, why in not_final)
        + "\nThe other cells are cached; the next run measures these again (set "
        "failures.keep_going: true to go on with them, or change the thresholds under failures)"
    )


def _measure_missing(
    job: ServerJob,
    cells: list[dict],
    missing: list[dict],
    sessions: dict,
    environment: dict,
    log_dir: Path,
    planned,
    failures: dict,
    asked: set[str],
    store: tuple[CellCache, Journal],
    results: dict[str, dict],
    not_final: list[tuple[str, str]],
    order=None,
) -> bool:
    """Measure the ``missing`` cells (in ``order(missing)`` where given: budget: verdict's, which may skip some) on one
    server of the job: take its GPUs from the pool (and the cells another run measured meanwhile from the cache), start
    the server, measure each cell into ``results`` (a final one also into the cache; one that is not final into
    ``not_final``), and always stop the server. Returns whether a server started. Long because the server's whole life
    (its GPUs, SIGTERM, its API key's file, its start, every cell, its stop) is one with-block, which must end in one
    place."""
    cache, journal = store
    server_name = job.name
    _check_writable(cache.root, "cache_dir")
    pool_config = job.gpu_pool
    # an external server's GPUs are its operator's: its job takes none of this host's (nor waits for them)
    pooled = job.backend != "external" and (job.backend == "sglang" or pool_config["devices"])
    devices = visible_devices(pool_config["devices"]) if pooled else []
    with ExitStack() as stack:
        gpus = None
        if devices:
            pool = GpuPool(lock_folder(pool_config["lock_dir"]), devices)
            need = len(devices) if pool_config["exclusive"] else job.tp
            print(f"server {server_name}: waiting for {need} GPU(s) from the pool", file=sys.stderr, flush=True)
            gpus = stack.enter_context(pool.acquire(need, holder=server_name))
            for cell in list(missing):  # measured by another run while this one waited
                entry, why = _usable_entry(cache, cell, failures)
                if entry is not None and why is None and os.path.normpath(cell["output"]) not in asked:
                    missing.remove(cell)
                    results[cell["output"]] = entry
                    journal.write("cache_hit", server=server_name, cell=cell["output"], key=cell["key"])
        if not missing:
            return False
        log_path = log_dir / layout.server_log_name(job.tp, job.method.name)
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
        stack.callback(signal.signal, signal.SIGTERM, previous)
        outside = job.backend == "external"  # a server someone else runs: reached, never started or stopped
        key = stack.enter_context(ApiKeyFile(None if outside else job.server.get("api_key_env")))
        server = None
        try:
            journal.write(  # an external server's span in the journal: reached (specsweep starts none)
                "server_start",
                server=server_name,
                gpus=gpus,
                offered=devices,
                external=outside,
                **({"note": "external server: reached at its URL, not started"} if outside else {}),
            )
            try:
                server, argv, env = (
                    _external_server(job, environment)
                    if outside
                    else start_server(job, sessions, environment, log_path, gpus, key.args, key.headers)
                )
            except (ServerError, external.ExternalServerError) as exc:
                for cell in missing:
                    record_failure(cell, exc, None, journal, server_name)
                raise
            key.remove()  # the server read it when it started
            progress = Progress(server_name, cells, missing, planned(sessions) if planned else None)
            for cell in order(missing) if order else missing:
                try:
                    result = measure_cell(
                        server,
                        job,
                        cell,
                        sessions[cell["workload"]],
                        cell["digest"],
                        environment,
                        argv,
                        env,
                        progress,
                    ).as_dict()
                except Exception as exc:
                    record_failure(cell, exc, server, journal, server_name)
                    raise
                _keep(cell, result, server, failures, store, server_name, results, not_final)
        finally:
            if server is not None:
                server.stop()
                if gpus and job.backend == "sglang":
                    wait_until_released(gpus)
            journal.write(
                "server_stop",
                server=server_name,
                **({"note": "external server: left running, not stopped"} if outside else {}),
            )
    return True


def _external_server(job: ServerJob, environment: dict) -> tuple[external.ExternalServer, list[str], dict]:
    """(an external server as the cells measure it, the stream flags it reports, no environment of ours): checked to
    answer before any cell."""
    endpoint = job.endpoint or {}
    headers = external.api_headers(job.method.name, endpoint.get("api_key_env"))
    server = external.ExternalServer(endpoint["url"], headers)
    server.check_alive("before its first cell")
    return server, external.stream_flags(external.description_of(environment)), {}


def _keep(
    cell: dict,
    result: dict,
    server,
    failures: dict,
    store: tuple[CellCache, Journal],
    server_name: str,
    results: dict[str, dict],
    not_final: list[tuple[str, str]],
) -> None:
    """A measured cell into ``results`` and the cache when it is final; otherwise into ``not_final`` with its
    failure record (and into ``results`` with failures.keep_going), never into the cache."""
    cache, journal = store
    why = unfinished(result["requests"], failures)
    if why is not None:
        not_final.append((cell["output"], why))
        record_failure(
            cell, CellError(f"the cell is not final: {why}"), server, journal, server_name, measurement=result
        )
        print(
            f"server {server_name}: cell {cell['output']} is not final: {why}; it is not cached "
            "and the next run measures it again",
            file=sys.stderr,
            flush=True,
        )
        if failures["keep_going"]:
            results[cell["output"]] = result
        return
    try:
        cache.put(cell["key"], result)
    except OSError as exc:
        raise CellError(
            f"cell {cell['output']}: cannot write the cell cache under {cache.root} "
            f"({exc.strerror or exc}); free space or fix the folder (cache_dir), then rerun: cells "
            "already cached are kept"
        ) from exc
    results[cell["output"]] = result
    clear_failure(cell)
    journal.write("measured", server=server_name, cell=cell["output"], key=cell["key"])


def _usable_entry(cache: CellCache, cell: dict, failures: dict) -> tuple[dict | None, str | None]:
    """(the cache entry of a cell, None) when it is verified and final, presented under the cell's name
    (cells.as_named); (None, None) when there is none; (None, why) when there is one that must not be used."""
    entry, why = cache.read(cell["key"])
    if entry is None:
        return None, why
    why = cell_problem(entry, cell, any_engine_name=True)
    if why is None:
        not_final = unfinished(entry["requests"], failures)
        why = f"it is not final: {not_final}" if not_final else None
    return (None, why) if why else (as_named(entry, cell), None)


def _name_of(cell_path: str) -> str:
    """A cell's name (cells.cell_name) from its path: results/cells/tp1/ar/short/c4.json is tp1/ar/short/c4."""
    return cell_path.removeprefix(layout.CELLS + "/").removesuffix(".json")


def remeasured_outputs(pattern: str | None, cell_paths: list[str]) -> list[str]:
    """The cell paths that the ``remeasure`` setting names: comma-separated globs, each matched against a cell's
    name (_name_of) and its path (results/cells/tp1/ar/short/c4.json). Empty or none (`--config remeasure=`)
    names no cell."""
    globs = [g.strip() for g in (pattern or "").split(",") if g.strip()]
    return [
        p for p in cell_paths if any(fnmatch.fnmatchcase(p, g) or fnmatch.fnmatchcase(_name_of(p), g) for g in globs)
    ]


def remeasure_summary(asked: list[str], journals: Sequence[str | Path], shown: int = 8) -> str:
    """What `remeasure` did in one run, as one line: how many of the cells it names (``asked``, cell paths) the
    run measured and cached (a `measured` event in the run's ``journals``), and which (the first ``shown`` of each
    kind); a named cell without one failed, was not final, or was not reached (an interrupted run, a target that
    does not read it)."""
    measured = {
        os.path.normpath(e["cell"])
        for journal in journals
        if os.path.exists(journal)
        for e in journal_events(journal)
        if e["event"] == "measured" and isinstance(e.get("cell"), str)
    }
    done = [_name_of(p) for p in asked if os.path.normpath(p) in measured]
    left = [_name_of(p) for p in asked if os.path.normpath(p) not in measured]

    def listed(names: list[str]) -> str:
        return ", ".join(names[:shown]) + (f", ... ({len(names) - shown} more)" if len(names) > shown else "")

    line = f"remeasure: measured {len(done)}{f' of {len(asked)}' if left else ''} cell{'s' if len(asked) != 1 else ''}"
    line += f" ({listed(done)})" if done else ""
    if left:
        line += (
            f"; not measured: {listed(left)} (failed, not final or not reached: see results/failed/ and logs/bench/)"
        )
    return line


def unfinished_outputs(cell_paths: list[str]) -> dict[str, int]:
    """{cell path: when its failure record was written (ns)} of the cells whose output is there although their
    latest measurement failed or was not final (failures.keep_going): a bench job's rerun trigger, so that the next
    run measures them again."""
    out = {}
    for path in cell_paths:
        try:
            if os.path.exists(path):
                out[path] = os.stat(failure_path(path)).st_mtime_ns
        except FileNotFoundError:
            continue
    return out


def _check_writable(folder: Path, key: str) -> None:
    """Fail before a server starts if results could not be stored."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".probe-"):
            pass
    except OSError as exc:
        raise CellError(
            f"cannot write to {folder} ({key}): {exc.strerror or exc}; fix the folder or point {key} "
            "elsewhere, then rerun"
        ) from exc


def record_failure(
    cell: dict, exc: BaseException, server, journal: Journal, server_name: str, measurement: dict | None = None
) -> None:
    """Record a failed cell with its cause and the server log's tail (kept until the cell succeeds), and the
    measurement of a cell that is not final."""
    record = {
        "cell": {k: cell[k] for k in IDENTITY},
        "key": cell["key"],
        "cause": f"{type(exc).__name__}: {exc}",
        "server_log_tail": server.log_tail(40) if server is not None else None,
        "time": datetime.now(timezone.utc).isoformat(),
        "measurement": measurement,
    }
    try:
        atomic_write_json(failure_path(cell["output"]), record)
    except OSError:
        pass
    journal.write("cell_failed", server=server_name, cell=cell["output"], key=cell["key"], cause=record["cause"])


def clear_failure(cell: dict) -> None:
    try:
        Path(failure_path(cell["output"])).unlink()
    except FileNotFoundError:
        pass


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")
