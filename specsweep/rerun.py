"""Rerun triggers: what a job depends on, as the params Snakemake compares, and what changed since it last ran.

Snakemake reruns a job when the repr of one of its params differs from the one recorded when its outputs were
made, and a dry run prints both reprs whole. A job's settings (a server job's ServerJob, the configuration the plan
prices) are kilobytes of JSON, so each job's tracked param is ``tracked``: a short summary of the job and the digest
of the canonical JSON of what it depends on, which changes exactly when that JSON does. The job itself reads the
whole value from a param Snakemake does not track (rules/common.smk). Each value is also kept under its digest
(``keep``), so that the next run finds the one its outputs were made with (``digest_in``, from Snakemake's record)
and says in one line what changed (``change_line``): "tp1/ar: sampling.temperature changed".
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .canon import atomic_write_text, canonical_json, digest

DIGEST_CHARS = 32  # 128 bits of SHA-256: no two settings a workflow will ever meet share one
_DIGEST = re.compile(r"settings ([0-9a-f]{%d})\b" % DIGEST_CHARS)
MAX_NAMED = 4  # changed keys named in one line; the rest counted


def settings_digest(value: Any) -> str:
    """The digest of a job's settings: SHA-256 of their canonical JSON, cut to DIGEST_CHARS hex characters."""
    return digest(canonical_json(value))[:DIGEST_CHARS]


def tracked(summary: str, value: Any) -> str:
    """A job's tracked param: '<summary>; settings <digest>'. It changes exactly when the canonical JSON of
    ``value`` does (the summary is a function of the value), so a job reruns when what it depends on changes and
    for nothing else."""
    return f"{summary}; settings {settings_digest(value)}"


def digest_in(recorded: Iterable[str]) -> str | None:
    """The settings digest among a job's recorded params (their reprs, as Snakemake keeps them), or None (its
    outputs were made before the params carried one)."""
    for text in recorded:
        found = _DIGEST.search(text)
        if found:
            return found.group(1)
    return None


def keep(folder: str | Path, value: Any) -> str:
    """Keep ``value`` (JSON) in ``folder`` under its settings digest, once; return the digest."""
    name = settings_digest(value)
    path = Path(folder) / f"{name}.json"
    if not path.exists():
        atomic_write_text(path, canonical_json(value), durable=False)
    return name


def kept(folder: str | Path, name: str) -> Any | None:
    """The value kept under the settings digest ``name``, or None when it is not there or not that value."""
    try:
        value = json.loads((Path(folder) / f"{name}.json").read_text())
    except (OSError, ValueError):
        return None
    return value if settings_digest(value) == name else None


def changed_keys(old: Any, new: Any, path: str = "") -> list[str]:
    """The keys whose values differ between two settings, as a user writes them (sampling.temperature,
    workloads[short].max_new_tokens): mappings key by key, lists of named entries (workloads, methods) by name,
    any other value (a list of concurrency levels) as a whole. A key only one side has is named too."""
    if isinstance(old, dict) and isinstance(new, dict):
        return _mapping_changes(old, new, lambda key: f"{path}.{key}" if path else str(key))
    if _named(old) and _named(new):
        by_name = {item["name"]: item for item in old}, {item["name"]: item for item in new}
        return _mapping_changes(*by_name, lambda name: f"{path}[{name}]")
    return [] if old == new else [path or "the settings"]


def _mapping_changes(old: dict, new: dict, key_path) -> list[str]:
    """changed_keys of two mappings, each key's path written by ``key_path``; a key one side lacks marked
    (added) or (removed)."""
    changes = []
    for key in list(old) + [k for k in new if k not in old]:
        if key in old and key in new:
            changes += changed_keys(old[key], new[key], key_path(key))
        else:
            changes.append(f"{key_path(key)} ({'added' if key in new else 'removed'})")
    return changes


def _named(value: Any) -> bool:
    """A list of mappings each with a distinct string name (workloads, methods)."""
    if not isinstance(value, list) or not value or not all(isinstance(item, dict) for item in value):
        return False
    names = [item.get("name") for item in value]
    return all(isinstance(name, str) for name in names) and len(set(names)) == len(names)


def change_line(label: str, old: Any, new: Any, by: str | None = None) -> str:
    """One line saying what changed in a job's settings: '<label>: a.b, c changed', at most MAX_NAMED keys named
    and the rest counted. ``by``: the values are mappings of several jobs' settings ({server: settings}, ``by``
    naming a job of that kind); a job only one side has is said to be added or removed, and each changed key is
    named once, with the jobs it changed in (or 'every <by>')."""
    parts = []
    if by is None:
        keys = changed_keys(old, new)
    else:
        affected: dict[str, list[str]] = {}
        for name in list(old) + [n for n in new if n not in old]:
            if name not in old or name not in new:
                parts.append(f"{by} {name} {'added' if name not in old else 'removed'}")
                continue
            for key in changed_keys(old[name], new[name]):
                affected.setdefault(key, []).append(name)
        every = set(old) & set(new)
        keys = [
            f"{key} (in {'every ' + by if set(names) == every else ', '.join(names)})"
            for key, names in affected.items()
        ]
    if keys:
        more = f" and {len(keys) - MAX_NAMED} more" if len(keys) > MAX_NAMED else ""
        parts.append(", ".join(keys[:MAX_NAMED]) + more + " changed")
    return f"{label}: {'; '.join(parts) or 'nothing changed'}"
