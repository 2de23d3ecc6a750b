"""The simulated server's clock: its engine steps as a client sees them, against its cost model.

    python benchmarks/sim_schedule.py [--server-path DIR] [--json OUT]

For AR and DFlash (block 16) on the default profile (H200, Qwen3-8B, TP 1, real time: no --sim-time-scale), at
concurrency 1, 4, 16 and 64: one simulated server per method (a subprocess on 127.0.0.1, start-up 0 s) and, per
concurrency, one wave of that many streaming /generate requests through specsweep's client (distinct prompts of
--prompt-words words, so that no prompt page is shared or cached; ignore_eos, temperature 0; incremental text, as
the workflow launches its servers). Every chunk names the engine step that sent it (meta_info.sim_step) and is
dated by the client when its bytes arrive.

A decode step k is one in which no request was admitted. Its batch is the requests with a chunk of step k; the
context of each = its prompt tokens + its tokens after step k - 1 (its previous chunk). Modelled step =
CostModel.decode_step of those contexts (specsweep/modelling/cost.py, no shared pages). Client-seen step = the mean over
its batch of (arrival of the chunk of step k - arrival of the chunk of step k - 1). Per method and concurrency:
deviation = sum of client-seen steps / sum of modelled steps - 1, the per-step ratio's p50 and p99, and the server's
own account of its schedule over the wave (steps late and seconds late: the specsweep_sim counters of /metrics,
absent from servers without them).

--server-path runs the server from another source tree (its PYTHONPATH), e.g. an export of an older commit, while
the client and the cost model are this checkout's. Every run is bounded in requests and time and talks only to
127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from specsweep.client import LoadModel, measure
from specsweep.counters import scrape
from specsweep.launcher import Server, free_port
from specsweep.sim.args import parse_args
from specsweep.sim.engine import Engine
from specsweep.workloads import Session

METHODS = {
    "ar": [],
    "dflash": ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", "d"],
}
TOKENS = {"ar": 256, "dflash": 1024}  # about 250 and 200 steps a request
CONCURRENCY = (1, 4, 16, 64)
LATE = ("specsweep_sim:steps_late_total", "specsweep_sim:late_seconds_total", "specsweep_sim:scheduled_seconds_total")


def sessions(method: str, concurrency: int, words: int) -> list[Session]:
    """One wave of distinct prompts: each starts with its own number, so no prompt page matches another's."""
    filler = " ".join(f"w{i % 97}" for i in range(words))
    return [
        Session(
            f"{method}-c{concurrency}-{i}",
            "chat",
            [{"role": "user", "content": f"Request {concurrency}.{i}: write a long story. {filler}"}],
            [],
            TOKENS[method],
        )
        for i in range(concurrency)
    ]


def steps(chunks: list[tuple[float, dict]]) -> dict[int, dict[str, tuple[float, int, int]]]:
    """{engine step: {request id: (arrival, prompt tokens, its tokens after the step)}} from the chunks seen."""
    out: dict[int, dict[str, tuple[float, int, int]]] = {}
    for arrival, chunk in chunks:
        meta = chunk.get("meta_info") or {}
        if "sim_step" in meta:
            out.setdefault(meta["sim_step"], {})[meta["id"]] = (
                arrival,
                meta["prompt_tokens"],
                meta["completion_tokens"],
            )
    return out


