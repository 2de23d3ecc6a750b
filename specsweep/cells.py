"""Cells: one cell's measurement on a running server, its JSON, its content address and its verification.

A cell is one (server, workload, concurrency, repetition) measurement and produces one JSON file. Its key digests
everything that decides what was measured: the server's parameters, the cell's, the exact prompts, the
environment's identity and HARNESS_VERSION (see ``bench`` for the job that measures a server's cells through the
cache). Its digest covers its whole content. A cell is used (copied from the cache, aggregated) only when
``cell_problem`` finds nothing wrong with it: it follows the cell schema, matches its digest and is the cell, with
the prompts and key, that the current configuration asks for.
"""

from __future__ import annotations

import copy
import json
import math
from collections import Counter
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from importlib import resources

import jsonschema
import requests

from . import CELL_SCHEMA_VERSION, HARNESS_VERSION, __version__, algorithms, ddtree, ddtree_profile, engines, sequential
from .canon import canonical_json, digest
from .client import Abort, LoadModel, measure
from .counters import SERVER_INFO_KEYS, LoadSampler, counter_deltas, scrape, server_cumulative_acceptance, server_info
from .gpus import gpu_memory_used
from .jobs import cells_of_server
from .external import ExternalServer
from .launcher import Server as StartedServer
from .launcher import min_free_slots_delay, redact, stream_mode
from .metrics import cell_metrics, failures, precision_of, relative_precision
from .progress import Progress
from .server_job import ServerJob
from .workloads import (
    WARMUP_FILL_TOKENS,
    build,
    content_mix,
    trace_account,
    warmup_sessions,
    workload_digest,
)

IDENTITY = ("tp", "method", "workload", "concurrency", "repetition")  # what names a cell


class CellError(RuntimeError):
    """A cell could not be measured; the message names the cell and the cause."""


Server = StartedServer | ExternalServer  # a server the cells measure: one specsweep started, or someone else's


def cell_schema() -> dict:
    return json.loads(resources.files("specsweep").joinpath("cell.schema.json").read_text())


def validate_cell(cell: dict) -> None:
    """Raise jsonschema.ValidationError if a cell JSON does not follow the cell schema."""
    jsonschema.validate(cell, cell_schema())


def content_digest(cell: dict) -> str:
    """A cell's digest: SHA-256 of its canonical JSON, less its own ``digest`` field."""
    return digest({k: v for k, v in cell.items() if k != "digest"})


def cell_problem(cell, expected: dict, any_engine_name: bool = False) -> str | None:
    """Why a cell JSON cannot stand for the ``expected`` cell (one of keyed_cells), or None when it can: it must
    follow the cell schema, match the digest written with it, and be that cell (tp, method, workload, concurrency,
    repetition), with the digest of its prompts and the key the current configuration gives it. With
    ``any_engine_name`` (a cache entry, which ``as_named`` then presents under the cell's name) its method may run
    on an engine of another name: the key holds the engine's build, not its name."""
    problem = integrity_problem(cell)
    if problem is not None:
        return problem
    identity = {k: expected[k] for k in IDENTITY}
    if cell["cell"] != identity and not (any_engine_name and _unnamed(cell["cell"]) == _unnamed(identity)):
        return f"it holds the cell {cell_name(cell['cell'])}, not {cell_name(identity)}"
    if cell["workload"]["digest"] != expected["digest"]:
        return (
            f"its prompts (digest {cell['workload']['digest'][:12]}) are not the prompts this configuration "
            f"sends (digest {expected['digest'][:12]}): it was measured for another configuration"
        )
    if cell["key"] != expected["key"]:
        return (
            f"its key {cell['key'][:12]} is not the key this configuration gives it ({expected['key'][:12]}): it "
            "was measured for another configuration"
        )
    return None


