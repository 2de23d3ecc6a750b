"""Cells: one measurement end to end, and the content-addressed cell cache.

A cell is one (server, workload, concurrency, repetition) measurement and
produces one JSON file. Its key digests everything that decides its numbers:
the server's parameters, the cell's, the exact prompts, the environment's
identity and HARNESS_VERSION. ``bench_server`` measures only the cells missing
from the cache, starts the server only if one is missing, and then copies
every cell from the cache to the job's outputs.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from dataclasses import replace
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path

import jsonschema
import requests

from . import CELL_SCHEMA_VERSION, HARNESS_VERSION, __version__
from .canon import atomic_write_json, atomic_write_text, canonical_json, digest
from .client import LoadModel, measure
from .config import cells_of_server
from .metrics import acceptance_agreement, cell_metrics, precision_of, relative_precision
from .environment import check_methods
from .gpus import GpuPool, gpu_memory_used, visible_devices, wait_until_released
from .server import (Server, ServerError, api_key_config, free_port, launch_command, min_free_slots_delay, redact,
                     stream_mode)
from .text import approximate_tokens, chat_prompt
from .workloads import build, content_mix, workload_digest

class CellError(RuntimeError):
    """A cell could not be measured; the message names the cell and the cause."""


def cell_schema() -> dict:
    return json.loads(resources.files("specsweep").joinpath("cell.schema.json").read_text())


def validate_cell(cell: dict) -> None:
    """Raise jsonschema.ValidationError if a cell JSON does not follow the cell schema."""
    jsonschema.validate(cell, cell_schema())


def cell_key(server: dict, cell: dict, prompts_digest: str, identity_digest: str) -> str:
    """Content address of a cell: digest of everything that decides its numbers."""
    relevant_server = {k: v for k, v in server.items() if k not in ("workloads", "concurrency", "repetition",
                                                                     "cache_dir", "gpu_pool")}
    relevant_server["server"] = {k: v for k, v in server["server"].items() if k != "startup_timeout"}
    workload = next(w for w in server["workloads"] if w["name"] == cell["workload"])
    return digest({
        "harness": HARNESS_VERSION,
        "server": relevant_server,
        "cell": {"workload": workload, "concurrency": cell["concurrency"], "repetition": cell["repetition"],
                 "requests": cell["requests"], "warmup": server["warmup"]},
        "prompts": prompts_digest,
        "environment": identity_digest,
    })


def cell_sessions(workloads: list[dict], cells: list[dict], seed: int, thinking: bool, model_path: str | None,
                  context_length: int, at_least: int = 0) -> dict:
    """{workload: sessions} built once for the largest of its cells (or ``at_least``); a cell's sessions are the
    first ``requests`` of them, the same for every count (build keeps a fixed order)."""
    return {w["name"]: build(dict(w, requests=max([c["requests"] for c in cells if c["workload"] == w["name"]]
                                                  + [at_least])), seed, thinking, model_path, context_length)
            for w in workloads if any(c["workload"] == w["name"] for c in cells)}


def cell_digest(sessions: dict, cell: dict) -> str:
    """Digest of exactly the sessions a cell sends."""
    return workload_digest(sessions[cell["workload"]][:cell["requests"]])


class CellCache:
    """Finished cells stored under their key, written atomically (temp file + rename)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict | None:
        try:
            return json.loads(self.path(key).read_text())
        except (FileNotFoundError, NotADirectoryError):
            return None
        except json.JSONDecodeError:  # never written by us (writes are atomic); treat as missing
            return None

    def put(self, key: str, cell: dict) -> None:
        atomic_write_json(self.path(key), cell)


class Journal:
    """Append-only record of what bench jobs did (cache hits, measurements, server starts)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def write(self, event: str, **fields) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = canonical_json({"time": time.time(), "event": event, **fields}) + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)


def parse_prometheus(text: str) -> dict[str, float]:
    """Sum of each metric's samples over labels, from Prometheus text format."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)", line)
        if match:
            try:
                out[match.group(1)] = out.get(match.group(1), 0.0) + float(match.group(3))
            except ValueError:
                continue
    return out


