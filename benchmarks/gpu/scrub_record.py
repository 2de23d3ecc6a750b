"""Take the GPU machine's checkout path out of a record before it is committed.

    python benchmarks/gpu/scrub_record.py RECORD_DIR CHECKOUT [OLD=NEW ...]

Every text file under RECORD_DIR (cells, environment records, run records, logs; .gz logs too) has each OLD replaced
by NEW (the pairs in order), then CHECKOUT replaced by "." (the repository root, as the records' READMEs say);
each cell whose text changed gets its ``digest`` computed again over the edited text (specsweep.cells.content_digest),
so that archive mode (python -m specsweep.archive) verifies it. Prints what it changed.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

from specsweep.canon import atomic_write_json
from specsweep.cells import content_digest


def scrub(text: str, pairs: list[tuple[str, str]]) -> str:
    for old, new in pairs:
        text = text.replace(old, new)
    return text


def main(record: Path, checkout: str, extra: list[str]) -> None:
    pairs = [tuple(p.split("=", 1)) for p in extra] + [(checkout.rstrip("/"), ".")]
    for path in sorted(p for p in record.rglob("*") if p.is_file()):
        packed = path.suffix == ".gz"
        raw = gzip.decompress(path.read_bytes()) if packed else path.read_bytes()
        try:
            text = raw.decode()
        except UnicodeDecodeError:
            continue
        new = scrub(text, pairs)  # type: ignore[arg-type]
        if new == text:
            continue
        if path.suffix == ".json" and "/cells/" in path.as_posix():
            cell = json.loads(new)
            if "digest" in cell:
                cell["digest"] = content_digest(cell)
            atomic_write_json(path, cell)  # as the workflow writes a cell
        else:
            path.write_bytes(gzip.compress(new.encode()) if packed else new.encode())
        print(f"scrubbed {path}")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3:])