def integrity_problem(cell, listed_digest: str | None = None) -> str | None:
    """Why a cell JSON cannot be trusted as it was written, or None when it can: it must be a JSON object that
    follows the cell schema and matches its digest (content_digest): the ``digest`` it carries, else, for a cell
    written before cells carried one, ``listed_digest``, its digest as listed elsewhere (an archived record's
    record.yaml: see archive.py). A cell carrying a digest that is not the one listed for it is refused too."""
    if not isinstance(cell, dict) or not cell:
        return "it is empty" if cell == {} else "it is not a JSON object"
    try:
        validate_cell(cell)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "the top level"
        return f"it does not follow the cell schema (at {where}: {exc.message[:160]})"
    if listed_digest is not None and cell.get("digest", listed_digest) != listed_digest:
        return f"it carries the digest {cell['digest'][:12]}, not the one listed for it ({listed_digest[:12]})"
    expected = cell.get("digest", listed_digest)
    if expected is None:
        return "it carries no digest (written before cells were verified)"
    if expected != content_digest(cell):
        return "its content does not match its digest (it was changed after it was written)"
    return None


def _unnamed(identity: dict) -> dict:
    """A cell's identity with its method's engine name left out."""
    return {**identity, "method": engines.split(identity["method"])[0]}


def as_named(cell: dict, expected: dict) -> dict:
    """A verified cell (cell_problem found nothing wrong with it) presented as the ``expected`` cell: the name of
    its method and engine, in its identity and its method, are the expected cell's (an engine renamed, or a
    configuration wrapped in a one-engine ``engines`` block, finds the cells measured under the old name by their
    key), and its digest is computed again over what it now says. The cell itself when it already is that cell."""
    if cell["cell"]["method"] == expected["method"]:
        return cell
    named = copy.deepcopy(cell)
    named["cell"]["method"] = named["method"]["name"] = expected["method"]
    named["method"].pop("engine", None)
    engine = engines.split(expected["method"])[1]
    if engine is not None:
        named["method"]["engine"] = engine
    named["digest"] = content_digest(named)
    return named


def cell_name(cell: dict) -> str:
    """tp{tp}/{method}/{workload}/c{concurrency}[-r{repetition}] (the repetition only when it is not 0)."""
    rep = f"-r{cell['repetition']}" if cell.get("repetition") else ""
    return f"tp{cell['tp']}/{cell['method']}/{cell['workload']}/c{cell['concurrency']}{rep}"


# The failure thresholds where none are configured (the schema's defaults of the config key failures)
DEFAULT_FAILURES = {"max_timeouts": 0, "max_failed_share": 0.01, "keep_going": False}


def unfinished(records: list[dict], thresholds: dict) -> str | None:
    """Why a measured cell is not final, or None when it is: more timed-out requests than
    ``failures.max_timeouts``, or a larger share of failed requests (any category) than
    ``failures.max_failed_share``, or no request at all."""
    sent, failed = len(records), failures(records)
    if not sent:
        return "it holds no request"
    timeouts, total = failed.get("timeout", 0), sum(failed.values())
    if timeouts > thresholds["max_timeouts"]:
        return f"{timeouts} of {sent} requests timed out (failures.max_timeouts: {thresholds['max_timeouts']})"
    if total / sent > thresholds["max_failed_share"]:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(failed.items()))
        return (
            f"{total} of {sent} requests failed ({kinds}; failures.max_failed_share: "
            f"{thresholds['max_failed_share']:g})"
        )
    return None