def scrape(url: str, headers: dict | None = None) -> dict[str, float]:
    try:
        resp = requests.get(url + "/metrics", timeout=10, headers=headers)
        return parse_prometheus(resp.text) if resp.status_code == 200 else {}
    except requests.RequestException:
        return {}


def server_info(url: str, headers: dict | None = None) -> dict:
    """The server's /server_info (or /get_server_info) answer; {} when it has none."""
    for path in ("/server_info", "/get_server_info"):  # the second is SGLang's deprecated spelling
        try:
            resp = requests.get(url + path, timeout=10, headers=headers)
            if resp.status_code == 200:
                return resp.json()
        except (requests.RequestException, ValueError):
            continue
    return {}


def server_cumulative_acceptance(info: dict) -> float | None:
    """internal_states[0].avg_spec_accept_length from server info (cumulative since launch)."""
    states = info.get("internal_states") or [{}]
    return states[0].get("avg_spec_accept_length")


# What the report and provenance keep of the server's own account of its settings.
SERVER_INFO_KEYS = ("version", "attention_backend", "prefill_attention_backend", "decode_attention_backend",
                    "sampling_backend", "page_size", "disable_overlap_schedule", "max_running_requests",
                    "min_free_slots_delay", "incremental_streaming_output", "load_format", "speculative_algorithm",
                    "speculative_num_draft_tokens", "cuda_graph_max_bs", "context_length", "mem_fraction_static")


class LoadSampler:
    """Samples the server's running and queued requests (Prometheus gauges) while a cell is measured.

    Server running requests = time-weighted mean (over samples every ``interval`` s) and peak of
    sglang:num_running_reqs; queued likewise from sglang:num_queue_reqs.
    """

    def __init__(self, url: str, headers: dict | None = None, interval: float = 0.5):
        self.url, self.headers, self.interval = url, headers, interval
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=15)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):  # the first sample one interval in, once requests are out
            values = scrape(self.url, self.headers)
            if "sglang:num_running_reqs" in values:
                self.samples.append((values["sglang:num_running_reqs"], values.get("sglang:num_queue_reqs", 0.0)))

    def summary(self) -> dict:
        if not self.samples:
            return {"samples": 0}
        running = [r for r, _ in self.samples]
        queued = [q for _, q in self.samples]
        return {"samples": len(self.samples), "interval_s": self.interval,
                "running_mean": sum(running) / len(running), "running_peak": max(running),
                "queued_mean": sum(queued) / len(queued), "queued_peak": max(queued)}


class Progress:
    """Progress lines in a server job's log: cell i of N, requests done, time left estimated from the plan.

    Time left = (the plan's seconds for the rest of this cell and the cells still to measure after it) x
    (measured / planned seconds of the cells finished so far, 1 before the first), printed when a cell starts
    and ends and at most every ``every`` seconds in between. Cells taken from the cache cost nothing.
    """

    def __init__(self, server: str, cells: list[dict], todo: list[dict], planned: dict[str, float] | None = None,
                 every: float = 10.0, out=None):
        self.server, self.cells, self.todo, self.planned = server, cells, todo, planned or {}
        self.every, self.out = every, out or sys.stderr
        self.cell, self.done, self.total = todo[0] if todo else None, 0, 0
        self.measured = self.planned_done = 0.0
        self.cell_started = self.last = 0.0

    def start(self, cell: dict, total_requests: int) -> None:
        self.cell, self.done, self.total = cell, 0, total_requests
        self.cell_started = self.last = time.monotonic()
        self._print("started")

    def request_done(self, *_) -> None:
        self.done += 1
        if time.monotonic() - self.last >= self.every and self.done < self.total:
            self._print("")

    def finish(self) -> None:
        seconds = time.monotonic() - self.cell_started
        planned = self.planned.get(self.cell["output"])
        if planned:
            self.measured += seconds
            self.planned_done += planned
        self._print(f"finished in {seconds:.0f} s")

    def time_left(self) -> float | None:
        if self.cell["output"] not in self.planned:
            return None
        share = 1 - self.done / self.total if self.total else 1
        later = self.todo[self.todo.index(self.cell) + 1:]
        scale = self.measured / self.planned_done if self.planned_done else 1.0
        return scale * (self.planned[self.cell["output"]] * share +
                        sum(self.planned.get(c["output"], 0.0) for c in later))

    def _print(self, note: str) -> None:
        self.last = time.monotonic()
        cell, left = self.cell, self.time_left()
        eta = f"; about {_duration(left)} left for this server (plan)" if left is not None else ""
        print(f"[{self.server}] cell {self.cells.index(cell) + 1} of {len(self.cells)} ({cell['workload']}, "
              f"concurrency {cell['concurrency']}; {self.todo.index(cell) + 1} of {len(self.todo)} to measure): "
              f"{self.done}/{self.total} requests done{eta}" + (f"; {note}" if note else ""),
              file=self.out, flush=True)


