"""The simulated engine's clock: modelled time on an absolute schedule.

Each engine step has a deadline, the end of the step before it + its modelled seconds / --sim-time-scale, and ends
there whatever the server's own Python work for it took: that work (choosing the batch, emitting the last step's
tokens, streaming them to clients) runs inside the step's modelled time instead of adding to it. A step whose work
is still running at its deadline ends late, when the work is done: it is counted (``steps_late``, and
``late_seconds``, the host's seconds past the deadline) and the next step starts from that moment, so no debt is
carried further. The time past the deadline is lost from the schedule, as a GPU idles while its host is late to
give it work: a server with ``late_seconds`` a noticeable share of ``scheduled_seconds`` ran slower than its cost
model because its host was too busy.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class StepClock:
    """Deadlines of the engine's steps on the host's clock ``now`` (seconds), ``scale`` modelled seconds a second.

    steps = steps scheduled; scheduled_seconds = sum of their modelled seconds / scale; steps_late = steps whose
    work passed their deadline; late_seconds = sum over those steps of (end of their work - deadline)."""

    def __init__(self, scale: float = 1.0, now: Callable[[], float] = time.monotonic):
        self.scale, self.now = scale, now
        self.deadline = now()  # when the step now running ends (the last one's end while idle)
        self.steps = 0
        self.steps_late = 0
        self.late_seconds = 0.0
        self.scheduled_seconds = 0.0

    def restart(self) -> None:
        """The engine wakes from idle: its next step starts now."""
        self.deadline = self.now()

    def step(self, modelled: float) -> float:
        """Schedule a step of ``modelled`` seconds from the end of the last one, after the step's own work; return
        the host's seconds left until its deadline. 0 when the work already passed the deadline: the step is then
        counted late and ends now, where the next one starts."""
        seconds = modelled / self.scale
        self.steps += 1
        self.scheduled_seconds += seconds
        self.deadline += seconds
        now = self.now()
        if now <= self.deadline:
            return self.deadline - now
        self.steps_late += 1
        self.late_seconds += now - self.deadline
        self.deadline = now
        return 0.0

    def report(self) -> dict:
        """The counts since launch, as the server reports them (/server_info's sim_clock)."""
        return {
            "steps": self.steps,
            "steps_late": self.steps_late,
            "late_seconds": self.late_seconds,
            "scheduled_seconds": self.scheduled_seconds,
        }