@dataclass(frozen=True)
class CellResult:
    """One measured cell, as its JSON file holds it (``as_dict``; the schema is specsweep/cell.schema.json)."""

    schema_version: int
    harness_version: int
    simulated: bool  # measured on the simulated backend: every table and page built from it says so
    key: str  # the cell's content address (cell_key)
    cell: dict  # tp, method, workload, concurrency, repetition
    method: dict
    model: dict
    workload: dict  # name, family, digest of the exact prompts, sessions, warm-up, content mix
    sampling: dict
    load: dict
    seed: int
    provenance: dict  # versions, command, environment (secrets redacted), GPUs, times, server's own settings
    server_counters: dict  # Prometheus counters differenced over the measurement window
    server_load: dict  # running and queued requests sampled while measuring
    metrics: dict  # cell_metrics: each metric with its interval
    precision: dict
    requests: list  # one record per request (client.RequestRecord.as_dict)
    # a DDTree build's stage profiler over the cell's load: seconds per verify round by part and stage
    # (specsweep.ddtree_profile.split); None, and no key, without a profiler
    stages: dict | None = None

    def as_dict(self) -> dict:
        """The cell's JSON with its digest: plain JSON values only (NaN refused), validated against the cell
        schema."""
        result = json.loads(json.dumps(asdict(self), allow_nan=False))
        if result["stages"] is None:
            del result["stages"]
        result["digest"] = content_digest(result)
        validate_cell(result)
        return result


def _declared_keys(job: ServerJob) -> list[str]:
    """server_info's keys of the build flags the configuration declares (algorithms.dest)."""
    return [algorithms.dest(extra["flag"]) for extra in job.sglang.get("extra_flags", ())]


def _json_numbers(value):
    """A value with every infinite float written as the string "inf" or "-inf" (JSON has no infinity)."""
    if isinstance(value, dict):
        return {k: _json_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_numbers(v) for v in value]
    if isinstance(value, float) and value in (math.inf, -math.inf):
        return "inf" if value > 0 else "-inf"
    return value


# What a server job holds that decides none of its numbers: which cells run and where they go; how long to wait for
# a server; where an external server answers (its description is the environment's identity: external.environment);
# what the host passes it besides the platform's variables (server.pass_env, never a variable that changes decoding:
# config.check_pass_env); and where its build lies and what it is called (sglang.python, env_dir,
# install, build), whose content the environment's identity holds (environment.build_identity)
UNKEYED_JOB = ("workloads", "concurrency", "repetition", "cache_dir", "gpu_pool", "endpoint")
UNKEYED_SERVER = ("startup_timeout", "orphan_timeout", "pass_env")
UNKEYED_BUILD = ("python", "env_dir", "install", "build")


def cell_key(job: ServerJob, cell: dict, prompts_digest: str, identity_digest: str) -> str:
    """Content address of a cell: digest of everything that decides its numbers (the server job less what only
    decides which cells run or where they go, the cell, its exact prompts, the environment's identity).

    An engine is keyed by its build's content, never by its name or where it lies: its method is keyed under the
    configured method's name (the @<engine> dropped, and the engine's name), its build by the environment's
    identity, not its interpreter's path or label, so that a renamed engine, a moved environment of the same build
    or a configuration wrapped in a one-engine ``engines`` block keys its cells as before (see ``as_named``); a
    prompt file is keyed by the prompts it holds, not its path. What the configuration sets in a server's
    environment (server.env, a method's env: every variable that changes decoding, SGLANG_*, is set there) is keyed
    by value; what the host passes is not (launcher.host_environment). A simulated DDTree round of a build with its
    own round costs (ddtree_builds.yaml ``costs``) is keyed by those values, so that a refit prices it again."""
    relevant_server = {k: v for k, v in job.as_dict().items() if k not in UNKEYED_JOB}
    relevant_server["server"] = {k: v for k, v in job.server.items() if k not in UNKEYED_SERVER}
    relevant_server["sglang"] = {k: v for k, v in job.sglang.items() if k not in UNKEYED_BUILD}
    if job.budget is not None:  # budget: verdict's cells keep the deciding look's sessions (measure_verdict)
        relevant_server["budget"] = {
            **job.budget,
            "sessions_under_way": "aborted at the deciding look",
            "first_wave": sequential.FIRST_WAVE_WEIGHED,  # the looks' rule: a cell stopped by another is measured again
        }
    method = {k: v for k, v in job.method.as_dict().items() if k != "engine"}
    method["name"] = engines.split(method["name"])[0]
    relevant_server["method"] = method
    build = ddtree.builds().get(job.method.params.get("tree_build") or "") if job.sim is not None else None
    if build is not None and build.cost_terms():  # a simulated round priced with its build's own costs (shipped
        relevant_server["tree_build_costs"] = build.cost_terms()  # data, not configuration: keyed by value here)
    return digest(
        {
            "harness": HARNESS_VERSION,
            "server": relevant_server,
            "cell": {
                # a prompt file by the prompts it holds (their digest, below), not where it lies
                "workload": {k: v for k, v in job.workload(cell["workload"]).items() if k != "path"},
                "concurrency": cell["concurrency"],
                "repetition": cell["repetition"],
                "requests": cell["requests"],
                "warmup": job.warmup,
                # the sessions filling the warm-up's wave (none where concurrency <= warmup: keys as before)
                **(
                    {"warmup_fill": fill, "warmup_fill_tokens": WARMUP_FILL_TOKENS}
                    if (fill := job.warmup_fill(cell))
                    else {}
                ),
            },
            "prompts": prompts_digest,
            "environment": identity_digest,
        }
    )