def compare(engine: Engine, by_step: dict[int, dict[str, tuple[float, int, int]]]) -> dict:
    """Client-seen against modelled seconds of every decode step (no request admitted) of one wave."""
    seen, modelled = [], []
    for k in sorted(by_step):
        batch, before = by_step[k], by_step.get(k - 1, {})
        if not before or any(rid not in before for rid in batch):  # a request admitted at step k: a prefill
            continue
        contexts = [before[rid][1] + before[rid][2] for rid in batch]
        modelled.append(engine.cost.decode_step(engine.decoding, contexts))
        seen.append(statistics.fmean(batch[rid][0] - before[rid][0] for rid in batch))
    if not seen:
        raise SystemExit("no decode step seen: the server's chunks do not name their engine step (meta_info.sim_step)")
    ratios = sorted(s / m for s, m in zip(seen, modelled))
    return {
        "steps": len(seen),
        "modelled_ms": 1000 * statistics.fmean(modelled),
        "seen_ms": 1000 * statistics.fmean(seen),
        "deviation": sum(seen) / sum(modelled) - 1,
        "ratio_p50": ratios[len(ratios) // 2],
        "ratio_p99": ratios[min(len(ratios) - 1, int(0.99 * len(ratios)))],
    }


def run_method(method: str, concurrencies, words: int, server_path: str | None, log_dir: Path) -> list[dict]:
    flags = ["--model-path", "Qwen/Qwen3-8B", *METHODS[method]]
    engine = Engine(parse_args(flags))  # the cost model and decoding the server runs with
    port = free_port()
    isolated = ["-P"] if server_path else []  # the server's package from its PYTHONPATH, never the current folder
    argv = [sys.executable, *isolated, "-m", "specsweep.sim", *flags, "--port", str(port), "--enable-metrics"]
    argv += ["--sim-startup-seconds", "0", "--incremental-streaming-output"]  # as the workflow launches it
    env = {"PYTHONPATH": server_path} if server_path else {}
    server = Server(argv, env, "127.0.0.1", port, log_dir / f"sim-{method}.log")
    rows = []
    try:
        server.start(60)
        for concurrency in concurrencies:
            chunks: list[tuple[float, dict]] = []
            before = scrape(server.url)
            records = measure(
                server.url,
                sessions(method, concurrency, words),
                concurrency,
                {"temperature": 0.0, "ignore_eos": True},
                timeout=300,
                load=LoadModel(incremental=True),
                on_chunk=lambda arrival, chunk: chunks.append((arrival, chunk)),
            )
            after = scrape(server.url)
            failed = [r.error for r in records if not r.ok]
            if failed:
                raise SystemExit(f"{method} at concurrency {concurrency}: requests failed ({failed[:3]})")
            late = {name: after[name] - before.get(name, 0.0) for name in LATE if name in after}
            row = {"method": method, "concurrency": concurrency, **compare(engine, steps(chunks))}
            row["server_steps_late"] = late.get(LATE[0])
            row["server_late_seconds"] = late.get(LATE[1])
            row["server_scheduled_seconds"] = late.get(LATE[2])
            rows.append(row)
            print(line(row), flush=True)
    finally:
        server.stop()
    return rows


def line(row: dict) -> str:
    late = (
        "n/a"
        if row["server_steps_late"] is None
        else f"{row['server_steps_late']:.0f} late, {1000 * row['server_late_seconds']:.1f} ms"
    )
    return (
        f"{row['method']:7s} c{row['concurrency']:<3d} {row['steps']:4d} steps  modelled {row['modelled_ms']:7.3f} ms"
        f"  seen {row['seen_ms']:7.3f} ms  deviation {100 * row['deviation']:+6.2f}%  per step p50 "
        f"{row['ratio_p50']:.3f} p99 {row['ratio_p99']:.3f}  server: {late}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server-path", help="source tree the server runs from (PYTHONPATH); default this one")
    parser.add_argument("--methods", default="ar,dflash")
    parser.add_argument("--concurrency", default=",".join(map(str, CONCURRENCY)))
    parser.add_argument("--prompt-words", type=int, default=400)
    parser.add_argument("--json", help="write the rows to this file")
    args = parser.parse_args()
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for method in args.methods.split(","):
            rows += run_method(method, concurrencies, args.prompt_words, args.server_path, Path(tmp))
    worst = max(rows, key=lambda r: abs(r["deviation"]))
    print(
        f"largest deviation {100 * worst['deviation']:+.2f}% ({worst['method']} at concurrency {worst['concurrency']})"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
