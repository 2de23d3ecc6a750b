"""The content-addressed cell cache and each bench job's journal.

The cache keeps every finished cell under its key (see ``cells.cell_key``), outside the DAG, so a rerun after
any change measures only the cells whose key changed. Each bench job appends what it did to its own journal
(declared as the job's log): cache hits, server starts and stops, measured and failed cells. The job's run
record (a declared output the report reads) is derived from that journal.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

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

    def read(self, key: str) -> tuple[object, str | None]:
        """(the entry's JSON, None); (None, None) when there is no entry; (None, why) when it cannot be read."""
        try:
            return json.loads(self.path(key).read_text()), None
        except (FileNotFoundError, NotADirectoryError):
            return None, None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:  # writes are atomic: never ours
            return None, f"it cannot be read as JSON (truncated or damaged: {exc})"

    def get(self, key: str) -> object | None:
        """The entry's JSON, unverified; None when there is none or it cannot be read."""
        return self.read(key)[0]

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


def server_runs(journal: str | Path) -> dict[str, tuple[float, list[str]]]:
    """Per server, its latest run in a journal: (seconds from server_start to server_stop, the cells it measured
    or failed in between)."""
    journal = Path(journal)
    if not journal.exists():
        return {}
    open_runs, runs = {}, {}
    for line in journal.read_text().splitlines():
        event = json.loads(line)
        server = event.get("server")
        if event["event"] == "server_start":
            open_runs[server] = (event["time"], [])
        elif event["event"] == "server_stop" and server in open_runs:
            start, cells = open_runs.pop(server)
            runs[server] = (event["time"] - start, cells)
        elif "cell" in event and event["event"] != "cache_hit" and server in open_runs:
            open_runs[server][1].append(event["cell"])
    return runs


def write_run_record(path: str | Path, server: str, journal: Journal) -> None:
    """A bench job's run record: the server's latest run in its journal (this job's, or an earlier one when every
    cell came from the cache), as {"seconds": start to stop, "cells": the cells that run measured or failed}, or
    null. A job that only copies cached cells writes the same record again, so nothing downstream reruns."""
    latest = server_runs(journal.path).get(server)
    atomic_write_json(path, {"server": server,
                             "latest_run": {"seconds": latest[0], "cells": latest[1]} if latest else None})


def read_run_records(paths: list[str | Path]) -> dict[str, tuple[float, list[str]]]:
    """{server: (seconds, cells)} of the latest run recorded for each server in these run records."""
    runs = {}
    for path in paths:
        record = json.loads(Path(path).read_text())
        if record["latest_run"]:
            runs[record["server"]] = (record["latest_run"]["seconds"], record["latest_run"]["cells"])
    return runs