def _duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 3600} h {seconds % 3600 // 60} min" if seconds >= 3600 else (
        f"{seconds // 60} min {seconds % 60} s" if seconds >= 60 else f"{seconds} s")


def counter_deltas(before: dict, after: dict) -> dict:
    """Server counters differenced over the measurement window (never cumulative values)."""
    return {k: after[k] - before.get(k, 0.0) for k in after if k.endswith("_total")}


def _max_context(params: dict, sessions_by_workload: dict) -> int:
    """--context-length: the model's (every workload was checked to fit); the simulator, whose tokenizer is
    approximate, gets room for its own count of the longest session."""
    if params["backend"] == "sglang":
        return params["model"]["context_length"]
    longest = 0
    for name, sessions in sessions_by_workload.items():
        for s in sessions:
            text = chat_prompt(s.messages + s.followups)
            longest = max(longest, approximate_tokens(text) + s.max_new_tokens * (1 + len(s.followups)))
    return max(params["model"]["context_length"], int(longest * 1.25))


def bench_server(params: dict, outputs: list[str], environment: dict, log_dir: str | Path,
                 journal_path: str | Path, all_methods: list[dict] | None = None,
                 planned=None) -> dict:
    """Produce every cell output of one server, measuring only what the cache lacks.

    ``all_methods`` (every configured method) are checked against the server's capabilities first, so that
    any job stops the workflow before a server starts. ``planned(sessions)`` returns {cell output: predicted
    seconds} for the progress lines' time left; it is asked only when a cell is to be measured, once the
    workloads are built. Returns {"hits": n, "measured": n, "server_started": bool}.
    """
    tp, method = params["tp"], params["method"]
    check_methods(all_methods or [method], environment)
    server_name = f"tp{tp}/{method['name']}" + ("" if params["repetition"] is None else f"/r{params['repetition']}")
    journal = Journal(journal_path)
    cache = CellCache(params["cache_dir"])
    thinking = params["sampling"].get("thinking", False)
    config_like = {"workloads": params["workloads"], "concurrency": params["concurrency"], "load": params["load"]}
    cells = cells_of_server(config_like, tp, method["name"], params["repetition"])
    by_path = {os.path.normpath(out): out for out in outputs}  # outputs matched to cells by path, not position
    unmatched = [c["path"] for c in cells if os.path.normpath(c["path"]) not in by_path]
    if unmatched or len(cells) != len(outputs):
        raise CellError(f"server {server_name}: the job's {len(outputs)} outputs do not match its {len(cells)} cells "
                        f"(no output for {', '.join(unmatched[:3]) or 'none'}): the rule's outputs and "
                        "config.cell_path must name the same files")
    adaptive = params.get("adaptive")
    sessions = cell_sessions(params["workloads"], cells, params["seed"], thinking, params["model"].get("path"),
                             params["model"]["context_length"], adaptive["max_requests"] if adaptive else 0)
    for cell in cells:
        cell["output"] = by_path[os.path.normpath(cell["path"])]
        cell["digest"] = cell_digest(sessions, cell)
        cell["key"] = cell_key(params, cell, cell["digest"], environment["identity_digest"])
    missing = [c for c in cells if cache.get(c["key"]) is None]
    for c in cells:
        if c not in missing:
            journal.write("cache_hit", server=server_name, cell=c["output"], key=c["key"])
    started = False
    if missing:
        _check_writable(cache.root, "cache_dir")
        pool_config = params["gpu_pool"]
        devices = visible_devices(pool_config["devices"]) if params["backend"] == "sglang" or pool_config["devices"] else []
        with ExitStack() as stack:
            gpus = None
            if devices:
                pool = GpuPool(Path(pool_config["lock_dir"]) / socket.gethostname(), devices)
                need = len(devices) if pool_config["exclusive"] else tp
                print(f"server {server_name}: waiting for {need} GPU(s) from the pool", file=sys.stderr, flush=True)
                gpus = stack.enter_context(pool.acquire(need, holder=server_name))
            log_path = Path(log_dir) / f"server-tp{tp}-{method['name']}.log"
            secrets = stack.enter_context(tempfile.TemporaryDirectory(prefix="specsweep-"))
            extra_args, headers = api_key_config(params["server"].get("api_key_env"), secrets)
            previous = signal.signal(signal.SIGTERM, _raise_interrupt)
            server = None
            try:
                journal.write("server_start", server=server_name, gpus=gpus, offered=devices)
                started = True
                try:
                    server, argv, env = start_server(params, sessions, environment, log_path, gpus, extra_args, headers)
                except ServerError as exc:
                    for cell in missing:
                        record_failure(cell, exc, None, journal, server_name)
                    raise
                progress = Progress(server_name, cells, missing, planned(sessions) if planned else None)
                for cell in missing:
                    try:
                        result = measure_cell(server, params, cell, sessions[cell["workload"]], cell["digest"],
                                              environment, argv, env, progress)
                    except Exception as exc:
                        record_failure(cell, exc, server, journal, server_name)
                        raise
                    try:
                        cache.put(cell["key"], result)
                    except OSError as exc:
                        raise CellError(f"cell {cell['output']}: cannot write the cell cache under "
                                        f"{params['cache_dir']} ({exc.strerror or exc}); free space or fix the folder "
                                        "(cache_dir), then rerun: cells already cached are kept") from exc
                    clear_failure(cell)
                    journal.write("measured", server=server_name, cell=cell["output"], key=cell["key"])
            finally:
                if server is not None:
                    server.stop()
                    if gpus and params["backend"] == "sglang":
                        wait_until_released(gpus)
                journal.write("server_stop", server=server_name)
                signal.signal(signal.SIGTERM, previous)
    for cell in cells:  # the cache holds each cell exactly as an output must be: copy it
        atomic_write_text(cell["output"], cache.path(cell["key"]).read_text())
    return {"hits": len(cells) - len(missing), "measured": len(missing), "server_started": started}