def keyed_cells(
    job: ServerJob, identity_digest: str, at_least: int = 0, built: dict | None = None
) -> tuple[list[dict], dict]:
    """(every cell of one server job, each with the digest of its prompts and its key; the sessions by workload,
    built for at least ``at_least`` sessions). ``built`` keeps sessions already built for other jobs of the same
    workloads (they are the same for every server)."""
    cells = cells_of_server(
        {"workloads": job.workloads, "concurrency": job.concurrency, "load": job.load},
        job.tp,
        job.method.name,
        job.repetition,
    )
    thinking = job.sampling.get("thinking", False)
    inputs = [
        job.workloads,
        [c["requests"] for c in cells],
        job.seed,
        thinking,
        job.model.get("path"),
        job.model["context_length"],
        at_least,
    ]
    memo = canonical_json(inputs)
    if built is None or memo not in built:
        sessions = cell_sessions(
            job.workloads, cells, job.seed, thinking, job.model.get("path"), job.model["context_length"], at_least
        )
        if built is not None:
            built[memo] = sessions
    else:
        sessions = built[memo]
    for cell in cells:
        cell["digest"] = cell_digest(sessions, cell)
        cell["key"] = cell_key(job, cell, cell["digest"], identity_digest)
    return cells, sessions


def cell_sessions(
    workloads: list[dict],
    cells: list[dict],
    seed: int,
    thinking: bool,
    model_path: str | None,
    context_length: int,
    at_least: int = 0,
) -> dict:
    """{workload: sessions} built once for the largest of its cells (or ``at_least``); a cell's sessions are the
    first ``requests`` of them, the same for every count (build keeps a fixed order)."""
    return {
        w["name"]: build(
            dict(w, requests=max([c["requests"] for c in cells if c["workload"] == w["name"]] + [at_least])),
            seed,
            thinking,
            model_path,
            context_length,
        )
        for w in workloads
        if any(c["workload"] == w["name"] for c in cells)
    }


def cell_digest(sessions: dict, cell: dict) -> str:
    """Digest of exactly the sessions a cell sends."""
    return workload_digest(sessions[cell["workload"]][: cell["requests"]])


