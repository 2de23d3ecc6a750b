"""Canonical JSON, digests, atomic file writes and the package's YAML data, shared by every stage."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no whitespace: equal values give equal text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def yaml_data(text: str) -> Any:
    """YAML the package or a tool wrote (safe loading, with libyaml where PyYAML has it: ten times quicker, and every
    process of a run reads these files). Users' configuration files go through config.read_config_file instead."""
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def digest(value: Any) -> str:
    """SHA-256 (hex) of the canonical JSON of a value, or of bytes/str as given."""
    if isinstance(value, bytes):
        data = value
    elif isinstance(value, str):
        data = value.encode()
    else:
        data = canonical_json(value).encode()
    return hashlib.sha256(data).hexdigest()


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _current_umask()


def atomic_write_text(path: str | os.PathLike, text: str, durable: bool = True) -> None:
    """Write a file so that readers see either nothing or the whole text.

    The text goes to a temporary file in the same folder, is flushed to disk
    (unless not ``durable``: a cache that can be made again), then renamed over
    the target; on any error the temporary file is removed.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # as open() would create it (mkstemp makes it private to its owner)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_json(path: str | os.PathLike, value: Any) -> None:
    """Write a value as indented JSON, atomically (see atomic_write_text)."""
    atomic_write_text(path, json.dumps(value, indent=2, sort_keys=True, allow_nan=False) + "\n")


def package_digest(*relative_paths: str) -> str:
    """Digest of files of the specsweep package (report code): a params value that reruns a rule when they change."""
    root = Path(__file__).parent
    return digest({p: (root / p).read_text() for p in relative_paths})
