"""specsweep's own errors that several modules raise: the configuration's (config, methods, jobs, workloads) and a
calibration's (choosing, probing, fitting and making one).

Kept apart from the modules that run the checks, so that each imports them from here.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ConfigError(ValueError):
    """A configuration mistake; the message names the key and what to do."""


class CalibrationError(RuntimeError):
    """A calibration that cannot be made or read; the message names the TP, the server or the file, and what to do.
    A calibration file at fault is ``path``, and what is wrong in it (its key) ``reason``; both None otherwise."""

    def __init__(self, message: str, path: str | None = None, reason: str | None = None):
        super().__init__(message)
        self.path, self.reason = path, reason


class DuplicateKey(ValueError):
    """A key given twice in one JSON object (json keeps the last silently); the argument is the key."""


def unique_pairs(pairs) -> dict:
    """A json object_pairs_hook: the object as a dict, refusing a key given twice (DuplicateKey)."""
    out = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKey(key)
        out[key] = value
    return out


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """'; did you mean <the closest of known>?' for a misspelt name (difflib's closest match, if any is close), else
    ''."""
    close = difflib.get_close_matches(str(name), sorted(map(str, known)), n=1)
    return f"; did you mean {close[0]}?" if close else ""
