"""specsweep's client against SGLang's own client on the same real server.

    python benchmarks/gpu/compare_bench_serving.py OUT_DIR [--config config/gpu-check.yaml] [--method ar]
        [--workload short] [--concurrency 1 4 16]

Starts one server of the configuration (GPU host, SGLang installed) and, at each concurrency, sends the same
prompts with the same output lengths (ignore_eos) twice: with specsweep's client (native /generate) and with
``python -m sglang.bench_serving`` (custom dataset, --sharegpt-output-len, --max-concurrency). Both warm up,
then the prefix cache is flushed and both wait a second (bench_serving's --flush-cache), so that neither
client finds the other's prompts cached; specsweep's client opens a new connection per request, as SGLang's
does (``--connections keep-alive`` to compare the default). Writes
OUT_DIR/compare.json and OUT_DIR/compare.md: output throughput, median TTFT and median TPOT from each client,
and specsweep's relative difference to SGLang's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import requests
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from specsweep.coerce import coerce_to_schema  # noqa: E402
from specsweep.jobs import server_job  # noqa: E402
from specsweep import metrics  # noqa: E402
from specsweep.client import LoadModel, measure  # noqa: E402
from specsweep.environment import probe  # noqa: E402
from specsweep.launcher import Server, free_port, launch_command, stream_mode  # noqa: E402
from specsweep.text import chat_prompt  # noqa: E402
from specsweep.workloads import build  # noqa: E402


def load_config(path: str) -> dict:
    from snakemake.utils import validate

    repo = Path(__file__).resolve().parents[2]
    schema = yaml.safe_load((repo / "config" / "schema.yaml").read_text())
    config = coerce_to_schema(yaml.safe_load(Path(path).read_text()), schema)
    validate(config, str(repo / "config" / "schema.yaml"))  # fills the defaults
    return config


def bench_serving(
    url: str,
    dataset: Path,
    tokenizer: str,
    n: int,
    output_len: int,
    concurrency: int,
    out: Path,
    log: Path,
    python: str,
) -> dict:
    argv = [
        python,
        "-m",
        "sglang.bench_serving",
        "--backend",
        "sglang",
        "--base-url",
        url,
        "--dataset-name",
        "custom",
        "--dataset-path",
        str(dataset),
        "--num-prompts",
        str(n),
        "--sharegpt-output-len",
        str(output_len),
        "--max-concurrency",
        str(concurrency),
        "--request-rate",
        "inf",
        "--tokenizer",
        tokenizer,
        "--output-file",
        str(out),
        "--disable-tqdm",
        "--warmup-requests",
        "4",
        "--flush-cache",
        "--seed",
        "0",
    ]
    with open(log, "a") as handle:
        handle.write(f"\n$ {' '.join(argv)}\n")
        handle.flush()
        subprocess.run(argv, stdout=handle, stderr=subprocess.STDOUT, check=True, timeout=900)
    return json.loads(out.read_text().strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out")
    parser.add_argument("--config", default="config/gpu-check.yaml")
    parser.add_argument("--method", default="ar")
    parser.add_argument("--workload", default="short")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--bench-python", default=None, help="the interpreter with SGLang (default: sglang.python)")
    parser.add_argument("--probe", action="store_true", help="choose flags from the installed build's --help")
    parser.add_argument(
        "--connections",
        default="per-request",
        choices=["per-request", "keep-alive"],
        help="specsweep's connection use (SGLang's client opens one per request)",
    )
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    config = load_config(args.config)
    config["concurrency"] = args.concurrency
    params = server_job(config, 1, args.method)
    workload = next(w for w in config["workloads"] if w["name"] == args.workload)
    model_path = config["model"].get("path")
    sessions = build(workload, config["seed"], False, model_path, config["model"]["context_length"])
    n, output_len = len(sessions), workload["max_new_tokens"]
    dataset = out / "prompts.jsonl"
    with open(dataset, "w") as handle:  # the exact text specsweep sends, as SGLang's custom dataset rows
        for s in sessions:
            handle.write(json.dumps({"conversations": [{"content": chat_prompt(s.messages)}, {"content": "x"}]}) + "\n")
    # the flags of the recorded option table (sglang.options_table), or of the installed build with --probe
    offered = None
    if args.probe:
        offered = set(probe("sglang", config["sglang"]["python"] or sys.executable)["capabilities"]["flags"])
    port = free_port()
    argv, env = launch_command(params, port, config["model"]["context_length"], config["sglang"]["python"], offered)
    server = Server(
        argv, env, "127.0.0.1", port, out / "server.log", devices=os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")
    )
    rows = []
    try:
        server.start(config["server"]["startup_timeout"])
        print(f"server ready after {server.startup_seconds:.0f} s", flush=True)
        # a new connection per request, as SGLang's client opens a new HTTP session for each one
        load = LoadModel(
            incremental=stream_mode(argv, "native") == "incremental", ignore_eos=True, connections=args.connections
        )
        sampling = {"temperature": 0.0, "top_p": 1.0}
        for concurrency in args.concurrency:
            measure(server.url, sessions[:4], concurrency, sampling, 600, False, server.alive, load)  # warm-up
            requests.post(server.url + "/flush_cache", timeout=30)  # as bench_serving --flush-cache does
            time.sleep(1.0)
            started = time.monotonic()
            records = [
                r.as_dict()
                for r in measure(server.url, sessions, concurrency, sampling, 600, False, server.alive, load)
            ]
            ours = {
                "output_throughput": metrics.output_throughput(records),
                "median_ttft_ms": float(np.median([metrics.ttft(r) for r in records if r["error"] is None])) * 1000,
                "median_tpot_ms": float(np.median([metrics.tpot(r) for r in records if r["error"] is None])) * 1000,
                "completed": sum(r["error"] is None for r in records),
                "length_mismatches": metrics.length_mismatches(records),
                "seconds": time.monotonic() - started,
            }
            theirs = bench_serving(
                server.url,
                dataset,
                model_path,
                n,
                output_len,
                concurrency,
                out / f"bench_serving_c{concurrency}.jsonl",
                out / "bench_serving.log",
                args.bench_python or config["sglang"]["python"] or sys.executable,
            )
            theirs = {k: theirs.get(k) for k in ("output_throughput", "median_ttft_ms", "median_tpot_ms", "completed")}
            diff = {
                k: (ours[k] - theirs[k]) / theirs[k]
                for k in ("output_throughput", "median_ttft_ms", "median_tpot_ms")
                if theirs.get(k)
            }
            rows.append(
                {
                    "concurrency": concurrency,
                    "requests": n,
                    "output_len": output_len,
                    "specsweep": ours,
                    "sglang_bench_serving": theirs,
                    "relative_difference": diff,
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    finally:
        server.stop()
    (out / "compare.json").write_text(json.dumps({"command": argv, "rows": rows}, indent=1) + "\n")
    lines = [
        "| concurrency | output tok/s specsweep | SGLang | diff | TTFT p50 ms specsweep | SGLang | diff | "
        "TPOT p50 ms specsweep | SGLang | diff |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        a, b, d = r["specsweep"], r["sglang_bench_serving"], r["relative_difference"]
        lines.append(
            f"| {r['concurrency']} | {a['output_throughput']:.0f} | {b['output_throughput']:.0f} | "
            f"{d.get('output_throughput', 0):+.1%} | {a['median_ttft_ms']:.1f} | {b['median_ttft_ms']:.1f} | "
            f"{d.get('median_ttft_ms', 0):+.1%} | {a['median_tpot_ms']:.2f} | {b['median_tpot_ms']:.2f} | "
            f"{d.get('median_tpot_ms', 0):+.1%} |"
        )
    (out / "compare.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
