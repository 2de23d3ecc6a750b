"""Two records of one configuration side by side: one measured under budget: exhaustive, one under budget: verdict
(docs/budget.md): each server's GPU-seconds and each cell's verdict against AR.

    python benchmarks/gpu/verdict_compare.py EXHAUSTIVE_RECORD VERDICT_RECORD

A server's seconds are its latest launch's run record (``runs/tp*/METHOD.json``: from its launch to the end of its
last cell, the start-up included: a launch a time limit cut short before it is not counted); its cells' seconds the
sum over every cell it measured, in any launch, of first send to last response. A cell's
state is the verdict's three states (specsweep.verdict.state) of its speedup interval in the summary table (as
``python -m specsweep.archive`` computes it from the record's cells with today's code): under
budget: exhaustive the paired bootstrap interval over every session, under budget: verdict the interval of the look
it stopped at; a cell without an interval is inconclusive. A cell not measured has a skipped record with its reason:
implied slower counts as slower, dominated has no state and is left out of the count of same states.
Prints two Markdown tables and the totals.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from specsweep import archive, implied, verdict
from specsweep.aggregate import write_tables
from specsweep.cells import DEFAULT_FAILURES


def servers(record: Path) -> dict[str, dict]:
    """{server (tp{tp}/{method}): {"seconds": its latest launch's, launch to last cell, "cells": the seconds of every
    cell it measured, over all its launches}}."""
    out: dict[str, dict] = {}
    for run in sorted((record / "runs").glob("tp*/*.json")):
        server = f"{run.parent.name}/{run.stem}"
        cells = 0.0
        for path in (record / "cells" / server).rglob("*.json"):
            cell = json.loads(path.read_text())
            if not implied.is_skipped(cell):
                cells += max(r["t_end"] for r in cell["requests"]) - min(r["t0"] for r in cell["requests"])
        out[server] = {"seconds": json.loads(run.read_text())["latest_run"]["seconds"], "cells": cells}
    return out


def states(record: Path) -> dict[tuple, dict]:
    """{(tp, method, workload, concurrency): {"state", "speedup", "ci", "stop", "sessions"}} of every speculative
    cell: a cell without an interval inconclusive, one implied slower slower, one dominated with no state (None)."""
    settings = archive.read_settings(record)
    cells = archive.verified_cells(record, settings)
    order, envs = archive.environments(record, cells, settings)
    with tempfile.TemporaryDirectory() as folder:
        summary = write_tables(cells, folder, DEFAULT_FAILURES, order, envs)["summary"]
    out: dict[tuple, dict] = {}
    for row in summary.to_dict("records"):
        if row["method"] == "ar":
            continue
        ci = (float(row["speedup_lo"]), float(row["speedup_hi"])) if row["speedup_lo"] == row["speedup_lo"] else None
        out[(int(row["tp"]), row["method"], row["workload"], int(row["concurrency"]))] = {
            "state": verdict.state(*(ci or (None, None))),
            "speedup": float(row["speedup"]),
            "ci": ci,
            "stop": row.get("precision_stop") if isinstance(row.get("precision_stop"), str) else "",
            "sessions": f"{row['requests_completed']} of {row['sessions']}",
        }
    for row in archive.skipped_records(record, cells).to_dict("records"):
        out[(int(row["tp"]), row["method"], row["workload"], int(row["concurrency"]))] = {
            "state": verdict.SLOWER if row["reason"].startswith(implied.IMPLIED_SLOWER) else None,
            "speedup": None,
            "ci": None,
            "stop": row["reason"],
            "sessions": "0",
        }
    return out


def interval(cell: dict) -> str:
    return f"[{cell['ci'][0]:.2f}, {cell['ci'][1]:.2f}]" if cell["ci"] else "no interval"


def main(exhaustive: Path, budgeted: Path) -> None:
    full, cut = states(exhaustive), states(budgeted)
    print(
        "| TP | method | workload | c | exhaustive: speedup [95% interval], state "
        "| verdict: interval, state | how it stopped |"
    )
    print("|---|---|---|---|---|---|---|")
    compared = [k for k in sorted(full, key=lambda k: (k[0], k[1], k[2] != "short", k[3])) if k in cut]
    for key in compared:
        a, b = full[key], cut[key]
        shown = f"{interval(b)}, {b['state']}" if b["speedup"] is not None else f"not measured, {b['state']}"
        print(
            f"| {' | '.join(map(str, key))} | {a['speedup']:.2f} {interval(a)}, {a['state']} | {shown} "
            f"| {b['stop']} ({b['sessions']} sessions) |"
        )
    stated = [k for k in compared if cut[k]["state"] is not None]  # a dominated cell has no state to compare
    same = sum(full[k]["state"] == cut[k]["state"] for k in stated)
    print(f"\nSame state in {same} of {len(stated)} speculative cells.\n")
    print("| server | exhaustive: s (cells' s) | verdict: s (cells' s) | share |")
    print("|---|---|---|---|")
    one, two = servers(exhaustive), servers(budgeted)
    for name in one:
        a, b = one[name], two.get(name, {"seconds": 0.0, "cells": 0.0})  # a server not started costs nothing
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
