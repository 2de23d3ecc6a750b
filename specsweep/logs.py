"""Logging helper for Snakemake scripts: stderr goes to the rule's log and to the console."""

from __future__ import annotations

import sys
from pathlib import Path


class _Tee:
    def __init__(self, *streams):
        self.streams = streams

    def write(self, text):
        for s in self.streams:
            s.write(text)
            s.flush()
        return len(text)

    def flush(self):
        for s in self.streams:
            s.flush()


def to_log(path: str) -> None:
    """Send stderr (tracebacks, progress) to ``path`` as well as to the console."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    sys.stderr = _Tee(open(path, "w", buffering=1), sys.__stderr__)