def _check_writable(folder: Path, key: str) -> None:
    """Fail before a server starts if results could not be stored."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".probe-"):
            pass
    except OSError as exc:
        raise CellError(f"cannot write to {folder} ({key}): {exc.strerror or exc}; fix the folder or point {key} "
                        "elsewhere, then rerun") from exc


def start_server(params: dict, sessions: dict, environment: dict, log_path: Path, gpus, extra_args: list[str],
                 headers: dict, attempts: int = 3, first_port: int | None = None):
    """Start the server on a free port; if the port was taken meanwhile, try another (up to ``attempts``)."""
    host = params["server"]["host"]
    context = _max_context(params, sessions)
    # the probed build's flags, else (no probe) the recorded table
    offered = set(environment.get("capabilities", {}).get("flags") or ()) or None
    if offered and environment["backend"] == "sim":  # the simulator accepts every flag a config declares
        offered |= {extra["flag"] for extra in params["sglang"]["extra_flags"]}
    for attempt in range(attempts):
        port = first_port if (first_port and attempt == 0) else free_port(host)
        argv, env = launch_command(params, port, context, environment.get("python"), offered)
        if offered:
            unknown = [a for a in argv if a.startswith("--") and a.split("=")[0] not in offered]
            if unknown:
                raise ServerError(f"the installed {environment['backend']} build does not offer {', '.join(unknown)} "
                                  f"(checked against its --help); fix the flags (server.flags, the method's flags or "
                                  "the algorithms spelling) or install a build that has them")
        argv += extra_args
        server = Server(argv, env, host, port, log_path, devices=gpus, headers=headers)
        try:
            server.start(params["server"]["startup_timeout"])
            return server, argv, env
        except ServerError as exc:
            server.stop()
            taken = "address already in use" in str(exc).lower() or "errno 98" in str(exc).lower()
            if not taken or attempt == attempts - 1:
                raise
            print(f"port {port} was taken; retrying on another port", file=sys.stderr, flush=True)
    raise AssertionError("unreachable")


def failure_path(cell: dict) -> Path:
    """Where a failed cell's record goes: results/failed/... mirroring its output path."""
    return Path(cell["output"].replace("results/cells/", "results/failed/", 1))


