"""A committed GPU record's summary.csv, computed again from its cells by today's code.

    .venv/bin/python benchmarks/gpu/resummarise.py benchmarks/gpu/<record> [...]

The record's summary.csv names the cells it covers (cell_file: results/cells/..., as the workflow wrote them);
each is read from the record's cells/ folder and every metric is computed from its records (aggregate.summarise_cells),
final under the default failure thresholds. Prints what changed, value by value, and writes the new summary.csv.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pandas as pd

from specsweep.aggregate import summarise_cells
from specsweep.cells import DEFAULT_FAILURES


def record_summary(record: Path) -> pd.DataFrame:
    """The summary of the cells a record's summary.csv covers, computed from their records, as its CSV reads."""
    committed = pd.read_csv(record / "summary.csv")
    cells = {
        name: json.loads((record / Path(name).relative_to("results")).read_text()) for name in committed["cell_file"]
    }
    return pd.read_csv(io.StringIO(summarise_cells(cells, DEFAULT_FAILURES).to_csv(index=False)))


def changes(old: pd.DataFrame, new: pd.DataFrame) -> list[str]:
    """One line per value that differs (numbers beyond a relative 1e-9), per cell and column both tables have."""
    old, new = old.set_index("cell_file"), new.set_index("cell_file")
    lines = []
    for cell in new.index:
        for column in [c for c in new.columns if c in old.columns]:
            a, b = old.loc[cell, column], new.loc[cell, column]
            if pd.isna(a) and pd.isna(b):
                continue
            try:
                same = abs(float(a) - float(b)) <= 1e-9 * max(abs(float(a)), abs(float(b)))
            except (TypeError, ValueError):
                same = str(a) == str(b)
            if not same:
                lines.append(f"{cell} {column}: {a} -> {b}")
    return lines


if __name__ == "__main__":
    for folder in sys.argv[1:]:
        record = Path(folder)
        new = record_summary(record)
        old = pd.read_csv(record / "summary.csv")
        lines = changes(old, new)
        added = [c for c in new.columns if c not in old.columns]
        print(f"{record}: {len(lines)} values changed; columns added: {', '.join(added) or 'none'}")
        print("\n".join(f"  {line}" for line in lines))
        new.to_csv(record / "summary.csv", index=False)