def _measure_until(
    server,
    sessions: list,
    cap: int,
    check,
    concurrency: int,
    sampling: dict,
    timeout: float,
    thinking: bool,
    load,
    on_record=None,
    abort: bool = False,
) -> tuple[list, str, int, Abort | None]:
    """One closed loop over the first ``cap`` sessions that asks ``check(records, started)`` whether to stop (the
    rounds of adaptive cells and of ``budget: verdict``).

    Without ``abort`` (adaptive cells) it is asked before each new session starts; once it answers a reason (a
    string) no new session starts, and the sessions under way finish. With ``abort`` (``budget: verdict``) it is
    asked as each request finishes, the last look included (a decision needs no new session to start); once it
    answers a reason the sessions under way are aborted (client.Abort: their turns cancelled, their connections
    closed, no record of them). Returns the records (as client.measure writes them: every request that finished),
    why it stopped ("request cap" when no check stopped it), how many sessions it started, and the Abort (None
    without ``abort``)."""
    state: dict = {"started": 0, "reason": "request cap"}

    def decided(records) -> bool:
        reason = check(records, state["started"])
        if reason:
            state["reason"] = reason
        return bool(reason)

    def stop(records) -> bool:
        if state["started"] >= cap:
            return True
        if not abort and decided(records):
            return True
        state["started"] += 1
        return False

    aborting = Abort(decided) if abort else None
    records = measure(
        server.url,
        sessions[:cap],
        concurrency,
        sampling,
        timeout,
        thinking,
        server.alive,
        load,
        on_record=on_record,
        stop=stop,
        abort=aborting,
    )
    return records, state["reason"], state["started"], aborting


def measure_adaptive(
    server,
    sessions: list,
    first: int,
    adaptive: dict,
    concurrency: int,
    sampling: dict,
    timeout: float,
    thinking: bool,
    load,
    seed: int,
    on_record=None,
) -> tuple[list, dict]:
    """One closed loop that keeps starting sessions (first the cell's ``first``, then checks every ``batch``
    finished requests) until the relative 95% CI half-width of the metric is at most ``target`` or ``max_requests``
    sessions were started; the sessions under way then finish. A check without an interval (too few sessions, or
    zero width) never stops it. Returns the records (the same records as ``client.measure``) and the precision,
    recomputed on every record."""
    cap = min(adaptive["max_requests"], len(sessions))
    state: dict = {"next_check": first, "at_stop": None}

    def check(records, started: int) -> str | None:
        if started >= first and len(records) >= state["next_check"]:
            state["next_check"] = len(records) + adaptive["batch"]
            achieved = relative_precision(
                [r.as_dict() for r in records], adaptive["metric"], concurrency, load.model, seed
            )
            state["at_stop"] = achieved
            if achieved is not None and achieved <= adaptive["target"]:
                return "target reached"
        return None

    records, reason, started, _ = _measure_until(
        server, sessions, cap, check, concurrency, sampling, timeout, thinking, load, on_record
    )
    achieved = relative_precision([r.as_dict() for r in records], adaptive["metric"], concurrency, load.model, seed)
    return records, {
        "metric": adaptive["metric"],
        "adaptive": True,
        "target": adaptive["target"],
        "achieved": achieved,
        "achieved_at_last_check": state["at_stop"],
        "requests": started,
        "stopped": reason,
    }