def record_failure(cell: dict, exc: BaseException, server, journal: Journal, server_name: str) -> None:
    """Record a failed cell with its cause and the server log's tail (kept until the cell succeeds)."""
    record = {"cell": {k: cell[k] for k in ("tp", "method", "workload", "concurrency", "repetition")},
              "key": cell["key"], "cause": f"{type(exc).__name__}: {exc}",
              "server_log_tail": server.log_tail(40) if server is not None else None,
              "time": datetime.now(timezone.utc).isoformat()}
    try:
        atomic_write_json(failure_path(cell), record)
    except OSError:
        pass
    journal.write("cell_failed", server=server_name, cell=cell["output"], cause=record["cause"])


def clear_failure(cell: dict) -> None:
    try:
        failure_path(cell).unlink()
    except FileNotFoundError:
        pass


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def measure_adaptive(server, sessions: list, first: int, adaptive: dict, concurrency: int, sampling: dict,
                     timeout: float, thinking: bool, load, seed: int, on_record=None) -> tuple[list[dict], dict]:
    """One closed loop that keeps starting sessions (first the cell's ``first``, then checks every ``batch``
    finished requests) until the relative 95% CI half-width of the metric is at most ``target`` or ``max_requests``
    sessions were started; the sessions under way then finish. A check without an interval (too few sessions, or
    zero width) never stops it. Returns the records and the precision, recomputed on every record."""
    cap = min(adaptive["max_requests"], len(sessions))
    state = {"started": 0, "next_check": first, "reason": "request cap", "at_stop": None}

    def stop(records) -> bool:
        if state["started"] >= cap:
            return True
        if state["started"] >= first and len(records) >= state["next_check"]:
            state["next_check"] = len(records) + adaptive["batch"]
            achieved = relative_precision([r.as_dict() for r in records], adaptive["metric"], concurrency,
                                          load.model, seed)
            state["at_stop"] = achieved
            if achieved is not None and achieved <= adaptive["target"]:
                state["reason"] = "target reached"
                return True
        state["started"] += 1
        return False

    records = [r.as_dict() for r in measure(server.url, sessions[:cap], concurrency, sampling, timeout, thinking,
                                            server.alive, load, on_record=on_record, stop=stop)]
    achieved = relative_precision(records, adaptive["metric"], concurrency, load.model, seed)
    return records, {"metric": adaptive["metric"], "adaptive": True, "target": adaptive["target"],
                     "achieved": achieved, "achieved_at_last_check": state["at_stop"], "requests": state["started"],
                     "stopped": state["reason"]}


