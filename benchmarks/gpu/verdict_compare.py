"""Two records of one configuration side by side: one measured under budget: exhaustive, one under budget: verdict
(docs/budget.md): each server's GPU-seconds and each cell's verdict against AR.

    python benchmarks/gpu/verdict_compare.py EXHAUSTIVE_RECORD VERDICT_RECORD

A server's seconds are its run record's (``runs/tp*/METHOD.json``: from its launch to the end of its last cell, the
start-up included); its cells' seconds the sum over its measured cells of first send to last response. A cell's
state is the verdict's three states (specsweep.verdict.state) of its speedup interval in the summary table (as
``python -m specsweep.archive`` computes it from the record's cells with today's code): under
budget: exhaustive the paired bootstrap interval over every session, under budget: verdict the interval of the look
it stopped at. A cell not measured (implied slower) has a cell file with its reason and counts as slower.
Prints two Markdown tables and the totals.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from specsweep import archive, verdict
from specsweep.aggregate import write_tables
from specsweep.cells import DEFAULT_FAILURES


def servers(record: Path) -> dict[str, dict]:
    """{method: {"seconds": launch to last cell, "cells": its measured cells' seconds}}."""
    out: dict[str, dict] = {}
    for run in sorted((record / "runs").glob("tp*/*.json")):
        latest = json.loads(run.read_text())["latest_run"]
        cells = 0.0
        for path in latest["cells"]:
            cell = json.loads((record / path.removeprefix("results/")).read_text())
            if not cell.get("skipped"):
                cells += max(r["t_end"] for r in cell["requests"]) - min(r["t0"] for r in cell["requests"])
        out[run.stem] = {"seconds": latest["seconds"], "cells": cells}
    return out


def states(record: Path) -> dict[tuple, dict]:
    """{(method, workload, concurrency): {"state", "speedup", "ci", "stop", "sessions"}} of every speculative cell,
    the cells not measured included."""
    settings = archive.read_settings(record)
    cells = archive.verified_cells(record, settings)
    order, envs = archive.environments(record, cells, settings)
    with tempfile.TemporaryDirectory() as folder:
        summary = write_tables(cells, folder, DEFAULT_FAILURES, order, envs)["summary"]
    out: dict[tuple, dict] = {}
    for row in summary.to_dict("records"):
        if row["method"] == "ar" or row["speedup_lo"] != row["speedup_lo"]:  # AR, or no interval (NaN)
            continue
        lo, hi = float(row["speedup_lo"]), float(row["speedup_hi"])
        out[(row["method"], row["workload"], int(row["concurrency"]))] = {
            "state": verdict.state(lo, hi),
            "speedup": float(row["speedup"]),
            "ci": (lo, hi),
            "stop": row.get("precision_stop") if isinstance(row.get("precision_stop"), str) else "",
            "sessions": f"{row['requests_completed']} of {row['sessions']}",
        }
    for path in (record / "cells").rglob("*.json"):
        cell = json.loads(path.read_text())
        if cell.get("skipped"):
            c = cell["cell"]
            out[(c["method"], c["workload"], c["concurrency"])] = {
                "state": verdict.SLOWER,
                "speedup": None,
                "ci": None,
                "stop": cell["reason"],
                "sessions": "0",
            }
    return out


def main(exhaustive: Path, budgeted: Path) -> None:
    full, cut = states(exhaustive), states(budgeted)
    print(
        "| method | workload | c | exhaustive: speedup [95% interval], state "
        "| verdict: interval, state | how it stopped |"
    )
    print("|---|---|---|---|---|---|")
    same = 0
    for key in sorted(full, key=lambda k: (k[0], k[1] != "short", k[2])):
        a, b = full[key], cut.get(key)
        if b is None:
            continue
        same += a["state"] == b["state"]
        shown = f"[{b['ci'][0]:.2f}, {b['ci'][1]:.2f}], {b['state']}" if b["ci"] else f"not measured, {b['state']}"
        print(
            f"| {key[0]} | {key[1]} | {key[2]} | {a['speedup']:.2f} [{a['ci'][0]:.2f}, {a['ci'][1]:.2f}], "
            f"{a['state']} | {shown} | {b['stop']} ({b['sessions']} sessions) |"
        )
    print(f"\nSame state in {same} of {len(cut)} speculative cells.\n")
    print("| server | exhaustive: s (cells' s) | verdict: s (cells' s) | share |")
    print("|---|---|---|---|")
    one, two = servers(exhaustive), servers(budgeted)
    for name in one:
        a, b = one[name], two[name]
        print(
            f"| {name} | {a['seconds']:.0f} ({a['cells']:.0f}) | {b['seconds']:.0f} ({b['cells']:.0f}) | "
            f"{b['seconds'] / a['seconds']:.0%} |"
        )
    total = [sum(s[k] for s in side.values()) for side in (one, two) for k in ("seconds", "cells")]
    print(
        f"| all | {total[0]:.0f} ({total[1]:.0f}) | {total[2]:.0f} ({total[3]:.0f}) | {total[2] / total[0]:.0%} "
        f"(cells {total[3] / total[1]:.0%}) |"
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
