"""One bench job: every cell of one server (tp, method[, repetition]), measuring only what the cache lacks.

The job checks every configured method against the installed server, matches its outputs to its cells by path,
starts the server only if a cell is missing from the cache (holding its GPUs from the pool), measures the missing
cells one by one, records each failure beside the outputs and in the job's journal, always stops the server, and
copies every cell from the cache to its output.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
from contextlib import ExitStack
from datetime import datetime, timezone
from pathlib import Path

from .cache import CellCache, Journal, write_run_record
from .canon import atomic_write_json, atomic_write_text
from .cells import CellError, cell_digest, cell_key, cell_sessions, measure_cell
from .jobs import ServerJob, cells_of_server
from .environment import check_methods
from .gpus import GpuPool, lock_folder, visible_devices, wait_until_released
from . import layout, runs
from .layout import failure_path
from .launcher import ApiKeyFile, Server, ServerError, free_port, launch_command
from .text import approximate_tokens, chat_prompt


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


def _max_context(job: ServerJob, sessions_by_workload: dict) -> int:
    """--context-length: the model's (every workload was checked to fit); the simulator, whose tokenizer is
    approximate, gets room for its own count of the longest session."""
    if job.backend == "sglang":
        return job.model["context_length"]
    longest = 0
    for name, sessions in sessions_by_workload.items():
        for s in sessions:
            text = chat_prompt(s.messages + s.followups)
            longest = max(longest, approximate_tokens(text) + s.max_new_tokens * (1 + len(s.followups)))
    return max(job.model["context_length"], int(longest * 1.25))


def bench_server(job: ServerJob, outputs: list[str], environment: dict, log_dir: str | Path,
                 run_record: str | Path | None = None, all_methods: list[dict] | None = None,
                 planned=None) -> dict:
    """Produce every cell output of one server, measuring only what the cache lacks.

    ``all_methods`` (every configured method) are checked against the server's capabilities first, so that
    any job stops the workflow before a server starts. ``planned(sessions)`` returns {cell output: predicted
    seconds} for the progress lines' time left; it is asked only when a cell is to be measured, once the
    workloads are built. What the job does goes to the server's journal (layout.journal_path, in the cache);
    ``run_record`` (the job's declared output) gets its run record. Returns {"hits": n, "measured": n,
    "server_started": bool}.
    """
    tp, method = job.tp, job.method
    check_methods(all_methods or [method], environment)
    server_name = job.name
    run = runs.current()
    journal = Journal(layout.journal_path(job.cache_dir, tp, method["name"], job.repetition, run), run)
    cache = CellCache(job.cache_dir)
    thinking = job.sampling.get("thinking", False)
    config_like = {"workloads": job.workloads, "concurrency": job.concurrency, "load": job.load}
    cells = cells_of_server(config_like, tp, method["name"], job.repetition)
    by_path = {os.path.normpath(out): out for out in outputs}  # outputs matched to cells by path, not position
    unmatched = [c["path"] for c in cells if os.path.normpath(c["path"]) not in by_path]
    if unmatched or len(cells) != len(outputs):
        raise CellError(f"server {server_name}: the job's {len(outputs)} outputs do not match its {len(cells)} cells "
                        f"(no output for {', '.join(unmatched[:3]) or 'none'}): the rule's outputs and "
                        "layout.cell_path must name the same files")
    adaptive = job.adaptive
    sessions = cell_sessions(job.workloads, cells, job.seed, thinking, job.model.get("path"),
                             job.model["context_length"], adaptive["max_requests"] if adaptive else 0)
    for cell in cells:
        cell["output"] = by_path[os.path.normpath(cell["path"])]
        cell["digest"] = cell_digest(sessions, cell)
        cell["key"] = cell_key(job, cell, cell["digest"], environment["identity_digest"])
    missing = [c for c in cells if cache.get(c["key"]) is None]
    for c in cells:
        if c not in missing:
            journal.write("cache_hit", server=server_name, cell=c["output"], key=c["key"])
    started = False
    with ExitStack() as stack:
        gpus = None
        if missing:
            _check_writable(cache.root, "cache_dir")
            pool_config = job.gpu_pool
            pooled = job.backend == "sglang" or pool_config["devices"]
            devices = visible_devices(pool_config["devices"]) if pooled else []
            if devices:
                pool = GpuPool(lock_folder(pool_config["lock_dir"]), devices)
                need = len(devices) if pool_config["exclusive"] else tp
                print(f"server {server_name}: waiting for {need} GPU(s) from the pool", file=sys.stderr, flush=True)
                gpus = stack.enter_context(pool.acquire(need, holder=server_name))
                for cell in [c for c in missing if cache.get(c["key"]) is not None]:  # measured by another run
                    missing.remove(cell)                                               # while this one waited
                    journal.write("cache_hit", server=server_name, cell=cell["output"], key=cell["key"])
        if missing:
            log_path = Path(log_dir) / layout.server_log_name(tp, method["name"])
            previous = signal.signal(signal.SIGTERM, _raise_interrupt)
            stack.callback(signal.signal, signal.SIGTERM, previous)
            key = stack.enter_context(ApiKeyFile(job.server.get("api_key_env")))
            server = None
            try:
                journal.write("server_start", server=server_name, gpus=gpus, offered=devices)
                started = True
                try:
                    server, argv, env = start_server(job, sessions, environment, log_path, gpus, key.args, key.headers)
                except ServerError as exc:
                    for cell in missing:
                        record_failure(cell, exc, None, journal, server_name)
                    raise
                key.remove()  # the server read it when it started
                progress = Progress(server_name, cells, missing, planned(sessions) if planned else None)
                for cell in missing:
                    try:
                        result = measure_cell(server, job, cell, sessions[cell["workload"]], cell["digest"],
                                              environment, argv, env, progress).as_dict()
                    except Exception as exc:
                        record_failure(cell, exc, server, journal, server_name)
                        raise
                    try:
                        cache.put(cell["key"], result)
                    except OSError as exc:
                        raise CellError(f"cell {cell['output']}: cannot write the cell cache under "
                                        f"{job.cache_dir} ({exc.strerror or exc}); free space or fix the folder "
                                        "(cache_dir), then rerun: cells already cached are kept") from exc
                    clear_failure(cell)
                    journal.write("measured", server=server_name, cell=cell["output"], key=cell["key"])
            finally:
                if server is not None:
                    server.stop()
                    if gpus and job.backend == "sglang":
                        wait_until_released(gpus)
                journal.write("server_stop", server=server_name)
    for cell in cells:  # the cache holds each cell exactly as an output must be: copy it
        atomic_write_text(cell["output"], cache.path(cell["key"]).read_text())
    done = {"hits": len(cells) - len(missing), "measured": len(missing), "server_started": started}
    if run_record is not None:
        write_run_record(run_record, server_name, journal, {c["key"] for c in cells})
    return done


def _check_writable(folder: Path, key: str) -> None:
    """Fail before a server starts if results could not be stored."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".probe-"):
            pass
    except OSError as exc:
        raise CellError(f"cannot write to {folder} ({key}): {exc.strerror or exc}; fix the folder or point {key} "
                        "elsewhere, then rerun") from exc


