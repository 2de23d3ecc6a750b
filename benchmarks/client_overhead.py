"""Client overhead: the load generator's ceiling and timing error, against a stub with known timing.

    python benchmarks/client_overhead.py [--guidellm PATH-TO-guidellm] [--tokenizer DIR]

1. Ceiling: a zero-latency streaming stub (256 tokens per request, one token
   per chunk, OpenAI /v1/completions); specsweep's client at concurrency 1, 64
   and 256 reports streamed tokens/s and requests/s over the whole run, and
   its own CPU per chunk (user + system time of the client's process while it
   measures / content chunks received; the stub is another process). With
   --guidellm, GuideLLM runs against the same stub with the same counts as the
   reference (its tokens/s = total output tokens / benchmark duration).
2. Timing error: the stub emits 64 chunks 10 ms apart per request (native
   /generate) at concurrency 64 and 256 (2 x concurrency requests, so the
   second wave starts while the first one ends); each chunk carries the stub's
   CLOCK_MONOTONIC when the request reached its socket (the kernel's stamp)
   and when the chunk was sent. ITL error per chunk = client-measured gap -
   stub's emission gap (the client's own contribution); TTFT error per request
   = client TTFT - the stub's (first emission - request arrival); and
   client-measured gap - 10 ms (against the nominal schedule, stub jitter
   included). p50 and p99 of the absolute errors in ms.
3. Reading cost: one answer of 256 chunks (the stub's /v1/completions chunks)
   fed to the reader (specsweep.http1.Connection) in process, no socket read
   and no JSON: one HTTP chunk per read (a stream read as it arrives) and the
   whole answer in one read; the median over 15 rounds of 20 answers of the
   CPU time per chunk (framing, event lines, a no-op callback).

Every run is bounded in requests and time and talks only to 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from specsweep.client import LoadModel, measure
from specsweep.http1 import Connection
from specsweep.launcher import Server, free_port
from specsweep.workloads import Session

STUB = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "timing_stub.py"
CONCURRENCY = (1, 64, 256)
TOKENS = 256


def stub(*flags, log):
    port = free_port()
    server = Server([sys.executable, str(STUB), "--port", str(port), *flags], {}, "127.0.0.1", port, log)
    server.start(30)
    return server


def requests_for(concurrency: int) -> int:
    return max(64, 4 * concurrency)


def ours(url: str, concurrency: int) -> dict:
    n = requests_for(concurrency)
    sessions = [Session(f"r{i}", "chat", [{"role": "user", "content": "hi"}], [], TOKENS) for i in range(n)]
    started, cpu = time.monotonic(), time.process_time()
    records = measure(
        url, sessions, concurrency, {"temperature": 0.0}, timeout=300, load=LoadModel(protocol="openai-completions")
    )
    wall, cpu = time.monotonic() - started, time.process_time() - cpu
    ok = [r for r in records if r.ok]
    window = max(r.chunk_times[-1] for r in ok) - min(r.t0 for r in ok)
    tokens = sum(r.output_tokens for r in ok)
    chunks = sum(len(r.chunk_times) for r in records)
    return {
        "requests": n,
        "failed": n - len(ok),
        "tokens_per_s": tokens / window,
        "requests_per_s": len(ok) / window,
        "cpu_us_per_chunk": cpu / chunks * 1e6,
        "wall_s": wall,
    }


def guidellm(url: str, concurrency: int, exe: str, tokenizer: str) -> dict:
    n = requests_for(concurrency)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [
            exe,
            "run",
            "--backend",
            f"kind=openai_http,target={url},model=stub,request_format=/v1/completions",
            "--profile",
            f"kind=concurrent,streams={concurrency}",
            "--constraint",
            f"kind=max_requests,count={n}",
            "--data",
            f"kind=synthetic_text,prompt_tokens=16,output_tokens={TOKENS}",
            "--tokenizer",
            f"kind=huggingface_auto,model={tokenizer}",
            "--output",
            f"kind=json,path={out}",
            "--disable-console-interactive",
        ]
        started = time.monotonic()
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"}
        )
        wall = time.monotonic() - started
        if proc.returncode != 0:
            return {"error": proc.stderr[-500:] or proc.stdout[-500:]}
        bench = json.loads(out.read_text())["benchmarks"][0]
    metrics = bench["metrics"]
    tokens = metrics["output_token_count"]["successful"]["total_sum"]
    count = metrics["request_totals"]["successful"]
    return {
        "requests": n,
        "tokens_per_s": tokens / bench["duration"],
        "requests_per_s": count / bench["duration"],
        "wall_s": wall,
    }


def timing_error(log_dir: Path, concurrency: int) -> dict:
    """The client's own timing error at a concurrency: requests of 64 chunks 10 ms apart, 2 x concurrency of them.

    ITL error per chunk = client-measured gap - the stub's emission gap; TTFT error per request = client TTFT -
    the stub's (first emission - arrival of the request at its socket). Both processes read CLOCK_MONOTONIC, one
    clock."""
    schedule = ",".join(["0.01:1"] * 64)
    server = stub("--schedule", schedule, log=log_dir / f"stub-timing-c{concurrency}.log")
    sequences: dict[int, list] = {}

    def on_chunk(arrival, chunk):
        meta = chunk.get("meta_info", {})
        sequences.setdefault(meta["id"], []).append((arrival, meta["emitted_at"], meta["received_at"]))

    try:
        sessions = [
            Session(f"r{i}", "chat", [{"role": "user", "content": "hi"}], [], 64) for i in range(2 * concurrency)
        ]
        records = measure(server.url, sessions, concurrency, {}, timeout=120, on_chunk=on_chunk)
    finally:
        server.stop()
    itl, nominal, ttft = [], [], []
    for seq in sequences.values():
        for (a0, s0, _), (a1, s1, _) in zip(seq, seq[1:]):
            itl.append((a1 - a0) - (s1 - s0))
    for r in records:
        nominal += [g - 0.01 for g in np.diff(r.chunk_times)]
    # records' times count from the run's start, the stub's are absolute: the earliest first chunk links the two
    firsts = [r for r in records if r.chunk_times]
    start = min(seq[0][0] for seq in sequences.values()) - min(r.chunk_times[0] for r in firsts)
    by_arrival: dict = {}
    for seq in sequences.values():
        by_arrival.setdefault(round(seq[0][0] - start, 7), []).append(seq)
    for r in firsts:
        seq = by_arrival[round(r.chunk_times[0], 7)].pop()
        ttft.append((r.chunk_times[0] - r.t0) - (seq[0][1] - seq[0][2]))
    ms = lambda values, p: float(np.percentile(np.abs(values), p) * 1000)
    return {
        "concurrency": concurrency,
        "itl_p50_ms": ms(itl, 50),
        "itl_p99_ms": ms(itl, 99),
        "ttft_p50_ms": ms(ttft, 50),
        "ttft_p99_ms": ms(ttft, 99),
        "vs_schedule_p99_ms": ms(nominal, 99),
        "gaps": len(itl),
        "requests": len(ttft),
    }


def reading_cost(rounds: int = 15, answers: int = 20) -> dict:
    """CPU microseconds per chunk for the reader to take one 256-chunk chunked answer apart, by read pattern."""
    choices = [{"index": 0, "text": " token", "finish_reason": None}]
    events = [
        b"data: "
        + json.dumps(
            {
                "id": "cmpl-0",
                "object": "text_completion",
                "choices": choices,
                "usage": {"prompt_tokens": 1, "completion_tokens": i + 1},
            }
        ).encode()
        + b"\n\n"
        for i in range(TOKENS)
    ] + [b"data: [DONE]\n\n"]
    chunks = [b"%x\r\n%s\r\n" % (len(e), e) for e in events]
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    patterns = {
        "one chunk per read": [head, *chunks, b"0\r\n\r\n"],
        "the whole answer in one read": [head + b"".join(chunks) + b"0\r\n\r\n"],
    }

    class Unwatched:  # the reads are handed over here, not taken from an epoll set
        def watch(self, connection):
            pass

        def forget(self, connection):
            pass

    async def per_chunk(reads: list) -> float:
        mine, other = socket.socketpair()
        connection = Connection(mine, Unwatched())
        times = []
        for _ in range(rounds):
            started = time.process_time()
            for _ in range(answers):
                answer = asyncio.ensure_future(connection.request(b"", lambda now, data: data == b"[DONE]"))
                await asyncio.sleep(0)  # the request is out: its answer is awaited
                for data in reads:
                    connection.received(data, 0.0)
                await answer
            times.append((time.process_time() - started) / (answers * len(events)) * 1e6)
        connection.close()
        other.close()
        return statistics.median(times)

    return {name: asyncio.run(per_chunk(reads)) for name, reads in patterns.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--guidellm", help="path of the guidellm command (reference)")
    parser.add_argument("--tokenizer", help="local tokenizer directory for GuideLLM's synthetic prompts")
    args = parser.parse_args()
    log_dir = Path(tempfile.mkdtemp(prefix="client-overhead-"))
    results = {"ceiling": {}, "guidellm": {}}
    server = stub("--tokens", str(TOKENS), "--tokens-per-chunk", "1", log=log_dir / "stub.log")
    try:
        for c in CONCURRENCY:
            results["ceiling"][c] = ours(server.url, c)
            if args.guidellm:
                results["guidellm"][c] = guidellm(server.url, c, args.guidellm, args.tokenizer)
    finally:
        server.stop()
    results["timing_error"] = [timing_error(log_dir, c) for c in (64, 256)]
    results["reading_us_per_chunk"] = reading_cost()
    print(json.dumps(results, indent=1))
    print()
    print(
        "| concurrency | specsweep tokens/s | specsweep requests/s | specsweep CPU per chunk | GuideLLM tokens/s "
        "| GuideLLM requests/s |"
    )
    print("|---|---|---|---|---|---|")
    for c in CONCURRENCY:
        a, b = results["ceiling"][c], results["guidellm"].get(c, {})
        print(
            f"| {c} | {a['tokens_per_s']:.0f} | {a['requests_per_s']:.1f} | {a['cpu_us_per_chunk']:.1f} us | "
            f"{b.get('tokens_per_s', float('nan')):.0f} | {b.get('requests_per_s', float('nan')):.1f} |"
        )
    print(
        "\n| concurrency | ITL error p50 | p99 | TTFT error p50 | p99 | gap vs 10 ms schedule p99 | gaps | requests |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for t in results["timing_error"]:
        print(
            f"| {t['concurrency']} | {t['itl_p50_ms']:.3f} ms | {t['itl_p99_ms']:.3f} ms | "
            f"{t['ttft_p50_ms']:.3f} ms | {t['ttft_p99_ms']:.3f} ms | {t['vs_schedule_p99_ms']:.2f} ms | "
            f"{t['gaps']} | {t['requests']} |"
        )
    print("\n| reading one answer | CPU per chunk |\n|---|---|")
    for name, cost in results["reading_us_per_chunk"].items():
        print(f"| {name} | {cost:.2f} us |")


if __name__ == "__main__":
    main()