def measure_verdict(
    server,
    sessions: list,
    settings: dict,
    ar_records: list[dict],
    concurrency: int,
    sampling: dict,
    timeout: float,
    thinking: bool,
    load,
    on_record=None,
) -> tuple[list, dict]:
    """``budget: verdict``: one closed loop over the cell's ``sessions`` (its cap) that takes the looks of
    sequential.Looks as their sessions complete (asked as each request finishes), against AR's cell of the same
    (TP, workload, concurrency) (``ar_records``), and once a look is decided (faster, slower or equivalent) starts
    no new session and aborts the sessions under way (_measure_until's ``abort``): their GPU time would buy nothing
    the verdict uses. Looks still due when the loop ends (the cap reached) are taken on every record.

    Returns the records and the cell's account of its stopping (Looks.record, with the sessions started, the
    sessions and turns aborted). A cell decided before its last look keeps the records of exactly the look's
    sessions: look k counts the first n_k sessions in the order they start (Looks.order, the closed loop's order),
    fixed before the cell starts, and waits until every request of each has completed; which sessions it counts
    never depends on when they finish, so aborting the later ones leaves its estimate and interval as they would be
    had every session run to its end (the Bonferroni bound over the looks holds). The sessions started after the
    look's that had finished by then are set aside (``sessions_set_aside``): they are the shorter ones, and keeping
    them would weigh the cell's latencies towards short sessions."""
    looks = sequential.Looks(
        [s.id for s in sessions], {s.id: 1 + len(s.followups) for s in sessions}, ar_records, concurrency, settings
    )
    done: Counter[str] = Counter()  # requests completed per session
    counted = [0]  # the records already counted in done

    def check(records, started: int) -> str | None:
        done.update(r.session for r in records[counted[0] :])
        counted[0] = len(records)
        if not looks.ready_after(done):  # cheap: no look due, nothing to compute
            return None
        look = looks.step([r.as_dict() for r in records])
        return f"decided {look['decision']} at look {look['look']} of {len(looks.counts)}" if look else None

    records, reason, started, abort = _measure_until(
        server, sessions, len(sessions), check, concurrency, sampling, timeout, thinking, load, on_record, abort=True
    )
    if reason == "request cap":
        look = looks.step([r.as_dict() for r in records])
        reason = (
            f"decided {look['decision']} at look {look['look']} of {len(looks.counts)} (the cap)"
            if look
            else "session cap: undecided"
        )
    assert abort is not None
    records, set_aside = _look_records(records, looks, abort)
    reason += "" if set_aside is None else f"; {len(abort.sessions)} sessions under way aborted"
    return records, {
        **looks.record(reason),
        "requests": started,
        "sessions_aborted": len(abort.sessions),
        "turns_aborted": abort.turns,
        "sessions_set_aside": set_aside or 0,
    }


def _look_records(records: list, looks: sequential.Looks, abort: Abort) -> tuple[list, int | None]:
    """A cell decided before its last look: (the records of exactly the look's sessions, how many sessions started
    after them had finished and are set aside); any other cell: (its records, None)."""
    last = looks.taken[-1] if looks.taken else None
    if last is None or last["decision"] == sequential.UNDECIDED or last["look"] == len(looks.counts):
        return records, None
    chosen = set(looks.order[: last["sessions"]])
    set_aside = len({r.session for r in records} - chosen - abort.sessions)
    return [r for r in records if r.session in chosen], set_aside


def _cell_metrics(rows: list[dict], job: ServerJob, concurrency: int, model: str, deltas: dict, info: dict) -> dict:
    """The cell's metrics (metrics.cell_metrics of its records), a copy for readers of the cell: every table computes
    them again from the records. Beside them the server's own acceptance average, which is cumulative since launch
    (warm-up and earlier cells included): kept for reference only, never used as the cell's value."""
    metrics = _json_numbers(cell_metrics(rows, job.tp, concurrency, model, job.seed, deltas))
    metrics["server_cumulative_accept_length_not_used"] = server_cumulative_acceptance(info)
    return metrics


def _fixed_precision(metrics: dict) -> dict:
    """A cell of a fixed number of sessions: the precision its throughput interval achieved (no stopping rule)."""
    return {
        "metric": "output_throughput",
        "adaptive": False,
        "achieved": precision_of(metrics["output_throughput"], metrics["output_throughput_ci"]),
    }