def start_server(job: ServerJob, sessions: dict, environment: dict, log_path: Path, gpus, extra_args: list[str],
                 headers: dict, attempts: int = 3, first_port: int | None = None):
    """Start the server on a free port; if the port was taken meanwhile, try another (up to ``attempts``)."""
    host = job.server["host"]
    context = _max_context(job, sessions)
    # the probed build's flags, else (no probe) the recorded table
    offered = set(environment.get("capabilities", {}).get("flags") or ()) or None
    if offered and environment["backend"] == "sim":  # the simulator accepts every flag a config declares
        offered |= {extra["flag"] for extra in job.sglang["extra_flags"]}
    for attempt in range(attempts):
        port = first_port if (first_port and attempt == 0) else free_port(host)
        argv, env = launch_command(job, port, context, environment.get("python"), offered)
        if offered:
            unknown = [a for a in argv if a.startswith("--") and a.split("=")[0] not in offered]
            if unknown:
                raise ServerError(f"the installed {environment['backend']} build does not offer {', '.join(unknown)} "
                                  f"(checked against its --help); fix the flags (server.flags, the method's flags or "
                                  "the algorithms spelling) or install a build that has them")
        argv += extra_args
        server = Server(argv, env, host, port, log_path, devices=gpus, headers=headers)
        try:
            server.start(job.server["startup_timeout"])
            return server, argv, env
        except ServerError as exc:
            server.stop()
            taken = "address already in use" in str(exc).lower() or "errno 98" in str(exc).lower()
            if not taken or attempt == attempts - 1:
                raise
            print(f"port {port} was taken; retrying on another port", file=sys.stderr, flush=True)
    raise AssertionError("unreachable")


def record_failure(cell: dict, exc: BaseException, server, journal: Journal, server_name: str) -> None:
    """Record a failed cell with its cause and the server log's tail (kept until the cell succeeds)."""
    record = {"cell": {k: cell[k] for k in ("tp", "method", "workload", "concurrency", "repetition")},
              "key": cell["key"], "cause": f"{type(exc).__name__}: {exc}",
              "server_log_tail": server.log_tail(40) if server is not None else None,
              "time": datetime.now(timezone.utc).isoformat()}
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
