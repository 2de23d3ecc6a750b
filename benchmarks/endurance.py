"""Endurance: the simulated server and the client hold a concurrency for a while, bounded in time.

    .venv/bin/python benchmarks/endurance.py [--concurrency 256] [--seconds 60]

Starts the simulated server (DFlash, Qwen3-8B on H200 profile) on 127.0.0.1,
keeps `concurrency` requests in flight in rounds until `seconds` have passed,
then stops everything. Prints requests sent, client-side errors by category,
and peak RSS of the server and of the client process.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import psutil

from specsweep.client import measure
from specsweep.launcher import Server, free_port
from specsweep.workloads import build


def run(concurrency: int, seconds: float, log_dir: Path) -> dict:
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "specsweep.sim",
        "--model-path",
        "Qwen/Qwen3-8B",
        "--port",
        str(port),
        "--max-running-requests",
        str(concurrency),
        "--speculative-algorithm",
        "DFLASH",
        "--speculative-draft-model-path",
        "drafter",
        "--enable-metrics",
        "--sim-startup-seconds",
        "0",
    ]
    server = Server(argv, {}, "127.0.0.1", port, log_dir / "endurance-server.log")
    server.start(60)
    sessions = build({"name": "e", "family": "short", "requests": 2 * concurrency, "max_new_tokens": 128}, 0)
    errors: dict = {}
    sent = rounds = 0
    server_peak = 0
    started = time.monotonic()
    try:
        while time.monotonic() - started < seconds:
            records = measure(server.url, sessions, concurrency, {"temperature": 0.0}, timeout=120, alive=server.alive)
            rounds += 1
            sent += len(records)
            for r in records:
                if r.error:
                    errors[r.error] = errors.get(r.error, 0) + 1
            server_peak = max(server_peak, psutil.Process(server.process.pid).memory_info().rss)
    finally:
        server.stop()
    elapsed = time.monotonic() - started
    return {
        "concurrency": concurrency,
        "seconds": round(elapsed, 1),
        "rounds": rounds,
        "requests": sent,
        "client_errors": errors,
        "server_peak_rss_mb": round(server_peak / 2**20, 1),
        "client_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=60)
    args = parser.parse_args()
    print(json.dumps(run(args.concurrency, args.seconds, Path(tempfile.mkdtemp())), indent=1))


if __name__ == "__main__":
    main()
