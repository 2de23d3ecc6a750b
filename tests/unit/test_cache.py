"""The cell cache's journals: what the report reads back from them."""

from __future__ import annotations

import json

from specsweep.cache import server_runs


def test_a_servers_latest_run_counts_only_the_cells_it_measured(tmp_path):
    events = [
        {"event": "server_start", "server": "tp1/a", "time": 0.0},
        {"event": "measured", "server": "tp1/a", "cell": "c1", "time": 5.0},
        {"event": "server_stop", "server": "tp1/a", "time": 9.0},  # killed after c1
        {"event": "cache_hit", "server": "tp1/a", "cell": "c1", "time": 20.0},
        {"event": "server_start", "server": "tp1/a", "time": 21.0},
        {"event": "measured", "server": "tp1/a", "cell": "c2", "time": 30.0},
        {"event": "failed", "server": "tp1/a", "cell": "c3", "time": 35.0},
        {"event": "server_stop", "server": "tp1/a", "time": 36.0},
        {"event": "server_start", "server": "tp1/b", "time": 40.0},  # still running: no stop yet
    ]
    journal = tmp_path / "journal.jsonl"
    journal.write_text("".join(json.dumps(e) + "\n" for e in events))
    assert server_runs(journal) == {"tp1/a": (15.0, ["c2", "c3"])}