def measure_cell(
    server: Server,
    job: ServerJob,
    cell: dict,
    sessions: list,
    prompts_digest: str,
    environment: dict,
    argv: list[str],
    env: dict,
    progress: Progress | None = None,
) -> CellResult:
    """Measure one cell on a running server: flush its prefix cache, warm it up on sessions of their own, then run
    the cell's load between two scrapes of its counters, sampling its load gauges meanwhile."""
    where = f"cell {cell['output']}"
    server.check_alive(f"before {where}")
    _flush_prefix_cache(server)
    began = datetime.now(timezone.utc)
    stream = stream_mode(argv, job.load["protocol"])
    load = _load_model(job, cell, server, stream)
    if job.warmup:
        _warm_up(server, job, cell, load)
        server.check_alive(f"after warm-up of {where}")
    before = scrape(server.url, server.headers)
    profile = ddtree_profile.output_path(argv)  # a DDTree build's stage profiler: the records of this cell's load
    tail = ddtree_profile.ProfileTail(profile) if profile else None
    measured = sessions[: cell["requests"]]  # the cell's own sessions (an adaptive cell may go on past them)
    with LoadSampler(server.url, server.headers) as sampler:
        records, precision = _run_load(server, job, cell, sessions, load, progress)
    deltas = counter_deltas(before, scrape(server.url, server.headers))
    stages = ddtree_profile.cell_stages(tail)
    info = server_info(server.url, server.headers)
    ended = datetime.now(timezone.utc)
    server.check_alive(f"after {where}")
    rows = [r.as_dict() for r in records]
    metrics = _cell_metrics(rows, job, cell["concurrency"], load.model, deltas, info)
    return CellResult(
        schema_version=CELL_SCHEMA_VERSION,
        harness_version=HARNESS_VERSION,
        simulated=bool(environment["simulated"]),
        key=cell["key"],
        cell={k: cell[k] for k in ("tp", "method", "workload", "concurrency", "repetition")},
        method=job.method.as_dict(),
        model=dict(job.model),
        workload=_workload_record(job, cell, prompts_digest, measured),
        sampling=dict(job.sampling),
        load={**job.load, "model": load.model, "stream": stream},  # the model run (a trace cell's: trace)
        seed=job.seed,
        provenance=_provenance(job, environment, server, argv, env, (began, ended), load, measured, info),
        server_counters=deltas,
        server_load={**sampler.summary(), "gauges": [list(sample) for sample in sampler.samples]},
        metrics=metrics,
        precision=precision or _fixed_precision(metrics),
        requests=rows,
        stages=stages,
    )


def _flush_prefix_cache(server: Server) -> None:
    """Empty the server's prefix cache, so that a cell finds none of an earlier cell's prompts there (a server
    without the endpoint keeps its cache)."""
    try:
        requests.post(server.url + "/flush_cache", timeout=30, headers=server.headers)
    except requests.RequestException:
        pass


def _workload_record(job: ServerJob, cell: dict, prompts_digest: str, measured: list) -> dict:
    """A cell's account of its workload: name, family, the prompts' digest, sessions measured and warm-up, the content
    mix of the sessions measured, max_new_tokens."""
    workload = job.workload(cell["workload"])
    return {
        "name": workload["name"],
        "family": workload["family"],
        "digest": prompts_digest,
        "sessions": cell["requests"],
        "warmup": job.warmup,
        "warmup_fill": job.warmup_fill(cell),
        "content_mix": content_mix(measured),
        "max_new_tokens": workload["max_new_tokens"],
        **(
            {"trace": trace_account(workload, job.model["context_length"], cell["requests"])}
            if workload.get("source") == "trace"
            else {}
        ),
    }


def _sampling(job: ServerJob) -> dict:
    return {"temperature": job.sampling["temperature"], "top_p": job.sampling["top_p"]}


def _warm_up(server: Server, job: ServerJob, cell: dict, load: LoadModel) -> None:
    """Warm-up sessions of their own (no prefix shared with the measured ones) in the cell's protocol, stream and
    connections, as a closed loop without think time, filling one wave of the cell's concurrency (warmup_fill)."""
    workload = job.workload(cell["workload"])
    thinking = job.sampling.get("thinking", False)
    warm = warmup_sessions(
        workload,
        job.warmup,
        job.seed,
        thinking,
        job.model.get("path"),
        job.model["context_length"],
        job.warmup_fill(cell),
    )
    measure(
        server.url,
        warm,
        cell["concurrency"],
        _sampling(job),
        job.server["request_timeout"],
        thinking,
        server.alive,
        replace(load, model="closed", rate=0.0, think_time=0.0, seed=0),
    )