def measure_cell(server: Server, params: dict, cell: dict, sessions: list, prompts_digest: str,
                 environment: dict, argv: list[str], env: dict, progress: Progress | None = None) -> dict:
    """Measure one cell on a running server and return its JSON (validated)."""
    where = f"cell {cell['output']}"
    server.check_alive(f"before {where}")
    workload = next(w for w in params["workloads"] if w["name"] == cell["workload"])
    sampling = {"temperature": params["sampling"]["temperature"], "top_p": params["sampling"]["top_p"]}
    thinking = params["sampling"].get("thinking", False)
    timeout = params["server"]["request_timeout"]
    try:
        requests.post(server.url + "/flush_cache", timeout=30, headers=server.headers)
    except requests.RequestException:
        pass
    began = datetime.now(timezone.utc)
    load_config = params["load"]
    stream = stream_mode(argv, load_config["protocol"])
    load = LoadModel(load_config["model"], load_config.get("rate", 0.0), load_config["think_time"],
                     load_config["protocol"], params["seed"] + cell["repetition"], server.headers,
                     incremental=stream == "incremental", ignore_eos=bool(params["sampling"].get("ignore_eos")),
                     connections=load_config.get("connections", "keep-alive"))
    if params["warmup"]:
        warm = build(dict(workload, name=workload["name"] + "-warmup", requests=params["warmup"]), params["seed"],
                     thinking, params["model"].get("path"), params["model"]["context_length"])
        # the cell's protocol, stream and connections, as a closed loop without think time
        measure(server.url, warm, cell["concurrency"], sampling, timeout, thinking, server.alive,
                replace(load, model="closed", rate=0.0, think_time=0.0, seed=0))
        server.check_alive(f"after warm-up of {where}")
    before = scrape(server.url, server.headers)
    adaptive = params.get("adaptive")
    measured = sessions[:cell["requests"]]  # the cell's own sessions (an adaptive cell may go on past them)
    if progress is not None:
        progress.start(cell, adaptive["max_requests"] if adaptive else sum(1 + len(s.followups) for s in measured))
    on_record = progress.request_done if progress is not None else None
    with LoadSampler(server.url, server.headers) as sampler:
        if adaptive:
            records, precision = measure_adaptive(server, sessions, cell["requests"], adaptive,
                                                  cell["concurrency"], sampling, timeout, thinking, load,
                                                  params["seed"], on_record)
        else:
            records, precision = measure(server.url, measured, cell["concurrency"], sampling, timeout, thinking,
                                         server.alive, load, on_record=on_record), None
    if progress is not None:
        progress.finish()
    after = scrape(server.url, server.headers)
    info = server_info(server.url, server.headers)
    cumulative = server_cumulative_acceptance(info)
    ended = datetime.now(timezone.utc)
    server.check_alive(f"after {where}")
    records = [r if isinstance(r, dict) else r.as_dict() for r in records]
    deltas = counter_deltas(before, after)
    metrics = cell_metrics(records, params["tp"], cell["concurrency"], load.model, seed=params["seed"])
    verify = deltas.get("sglang:spec_verify_calls_total", 0.0)
    done = metrics["requests_completed"]
    metrics["acceptance_length_server"] = (
        (deltas.get("sglang:generation_tokens_total", 0.0) - done) / verify if verify else None)
    metrics["acceptance_agreement"] = acceptance_agreement({
        k: metrics[k] for k in ("acceptance_length", "acceptance_length_server", "tokens_per_chunk")})
    # The server's own average is cumulative since launch (warm-up and earlier cells included):
    # kept for reference only, never used as the cell's value.
    metrics["server_cumulative_accept_length_not_used"] = cumulative
    kinds = content_mix(measured)
    result = {
        "schema_version": CELL_SCHEMA_VERSION,
        "harness_version": HARNESS_VERSION,
        "simulated": bool(environment["simulated"]),
        "key": cell["key"],
        "cell": {k: cell[k] for k in ("tp", "method", "workload", "concurrency", "repetition")},
        "method": params["method"],
        "model": params["model"],
        "workload": {"name": workload["name"], "family": workload["family"], "digest": prompts_digest,
                     "sessions": cell["requests"], "warmup": params["warmup"], "content_mix": kinds,
                     "max_new_tokens": workload["max_new_tokens"]},
        "sampling": dict(params["sampling"]),
        "load": {**params["load"], "stream": stream},
        "seed": params["seed"],
        "provenance": {
            "specsweep": __version__,
            "backend": params["backend"],
            "server": environment["server"],
            "software": environment["software"],
            "gpus": environment["hardware"]["gpus"],
            "command": argv,
            "environment": redact(env),
            "startup_seconds": server.startup_seconds,
            "gpus_assigned": server.devices,
            "gpu_memory_used_mib": gpu_memory_used(server.devices),
            "started_at": began.isoformat(),
            "finished_at": ended.isoformat(),
            "sim_profile": params.get("sim"),
            "load_format": params["model"].get("load_format", "auto"),
            "attention_backend": params["method"].get("attention_backend"),
            "min_free_slots_delay": min_free_slots_delay(params),
            "server_info": {k: info[k] for k in SERVER_INFO_KEYS if k in info},
        },
        "server_counters": deltas,
        "server_load": sampler.summary(),
        "metrics": metrics,
        "precision": precision or {"metric": "output_throughput", "adaptive": False,
                                   "achieved": precision_of(metrics["output_throughput"],
                                                            metrics["output_throughput_ci"])},
        "requests": records,
    }
    result = json.loads(json.dumps(result, allow_nan=False))
    validate_cell(result)
    return result
