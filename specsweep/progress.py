"""A server job's progress in its log: which cell, how many requests done, how long the rest should take."""

from __future__ import annotations

import sys
import time


class Progress:
    """Progress lines in a server job's log: cell i of N, requests done, time left estimated from the plan.

    Time left = (the plan's seconds for the rest of this cell and the cells still to measure after it) x
    (measured / planned seconds of the cells finished so far, 1 before the first), printed when a cell starts
    and ends and at most every ``every`` seconds in between. Cells taken from the cache cost nothing.
    """

    def __init__(
        self,
        server: str,
        cells: list[dict],
        todo: list[dict],
        planned: dict[str, float] | None = None,
        every: float = 10.0,
        out=None,
    ):
        self.server, self.cells, self.todo, self.planned = server, cells, todo, planned or {}
        self.every, self.out = every, out or sys.stderr
        self.cell: dict = todo[0] if todo else {}
        self.done = self.total = 0
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
        later = self.todo[self.todo.index(self.cell) + 1 :]
        scale = self.measured / self.planned_done if self.planned_done else 1.0
        return scale * (
            self.planned[self.cell["output"]] * share + sum(self.planned.get(c["output"], 0.0) for c in later)
        )

    def _print(self, note: str) -> None:
        self.last = time.monotonic()
        cell, left = self.cell, self.time_left()
        eta = f"; about {_duration(left)} left for this server (plan)" if left is not None else ""
        print(
            f"[{self.server}] cell {self.cells.index(cell) + 1} of {len(self.cells)} ({cell['workload']}, "
            f"concurrency {cell['concurrency']}; {self.todo.index(cell) + 1} of {len(self.todo)} to measure): "
            f"{self.done}/{self.total} requests done{eta}" + (f"; {note}" if note else ""),
            file=self.out,
            flush=True,
        )


def _duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return (
        f"{seconds // 3600} h {seconds % 3600 // 60} min"
        if seconds >= 3600
        else (f"{seconds // 60} min {seconds % 60} s" if seconds >= 60 else f"{seconds} s")
    )