def _run_load(
    server: Server,
    job: ServerJob,
    cell: dict,
    sessions: list,
    load: LoadModel,
    progress: Progress | None,
) -> tuple[list, dict | None]:
    """The cell's measured requests (its sessions, or under ``adaptive`` as many as its precision needs, or under
    ``budget: verdict`` as many as its verdict against AR's cell of its TP, workload and concurrency needs: the
    cell's ``ar_records``, bench._reference_records) and how it stopped (None for a fixed cell)."""
    ar_records = cell.get("ar_records")
    adaptive, measured = job.adaptive, sessions[: cell["requests"]]
    if progress is not None:
        progress.start(cell, adaptive["max_requests"] if adaptive else sum(1 + len(s.followups) for s in measured))
    on_record = progress.request_done if progress is not None else None
    sampling, timeout, thinking = _sampling(job), job.server["request_timeout"], job.sampling.get("thinking", False)
    if job.budget is not None and ar_records is not None:
        records, precision = measure_verdict(
            server, measured, job.budget, ar_records, cell["concurrency"], sampling, timeout, thinking, load, on_record
        )
    elif adaptive:
        records, precision = measure_adaptive(
            server,
            sessions,
            cell["requests"],
            adaptive,
            cell["concurrency"],
            sampling,
            timeout,
            thinking,
            load,
            job.seed,
            on_record,
        )
    else:
        records = measure(
            server.url,
            measured,
            cell["concurrency"],
            sampling,
            timeout,
            thinking,
            server.alive,
            load,
            on_record=on_record,
        )
        precision = None
    if progress is not None:
        progress.finish()
    return records, precision


def _load_model(job: ServerJob, cell: dict, server: Server, stream: str) -> LoadModel:
    """The cell's load model as the configuration gives it (a trace workload's: its sessions' own arrival times),
    seeded by the seed and the cell's repetition."""
    config = job.load
    traced = job.workload(cell["workload"]).get("source") == "trace"  # open loop at the trace's arrival times
    return LoadModel(
        "trace" if traced else config["model"],
        config.get("rate", 0.0),
        config["think_time"],
        config["protocol"],
        job.seed + cell["repetition"],
        server.headers,
        incremental=stream == "incremental",
        ignore_eos=bool(job.sampling.get("ignore_eos")),
        connections=config.get("connections", "keep-alive"),
    )


def _provenance(
    job: ServerJob,
    environment: dict,
    server: Server,
    argv: list[str],
    env: dict,
    span: tuple[datetime, datetime],
    load: LoadModel,
    measured: list,
    info: dict,
) -> dict:
    """Where a cell was measured: specsweep, the server's software and GPUs, its command, the environment the
    configuration set and what the host gave the server besides (secrets redacted), its start-up, the GPUs it held
    and their memory, when the cell began and ended, the simulator's settings and cost model, the prompts' chat
    template and the server's account of itself."""
    return {
        "specsweep": __version__,
        "backend": job.backend,
        "server": environment["server"],
        "software": environment["software"],
        "gpus": environment["hardware"]["gpus"],
        "command": argv,
        "environment": redact(env),
        # what the host gave the server besides (the platform's variables, those server.pass_env names)
        "host_environment": redact(server.host_env),
        "startup_seconds": server.startup_seconds,
        "gpus_assigned": server.devices,
        "gpu_memory_used_mib": gpu_memory_used(server.devices),
        "started_at": span[0].isoformat(),
        "finished_at": span[1].isoformat(),
        "sim_profile": job.sim,
        # which cost model the simulated server ran (calibration.choose.label); None on a real server
        "cost_model": (job.sim or {}).get("cost_model", {}).get("label"),
        "chat_template": "the server's" if load.protocol == "openai-chat" else measured[0].chat_template.source,
        "load_format": job.model.get("load_format", "auto"),
        "attention_backend": job.method.attention_backend,
        "min_free_slots_delay": min_free_slots_delay(job),
        # SGLang's settings that decide a cell, and the build flags the configuration declares (sglang.extra_flags)
        "server_info": {k: info[k] for k in (*SERVER_INFO_KEYS, *_declared_keys(job)) if k in info},
    }
