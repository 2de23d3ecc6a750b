"""The content-addressed cell cache and each bench job's journal.

The cache keeps every finished cell under its key (see ``cells.cell_key``), outside the DAG, so a rerun after
any change measures only the cells whose key changed. Each bench job appends what it did to its server's journal
of the workflow run (in the cache, outside the DAG): cache hits, server starts and stops, measured and failed
cells. The job's run record (a declared output the report reads) is derived from the server's journals.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .canon import atomic_write_json, canonical_json


class CellCache:
    """Final cells stored under their key, written atomically (temp file + rename).

    An entry is only read here: whoever uses one verifies it first (cells.cell_problem), since anything may have
    changed it since it was written.
    """

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def read(self, key: str) -> tuple[Any, str | None]:
        """(the entry's JSON, None); (None, None) when there is no entry; (None, why) when it cannot be read."""
        try:
            return json.loads(self.path(key).read_text()), None
        except (FileNotFoundError, NotADirectoryError):
            return None, None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:  # writes are atomic: never ours
            return None, f"it cannot be read as JSON (truncated or damaged: {exc})"

    def get(self, key: str) -> Any:
        """The entry's JSON, unverified; None when there is none or it cannot be read."""
        return self.read(key)[0]

    def put(self, key: str, cell: dict) -> None:
        atomic_write_json(self.path(key), cell)


class Journal:
    """Append-only record of what a bench job did (cache hits, measurements, server starts), every event naming
    the workflow run it belongs to."""

    def __init__(self, path: str | Path, run: str | None = None):
        self.path = Path(path)
        self.run = run

    def write(self, event: str, **fields) -> None:
        """Append one event as one line; after a damaged last line (a writer killed mid-line, a full disk) the event
        starts a line of its own, so that only the damaged line is lost."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        run = {"run": self.run} if self.run else {}
        line = canonical_json({"time": time.time(), "event": event, **run, **fields}) + "\n"
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = "\n" + line
            os.write(fd, line.encode())
        finally:
            os.close(fd)


def journal_events(journal: str | Path) -> list[dict]:
    """The events of one journal file, in order; a damaged line (not one JSON object) is skipped with a warning
    naming the file and the line."""
    events = []
    with open(journal, encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError as exc:
                event = exc
            if not (
                isinstance(event, dict)
                and isinstance(event.get("event"), str)
                and isinstance(event.get("time"), (int, float))
            ):
                print(
                    f"warning: journal {journal}, line {number}: damaged ({line.strip()[:60]!r}), skipped",
                    file=sys.stderr,
                    flush=True,
                )
                continue
            events.append(event)
    return events


def journal_runs(journal: str | Path) -> list[dict]:
    """The server runs a journal file completed, in order: {"server", "start", "stop", "cells": [(cell, key), ...]}
    with the cells each run measured or failed between its server_start and server_stop (a run killed before its
    stop is no run)."""
    open_runs, runs = {}, []
    for event in journal_events(journal):
        server = event.get("server")
        if event["event"] == "server_start":
            open_runs[server] = {"server": server, "start": event["time"], "cells": []}
        elif event["event"] == "server_stop" and server in open_runs:
            runs.append({**open_runs.pop(server), "stop": event["time"]})
        elif "cell" in event and event["event"] != "cache_hit" and server in open_runs:
            open_runs[server]["cells"].append((event["cell"], event.get("key")))
    return runs


def server_runs(journal: str | Path) -> dict[str, tuple[float, list[str]]]:
    """Per server, its latest run in a journal file: (seconds from server_start to server_stop, the cells it
    measured or failed in between)."""
    journal = Path(journal)
    if not journal.exists():
        return {}
    return {r["server"]: (r["stop"] - r["start"], [cell for cell, _ in r["cells"]]) for r in journal_runs(journal)}


def write_run_record(path: str | Path, server: str, journal: Journal, keys: set[str]) -> None:
    """A bench job's run record: {"server", "latest_run": {"run", "seconds": start to stop, "cells": the cells it
    measured or failed}}, or a null latest_run.

    The run is this job's own (``journal``), else, when every cell came from the cache, the latest run in the
    server's other journals (other workflow runs, other results folders sharing the cache) whose every cell is one
    of this job's (``keys``: a run of another configuration measured other cells under the same names). A job that
    only copies cached cells writes the same record again, so nothing downstream reruns."""

    def of_this_job(run: dict) -> bool:
        return bool(run["cells"]) and all(key in keys for _, key in run["cells"])

    candidates = []
    for file in sorted(journal.path.parent.glob("*.jsonl")):
        own = file == journal.path
        candidates += [
            (own, r["stop"], file.stem, r)
            for r in journal_runs(file)
            if r["server"] == server and (own or of_this_job(r))
        ]
    latest = max(candidates, key=lambda c: c[:2], default=None)
    atomic_write_json(
        path,
        {
            "server": server,
            "latest_run": None
            if latest is None
            else {
                "run": latest[2],
                "seconds": latest[3]["stop"] - latest[3]["start"],
                "cells": [cell for cell, _ in latest[3]["cells"]],
            },
        },
    )


def read_run_records(paths: Sequence[str | Path]) -> dict[str, tuple[float, list[str]]]:
    """{server: (seconds, cells)} of the latest run recorded for each server in these run records."""
    runs = {}
    for path in paths:
        record = json.loads(Path(path).read_text())
        if record["latest_run"]:
            runs[record["server"]] = (record["latest_run"]["seconds"], record["latest_run"]["cells"])
    return runs
