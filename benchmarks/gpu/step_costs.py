"""Step costs of the real engine, and the simulator's runtime profile fitted to them.

    # on a GPU host with SGLang (the lent H200: after `device.sh install-a/b/c`, see README.md here)
    python3 benchmarks/gpu/step_costs.py one-batch OUT_DIR      # AR forward steps, no server
    python3 benchmarks/gpu/step_costs.py dflash OUT_DIR 16 8 32 [--prompts 1024 4096]  # timed DFlash rounds (1: AR)
    python3 benchmarks/gpu/step_costs.py trees OUT_DIR ngram:128:8 eagle3:8:8:64 --prompts 1024 8192  # tree rounds
    python3 benchmarks/gpu/step_costs.py numerics OUT_DIR           # greedy outputs alone against in a batch
    # another target shape (and DFlash drafter) from a config.json, e.g. the MoE record's:
    python3 benchmarks/gpu/step_costs.py dflash OUT_DIR 1 16 --model benchmarks/gpu/models/qwen3-30b-a3b.config.json \
        --drafter benchmarks/gpu/models/dflash-qwen3-30b-a3b-b16.config.json
    # anywhere, from the measured records (step costs, tree rounds, the workflow's own cells)
    .venv/bin/python benchmarks/gpu/step_costs.py fit RECORD_DIR [--also RECORD_DIR ...] [--write PROFILE.yaml]
    .venv/bin/python benchmarks/gpu/step_costs.py generic [--write PROFILE.yaml]  # the generic runtime `sglang`
    .venv/bin/python benchmarks/gpu/step_costs.py compare   # the generic runtime against the measured one

one-batch: ``python -m sglang.bench_one_batch`` with dummy Qwen3-8B weights over
batch sizes 1-64 and contexts 1k-32k: the median decode step (one token per
request, CUDA graphs) and the prefill of the whole batch. Shapes that do not fit
the KV cache are skipped by SGLang itself.

dflash: one DFlash server per block size (dummy target and drafter; a random
drafter is accepted about once per round, so every round commits one token per
request and the stream's chunk gaps are the verify rounds). Concurrency 1, 4,
16 and 64 (as far as the KV cache holds the batch) with prompts of the given
lengths (default 1,024 tokens); the step time is the median gap between a
request's chunks, the batch its concurrency, the verify width the block size.
Block size 1 is a plain AR server (no drafter): its gaps are decode steps
behind the scheduler, overlap on, as a served request sees them.

numerics: one AR server; the same prompts sent one at a time and then all at once
(concurrency 16), greedy: how many outputs differ with the batch they ran in, and
from which token (bf16 kernels reduce in an order that depends on the batch).

--model / --drafter: the target's (the drafter's) config.json, staged as a model
folder under /tmp beside the recipe's tokenizer, dummy weights as for the rest.

generic: the generic runtime ``sglang`` of sim_profiles.yaml, derived from the H200 records (generic_runtime):
the same fit over GENERIC_RECORDS (not the forced-acceptance records: they check it), NOT_MEASURED for what no
record reaches, the MoE parameters from MOE_RECORD; compare: it against sglang-0.5.16-h200 at every recorded shape
and a grid of every method at batch 1-64.

fit: specsweep.calibration's fit (what `snakemake calibrate` runs): least squares on
log(simulated / measured) over every measured shape, over the simulator's runtime
parameters that the shapes identify (specsweep.calibration.fit.FITTED), from the generic
prior; weights stream at the device copy's measured bandwidth. Prints simulated
against measured for every shape, the parameters not identified, and writes the
runtime profile. (The records here came before the workflow's own calibration,
which measures through the HTTP API only: `snakemake calibrate`.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import subprocess
import sys
import time
from pathlib import Path

RECIPE_MODEL = "qwen3-8b"  # the recipe's target shape: the model a record's row names where it names none
MODEL = f"/tmp/{RECIPE_MODEL}"
DRAFTER = "/tmp/dflash-b16"
EAGLE3 = "/tmp/eagle3-draft"


def copy_tokenizer(source: Path, folder: Path) -> None:
    """The tokenizer files of the model folder ``source`` into ``folder``."""
    for f in source.glob("tokenizer*"):
        (folder / f.name).write_bytes(f.read_bytes())


def stage_model(config: Path) -> str:
    """A model folder /tmp/<config's name> holding ``config`` and the recipe's Qwen tokenizer (dummy weights)."""
    folder = Path("/tmp") / config.name.removesuffix(".config.json")
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(config.read_text())
    copy_tokenizer(Path(f"/tmp/{RECIPE_MODEL}"), folder)
    return str(folder)


def common() -> list[str]:
    """The flags of every server and bench run here: the target MODEL with dummy weights."""
    return ["--model-path", MODEL, *COMMON]


# prefill CUDA graphs are left out: their capture costs 90 s a start, and no step measured here is a small prefill
COMMON = [
    "--load-format",
    "dummy",
    "--attention-backend",
    "triton",
    "--sampling-backend",
    "pytorch",
    "--random-seed",
    "0",
    "--disable-prefill-cuda-graph",
]
BATCHES = (1, 4, 16, 64)
CONTEXTS = (1024, 4096, 16384, 32768)


def one_batch(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    result = out / "one_batch.jsonl"
    argv = [
        sys.executable,
        "-m",
        "sglang.bench_one_batch",
        *common(),
        "--mem-fraction-static",
        "0.6",
        "--context-length",
        str(max(CONTEXTS) + 64),
        "--cuda-graph-max-bs",
        "64",
        "--batch-size",
        *map(str, BATCHES),
        "--input-len",
        *map(str, CONTEXTS),
        "--output-len",
        "24",
        "--result-filename",
        str(result),
    ]
    with open(out / "one_batch.log", "w") as log:
        code = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, timeout=540).returncode
    print(f"bench_one_batch exit {code}; {sum(1 for _ in open(result)) if result.exists() else 0} shapes")


async def _stream(session, url: str, ids: list[int], new_tokens: int) -> list[float]:
    body = {
        "input_ids": ids,
        "stream": True,
        "sampling_params": {"max_new_tokens": new_tokens, "ignore_eos": True, "temperature": 0},
    }
    times = []
    async with session.post(url + "/generate", json=body) as resp:
        async for line in resp.content:
            if line.startswith(b"data:") and b"[DONE]" not in line:
                times.append(time.monotonic())
    return times


async def _rounds(url: str, concurrency: int, prompt: int, new_tokens: int, seed: int) -> list[list[float]]:
    import aiohttp

    rng = random.Random(seed)
    prompts = [[rng.randrange(1000, 100000) for _ in range(prompt)] for _ in range(concurrency)]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        return await asyncio.gather(*(_stream(session, url, p, new_tokens) for p in prompts))


def server_argv(port: int, prompts: list[int]) -> list[str]:
    """An SGLang server on 127.0.0.1:``port`` with room for the longest prompt, 64 requests and CUDA graphs to 64."""
    return [
        sys.executable,
        "-m",
        "sglang.launch_server",
        *common(),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--mem-fraction-static",
        "0.8",
        "--max-running-requests",
        "64",
        "--cuda-graph-max-bs",
        "64",
        "--context-length",
        str(max(prompts) + 1024),
    ]


def dflash(out: Path, blocks: list[int], prompts: list[int], port: int = 30123) -> None:
    from specsweep.launcher import Server

    out.mkdir(parents=True, exist_ok=True)
    for block in blocks:
        drafter = Path(re.sub(r"-b\d+$", f"-b{block}", DRAFTER))
        if block > 1 and not drafter.exists():
            drafter.mkdir()
            config = json.loads((Path(DRAFTER) / "config.json").read_text())
            config["block_size"] = config["dflash_config"]["block_size"] = block
            (drafter / "config.json").write_text(json.dumps(config))
            copy_tokenizer(Path(DRAFTER), drafter)
        argv = server_argv(port, prompts)
        if block > 1:
            argv += [
                "--speculative-algorithm",
                "DFLASH",
                "--speculative-draft-model-path",
                str(drafter),
                "--speculative-dflash-block-size",
                str(block),
                "--speculative-draft-load-format",
                "dummy",
            ]
        server = Server(argv, {}, "127.0.0.1", port, out / f"server-b{block}.log")
        try:
            server.start(300)
            asyncio.run(_rounds(server.url, 4, 256, 16, 0))  # warm-up
            for prompt in prompts:
                for c in (c for c in BATCHES if c * prompt <= 300_000):  # what the KV cache holds at once
                    streams = asyncio.run(_rounds(server.url, c, prompt, 96, c))
                    row = {
                        "block": block,
                        "model": Path(MODEL).name,
                        "concurrency": c,
                        "prompt": prompt,
                        "new_tokens": 96,
                        "ready_s": server.startup_seconds,
                        "chunk_times": streams,
                    }
                    with open(out / "dflash.jsonl", "a") as f:
                        f.write(json.dumps(row) + "\n")
                    gaps = sorted(round_gaps(streams))
                    print(
                        f"b{block} prompt {prompt} c{c}: median gap {1000 * gaps[len(gaps) // 2]:.2f} ms over "
                        f"{len(gaps)} gaps",
                        flush=True,
                    )
        finally:
            server.stop(60)


def tree_argv(spec: str) -> tuple[str, list[str], dict]:
    """(label, speculative flags, server environment) of a tree spec: ngram:TOKENS:BREADTH (NGRAM, no drafter)
    or eagle3:STEPS:TOPK:TOKENS (EAGLE-3 with the staged one-layer head, dummy weights), its flags the registry's
    spelling of those parameters."""
    from specsweep import algorithms

    decoding = tree_decoding(spec)
    algorithm = algorithms.get(decoding["algorithm"])
    params = {k: v for k, v in decoding.items() if k != "algorithm"}
    flags = algorithm.server_flags(params, EAGLE3) + ["--page-size", "1"]
    if algorithm.drafter:
        flags += ["--speculative-draft-load-format", "dummy"]
    label = f"{algorithm.name}-" + "-".join(
        f"{p.sweep_tag}{params[p.name]}" for p in algorithm.parameters if p.name in params and p.name != "match_type"
    )
    # the recipe's stand-in DeepGEMM module imports, so SGLang would use DeepGEMM unless told not to (an NGRAM
    # server without this variable died importing deep_gemm.utils: trees/failed-start-without-jit-deepgemm-off.log.gz)
    return label, flags, {"SGLANG_ENABLE_JIT_DEEPGEMM": "0"}


def trees(out: Path, specs: list[str], prompts: list[int], port: int = 30124) -> None:
    """One server per tree spec; its rounds at concurrency 1-64 and each prompt length, as ``dflash`` times them
    (rows appended to trees.jsonl as they are measured, so that a run cut short keeps what it measured)."""
    from specsweep.launcher import Server, ServerError

    out.mkdir(parents=True, exist_ok=True)
    for spec in specs:
        label, flags, env = tree_argv(spec)
        argv = [
            *server_argv(port, prompts),
            *flags,
        ]
        server = Server(argv, env, "127.0.0.1", port, out / f"server-{label}.log")
        try:
            try:
                server.start(300)
            except ServerError as exc:  # the next spec may start: say why this one did not
                print(f"{label}: {str(exc).splitlines()[0]}", flush=True)
                continue
            asyncio.run(_rounds(server.url, 4, 256, 16, 0))  # warm-up
            for prompt in prompts:
                for c in (c for c in BATCHES if c * prompt <= 300_000):
                    streams = asyncio.run(_rounds(server.url, c, prompt, 160, c))
                    row = {
                        "spec": spec,
                        "model": Path(MODEL).name,
                        "label": label,
                        "concurrency": c,
                        "prompt": prompt,
                        "new_tokens": 160,
                        "ready_s": server.startup_seconds,
                        "chunk_times": streams,
                    }
                    with open(out / "trees.jsonl", "a") as f:
                        f.write(json.dumps(row) + "\n")
                    gaps = sorted(round_gaps(streams))
                    print(
                        f"{label} prompt {prompt} c{c}: median gap {1000 * gaps[len(gaps) // 2]:.2f} ms over "
                        f"{len(gaps)} gaps, {sum(len(x) for x in streams) / len(streams):.1f} chunks a stream",
                        flush=True,
                    )
        finally:
            server.stop(60)


async def _outputs(url: str, prompts: list[list[int]], new_tokens: int, together: bool) -> list[list[int]]:
    """Each prompt's greedy output ids, the prompts sent one after another or all at once."""
    import aiohttp

    async def one(session, ids):
        body = {
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": new_tokens, "ignore_eos": True, "temperature": 0},
        }
        async with session.post(url + "/generate", json=body) as resp:
            answer = await resp.json()
            return answer.get("output_ids") or answer["text"]

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        if together:
            return list(await asyncio.gather(*(one(session, p) for p in prompts)))
        return [await one(session, p) for p in prompts]


def numerics(out: Path, port: int = 30125, requests: int = 16, new_tokens: int = 128) -> None:
    """One AR server: ``requests`` prompts of 1,024 random ids, greedy, sent alone and then all together, twice
    each; how many outputs differ between the two, and the first token where each does (numerics.json)."""
    from specsweep.launcher import Server

    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(7)
    prompts = [[rng.randrange(1000, 100000) for _ in range(1024)] for _ in range(requests)]
    server = Server(server_argv(port, [1024]), {}, "127.0.0.1", port, out / "server-numerics.log")
    try:
        server.start(300)
        runs = {
            name: asyncio.run(_outputs(server.url, prompts, new_tokens, together))
            for name, together in (
                ("alone", False),
                ("together", True),
                ("alone-again", False),
                ("together-again", True),
            )
        }
    finally:
        server.stop(60)

    def first_difference(a: list[int], b: list[int]) -> int | None:
        return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else len(a))

    pairs = {
        f"{a} vs {b}": [first_difference(x, y) for x, y in zip(runs[a], runs[b])]
        for a, b in (("alone", "alone-again"), ("together", "together-again"), ("alone", "together"))
    }
    record = {
        "model": Path(MODEL).name,
        "requests": requests,
        "new_tokens": new_tokens,
        "first_difference": pairs,
        "outputs": runs,
    }
    (out / "numerics.json").write_text(json.dumps(record))
    for name, firsts in pairs.items():
        differ = [f for f in firsts if f is not None]
        print(f"{name}: {len(differ)} of {requests} outputs differ, first at tokens {sorted(differ)}", flush=True)


def round_gaps(streams: list[list[float]]) -> list[float]:
    """The gaps between each stream's chunks after its second (the first gap holds the prefill): one per round."""
    return [b - a for s in streams for a, b in zip(s[1:], s[2:])]


# ---------------------------------------------------------------- fit (runs anywhere, from the records)


def measured_steps(*records: Path) -> list[dict]:
    """Every measured shape of these record folders: kind (decode, prefill, dflash, ar-server, or an algorithm of
    the registry), batch, width (tokens verified per request), context, seconds, and for the registry's algorithms
    the decoding (specsweep.modelling.decoding.Decoding's fields).

    one_batch.jsonl: bench_one_batch's decode and prefill steps; dflash.jsonl: DFlash (and AR-server) rounds;
    trees/trees.jsonl: NGRAM and EAGLE-3 tree rounds; cells/: the workflow's own cells, each a shape: its batch the
    concurrency it held, its context the requests' mean prompt plus half their output, its step the median gap
    between a request's chunks (after its second: the first gap holds the prefill) inside the cell's steady
    window (the label's concurrency in flight); trie_tokens: what NGRAM's trie holds for the batch at mid-request
    (specsweep.modelling.cost.ngram_trie_tokens)."""
    import numpy as np

    from specsweep.modelling.cost import ngram_trie_tokens

    rows = []
    for record in records:
        path = record / "one_batch.jsonl"
        for line in path.read_text().splitlines() if path.exists() else []:
            r = json.loads(line)
            bs, il = r["batch_size"], r["input_len"]
            rows.append(
                {
                    "kind": "decode",
                    "batch": bs,
                    "width": 1,
                    "context": il + r["output_len"] // 2,
                    "seconds": r["median_decode_latency"],
                }
            )
            rows.append({"kind": "prefill", "batch": bs, "width": il, "context": 0, "seconds": r["prefill_latency"]})
        path = record / "dflash.jsonl"
        for line in path.read_text().splitlines() if path.exists() else []:
            r = json.loads(line)
            rows.append(
                {
                    "model": r.get("model", RECIPE_MODEL),
                    "kind": "dflash" if r["block"] > 1 else "ar-server",
                    "batch": r["concurrency"],
                    "width": r["block"],
                    "context": r["prompt"] + r["new_tokens"] // 2,
                    "seconds": float(np.median(round_gaps(r["chunk_times"]))),
                }
            )
        path = record / "trees" / "trees.jsonl"
        for line in path.read_text().splitlines() if path.exists() else []:
            r = json.loads(line)
            decoding = tree_decoding(r["spec"])
            rows.append(
                {
                    "model": r.get("model", RECIPE_MODEL),
                    "kind": decoding["algorithm"],
                    "batch": r["concurrency"],
                    "width": decoding["num_draft_tokens"],
                    "context": r["prompt"] + r["new_tokens"] // 2,
                    "seconds": float(np.median(round_gaps(r["chunk_times"]))),
                    "decoding": decoding,
                    "source": "trees",
                    # random-token prompts: each request's prompt tail is new to the trie, its output at mid-round
                    "trie_tokens": ngram_trie_tokens(
                        [r["prompt"]] * r["concurrency"], [r["new_tokens"] // 2] * r["concurrency"]
                    ),
                }
            )
        for path in sorted((record / "cells").rglob("*.json")) if (record / "cells").is_dir() else []:
            rows.append(cell_step(json.loads(path.read_text())))
    return rows


def tree_decoding(spec: str) -> dict:
    """The Decoding fields of a tree spec (see tree_argv)."""
    kind, *numbers = spec.split(":")
    if kind == "ngram":
        return {
            "algorithm": "ngram",
            "num_draft_tokens": int(numbers[0]),
            "max_bfs_breadth": int(numbers[1]),
            "match_type": "BFS",
        }
    steps, topk, tokens = map(int, numbers)
    return {"algorithm": "eagle3", "num_steps": steps, "topk": topk, "num_draft_tokens": tokens}


def shared_prompt_tokens(requests: list[dict], start: float, end: float, samples: int = 200) -> float:
    """Mean over the window of the prompt tokens in flight more than once (what the simulator's shared_tokens
    counts): at each of ``samples`` instants, for each prompt among the requests in flight (sent, not yet ended),
    (copies - 1) x its tokens. A cell keeps no prompt text, so a prompt is known by its length: the workloads' pools
    hold prompts of distinct lengths, and a repeated one is served from the prefix cache (cached_tokens), which the
    records show."""
    import collections

    total = 0.0
    for i in range(samples):
        t = start + (end - start) * (i + 0.5) / samples
        copies = collections.Counter(r["prompt_tokens"] for r in requests if r["t0"] <= t < r["t_end"])
        total += sum((n - 1) * length for length, n in copies.items())
    return total / samples


def cell_step(cell: dict) -> dict:
    """One workflow cell as a measured shape (see measured_steps)."""
    import numpy as np

    from specsweep.modelling.cost import ngram_trie_tokens
    from specsweep.modelling.method import Method

    method = cell["method"]
    decoding = Method.from_dict(method).decoding
    start, end = cell["metrics"]["concurrency"]["window"]
    gaps, contexts, tries = [], [], []
    for r in cell["requests"]:
        if r["error"] is None:
            times = r["chunk_times"]
            gaps += [b - a for a, b in zip(times[1:], times[2:]) if start <= a and b <= end]
            contexts.append(r["prompt_tokens"] + r["output_tokens"] / 2)
            tries.append(ngram_trie_tokens([r["prompt_tokens"]], [r["output_tokens"] // 2]))
    fields = {
        k: getattr(decoding, k)
        for k in (
            "algorithm",
            "block_size",
            "budget",
            "topk",
            "overlap",
            "num_steps",
            "num_draft_tokens",
            "max_bfs_breadth",
            "match_type",
            "tree_build",  # a DDTree build's tree rules and overlap (a fork's cells are not the default build's)
        )
    }
    return {
        "forced": method.get("params", {}).get("accept_length") is not None,  # SGLANG_SIMULATE_ACC_LEN set
        "kind": method["algorithm"],
        "batch": cell["cell"]["concurrency"],
        "width": decoding.verify_width(),
        "context": int(np.mean(contexts)),
        "seconds": float(np.median(gaps)),
        "decoding": fields,
        "shared": shared_prompt_tokens(cell["requests"], start, end),
        "trie_tokens": float(np.mean(tries)) * cell["cell"]["concurrency"],  # what NGRAM's trie holds, mid-request
        "source": f"cell {cell['cell']['method']}/{cell['cell']['workload']}/c{cell['cell']['concurrency']}",
        "gaps": len(gaps),
    }


def package_row(row: dict) -> dict:
    """A measured shape as specsweep.calibration's fit reads it: a step of a decoding (bench_one_batch's decode steps
    one batch at a time, so no scheduler overlaps its CPU work; an AR server's steps and DFlash rounds run behind
    SGLang 0.5.16's overlap scheduler), or bench_one_batch's prefill of the whole batch."""
    from dataclasses import asdict

    from specsweep.modelling.decoding import Decoding

    if "decoding" in row:  # a registry algorithm's round, as the simulated server decodes it
        decoding = Decoding(**row["decoding"])
    elif row["kind"] == "decode":
        decoding = Decoding("ar", overlap=False)
    elif row["kind"] == "dflash":
        decoding = Decoding("dflash", block_size=row["width"])
    else:  # ar-server, prefill
        decoding = Decoding("ar")
    kind = "one-batch-prefill" if row["kind"] == "prefill" else "step"
    return {**row, "server": row.get("source", "steps"), "kind": kind, "decoding": asdict(decoding)}


def simulated(cost, row: dict) -> float:
    """The simulator's seconds for a measured shape (specsweep.calibration.fit.modelled_seconds of its package_row)."""
    from specsweep.calibration.fit import modelled_seconds

    return modelled_seconds(cost, package_row(row))


def fit(records: list[Path], write: Path | None) -> None:
    """Fit the runtime profile to every shape of the records with specsweep.calibration's fit (weights streaming at
    the bandwidth a device copy measured on the H200, 4.3 of 4.8 TB/s: one model at one TP cannot tell a faster
    read from a larger fixed cost per layer); print modelled against measured per shape and the profile."""
    import yaml

    from specsweep.calibration.fit import fit_runtime, modelled_seconds
    from specsweep.modelling.cost import CostModel
    from specsweep.modelling.profiles import profiles

    rows = [package_row(r) for r in measured_steps(*records)]
    others = sorted({r.get("model", RECIPE_MODEL) for r in rows} - {RECIPE_MODEL})
    if others:  # the fit is Qwen3-8B's runtime profile; another shape's record has its own check (moe_check.py)
        sys.exit(f"step_costs.py fit: the records hold steps of {', '.join(others)}, not only Qwen3-8B's")
    p = profiles()
    gpu, model, drafter = p["gpus"]["H200"], p["models"]["qwen3-8b"], p["models"]["qwen3-0.6b"]
    shipped = p["runtimes"]["sglang-0.5.16-h200"]
    result = fit_runtime(rows, gpu, model, drafter, 1, {**shipped, "bandwidth_efficiency": 4.3 / 4.8})
    cost = CostModel(gpu, model, result.runtime, 1, drafter)
    print("| source | kind | batch | width | context | measured | simulated | simulated / measured |")
    print("|---|---|---|---|---|---|---|---|")
    deviations = []
    for r in rows:
        s = modelled_seconds(cost, r)  # as simulated() gives it
        deviations.append(abs(s / r["seconds"] - 1))
        print(
            f"| {r['server']} | {r['kind']} | {r['batch']} | {r['width']} | {r['context']} | "
            f"{1000 * r['seconds']:.2f} ms | {1000 * s:.2f} ms | {s / r['seconds']:.2f} |"
        )
    within = sum(d <= 0.10 for d in deviations)
    print(f"\n{within} of {len(rows)} shapes within 10%; largest deviation {max(deviations):.0%}")
    print(f"not identified: {', '.join(result.not_identified) or 'none'}")
    profile = {"runtimes": {"sglang-0.5.16-h200": result.runtime}}
    print(yaml.safe_dump(profile, sort_keys=False))
    if write:
        write.write_text(yaml.safe_dump(profile, sort_keys=False))


# ---------------------------------------------------------------- the generic runtime (runs anywhere)

HERE = Path(__file__).resolve().parent
# the H200 records of Qwen3-8B's steps the generic runtime is fitted to: every one but those at forced acceptance
# (forced-2026-12-02, forced-moe-2026-12-02: the check) and the engine comparisons (other builds than 0.5.16's)
GENERIC_RECORDS = ("step-costs-2026-11-30", "spec-2026-12-01", "spec-2026-12-02")
MOE_RECORD = "moe-2026-12-02"  # Qwen3-30B-A3B's shape: the two MoE parameters, fitted with the rest held
# the generic runtime's parameters no H200 record reaches, each with where its value comes from
NOT_MEASURED = {
    "bandwidth_efficiency": round(4.3 / 4.8, 4),  # a device copy's measured 4.3 of the H200's 4.8 TB/s (one model at
    # one TP cannot tell a faster weight read from a larger fixed cost a layer, so it is measured apart)
    "allreduce_latency": 15.0e-6,  # one GPU measured: an NVLink all-reduce step's latency (NCCL's small messages)
    "tree_build_per_node": 2.0e-6,  # DDTree's heap (not in SGLang 0.5.16): a node's push and pop on the GPU
    "hybrid_tree_per_node": 0.4e-3,  # a node's recurrent state beyond 8 (published, consumer Blackwell: +0.4 ms)
    "rank_probe_cpu_per_request": 20.0e-6,  # DDTree's rank probe in Python: an estimate
    "startup_seconds": 120,  # launch to ready with CUDA graphs captured: 113-136 s measured on the H200
}


# the costs outside the engine's steps (a request's latency in the server, a block drafter's extend at prefill),
# which no step record reaches: as the workflow's own calibration on the H200 measured them through the HTTP API
CALIBRATION = "calibrate-2026-12-01/calibration/4d154b3390d5.yaml"
FROM_CALIBRATION = ("request_latency", "request_latency_per_token", "drafter_prefill_fraction", "drafter_prefill_fixed")


def fit_moe(runtime: dict, rows: list[dict]) -> tuple[float, float]:
    """(moe_layer_overhead, moe_compute_efficiency) of ``runtime`` on Qwen3-30B-A3B's shape fitted on a grid (1 us
    steps to 60 us, shares 0.05-1.00): least squares of log(simulated / measured) over ``rows`` (AR's steps and the
    rounds of 16 and more requests: dummy weights route the tokens of fewer requests unlike text, moe_check.py)."""
    import math

    from specsweep.modelling.cost import CostModel
    from specsweep.modelling.profiles import profiles

    p = profiles()
    rows = [r for r in rows if r["kind"] == "ar-server" or r["batch"] >= 16]
    best = None
    for overhead in (i * 1e-6 for i in range(61)):
        for share in (i / 100 for i in range(5, 101)):
            trial = {**runtime, "moe_layer_overhead": overhead, "moe_compute_efficiency": share}
            cost = CostModel(p["gpus"]["H200"], p["models"]["qwen3-30b-a3b"], trial, 1, p["models"]["qwen3-0.6b"])
            loss = sum(math.log(simulated(cost, r) / r["seconds"]) ** 2 for r in rows)
            if best is None or loss < best[0]:
                best = (loss, round(overhead, 7), share)
    assert best is not None
    return best[1], best[2]


def fit_ngram_trie(runtime: dict, rows: list[dict]) -> dict:
    """NGRAM's per-request host work a round with what its trie holds (ngram_cpu_per_request and
    ngram_cpu_per_trie_token of ``runtime``), fitted with the rest held to the NGRAM rounds of ``rows`` (random-token
    prompts of 1,024 and 8,192 tokens, trees.jsonl; natural prompts of about 134 and 2,985 tokens, the cells):
    weighted least squares of measured - simulated without them = (per_request + per_trie_token x trie_tokens) x
    batch, each row weighted by 1 / measured (a relative error), the slope held at 0 or above. Returns both values
    and their standard errors (``*_se``) and the median host time a request (less ngram_step_overhead) of the rows of
    16 and more requests by prompt kind."""
    import numpy as np

    from specsweep.modelling.cost import CostModel
    from specsweep.modelling.profiles import profiles

    p = profiles()
    rows = [r for r in rows if r["kind"] == "ngram"]
    held = {**runtime, "ngram_cpu_per_request": 0.0, "ngram_cpu_per_trie_token": 0.0}
    cost = CostModel(p["gpus"]["H200"], p["models"][RECIPE_MODEL], held, 1, p["models"]["qwen3-0.6b"])
    host = np.array([r["seconds"] - simulated(cost, r) for r in rows])
    x = np.array([[r["batch"], r["batch"] * r["trie_tokens"]] for r in rows], dtype=float)
    w = 1 / np.array([r["seconds"] for r in rows])
    coef, *_ = np.linalg.lstsq(x * w[:, None], host * w, rcond=None)
    if coef[1] < 0:  # no slope: the per-request constant alone
        coef = np.array([float(np.sum(x[:, 0] * host * w * w) / np.sum((x[:, 0] * w) ** 2)), 0.0])
    residual = (host - x @ coef) * w
    covariance = np.linalg.inv((x * w[:, None]).T @ (x * w[:, None])) * residual.var(ddof=2)
    se = np.sqrt(np.diag(covariance))
    kinds = {}
    for name, random_prompt in (("random", True), ("natural", False)):
        per = [
            (h - held.get("ngram_step_overhead", 0.0)) / r["batch"]
            for h, r in zip(host, rows)
            if (r.get("source") == "trees") == random_prompt and r["batch"] >= 16
        ]
        kinds[name] = float(np.median(per))
    return {
        "ngram_cpu_per_request": float(f"{coef[0]:.4g}"),
        "ngram_cpu_per_trie_token": float(f"{coef[1]:.4g}"),
        "ngram_cpu_per_request_se": float(se[0]),
        "ngram_cpu_per_trie_token_se": float(se[1]),
        "host_per_request_median": kinds,
    }


def generic_runtime(records: Path = HERE) -> dict:
    """The generic runtime ``sglang``: the cost model fitted to the H200 records of GENERIC_RECORDS (not the
    forced-acceptance ones, which check it), with NOT_MEASURED's values for what no record reaches, FROM_CALIBRATION's
    from the workflow's calibration on the same H200 (CALIBRATION), NGRAM's per-request host work with its trie's
    content fitted to the NGRAM rounds (fit_ngram_trie) and the MoE parameters fitted to MOE_RECORD.
    Every efficiency a share of the H200's datasheet bandwidth or flops, every fixed cost as measured
    (specsweep.modelling.cost.SCALES): the form that transfers to another GPU."""
    import yaml

    from specsweep.calibration.fit import FITTED, fit_runtime
    from specsweep.modelling.profiles import profiles

    rows = [package_row(r) for r in measured_steps(*(records / name for name in GENERIC_RECORDS))]
    assert not any(r.get("forced") for r in rows), "a generic record holds cells at forced acceptance"
    p = profiles()
    # the main fit without the trie term (fit_ngram_trie fits it after, with the rest held)
    fixed = {**NOT_MEASURED, "drafter_per_token": True, "ngram_cpu_per_trie_token": 0.0}
    result = fit_runtime(rows, p["gpus"]["H200"], p["models"]["qwen3-8b"], p["models"]["qwen3-0.6b"], 1, fixed)
    runtime = {k: v for k, v in result.runtime.items() if k in FITTED or k in fixed}  # nothing of the shipped one
    calibrated = yaml.safe_load((records / CALIBRATION).read_text())["runtime"]
    runtime.update({k: float(f"{calibrated[k]:.4g}") for k in FROM_CALIBRATION})
    steps = measured_steps(*(records / name for name in GENERIC_RECORDS))
    trie = fit_ngram_trie(runtime, steps)
    runtime.update({k: trie[k] for k in ("ngram_cpu_per_request", "ngram_cpu_per_trie_token")})
    overhead, share = fit_moe(runtime, measured_steps(records / MOE_RECORD))
    return {**runtime, "moe_layer_overhead": overhead, "moe_compute_efficiency": share}


def generic(write: Path | None) -> None:
    """Print (and write) the generic runtime derived from the records (generic_runtime)."""
    import yaml

    profile = {"runtimes": {"sglang": generic_runtime()}}
    print(yaml.safe_dump(profile, sort_keys=False))
    if write:
        write.write_text(yaml.safe_dump(profile, sort_keys=False))


# the shapes compared beyond the records' (CostModel.decode_step at context 1,100, as the records' short prompts):
# name, model profile, decoding fields
GRID = (
    ("AR", "qwen3-8b", {"algorithm": "ar"}),
    ("DFlash 16", "qwen3-8b", {"algorithm": "dflash", "block_size": 16}),
    ("NGRAM 16", "qwen3-8b", {"algorithm": "ngram", "num_draft_tokens": 16, "max_bfs_breadth": 8, "match_type": "BFS"}),
    ("DDTree 15", "qwen3-8b", {"algorithm": "ddtree", "block_size": 16, "budget": 15, "overlap": False}),
    ("EAGLE-3 chain 3/1/4", "qwen3-8b", {"algorithm": "eagle3", "num_steps": 3, "topk": 1, "num_draft_tokens": 4}),
    ("EAGLE-3 tree 4/4/16", "qwen3-8b", {"algorithm": "eagle3", "num_steps": 4, "topk": 4, "num_draft_tokens": 16}),
    ("standalone 4/1/5", "qwen3-8b", {"algorithm": "standalone", "num_steps": 4, "topk": 1, "num_draft_tokens": 5}),
    ("MoE AR", "qwen3-30b-a3b", {"algorithm": "ar"}),
    ("MoE DFlash 16", "qwen3-30b-a3b", {"algorithm": "dflash", "block_size": 16}),
    (
        "MoE EAGLE-3 chain 3/1/4",
        "qwen3-30b-a3b",
        {"algorithm": "eagle3", "num_steps": 3, "topk": 1, "num_draft_tokens": 4},
    ),
)
RECORDS_COMPARED = (*GENERIC_RECORDS, MOE_RECORD, "forced-2026-12-02", "forced-moe-2026-12-02")


def compared_shapes(records: Path = HERE) -> list[dict]:
    """Every shape the generic and the measured runtime are compared at: each measured shape of RECORDS_COMPARED
    (its model the record's) and GRID at batch 1, 4, 16 and 64; {label, model, row} each, row as simulated() reads
    it."""
    from dataclasses import asdict

    from specsweep.modelling.decoding import Decoding

    out = []
    for name in RECORDS_COMPARED:
        model = "qwen3-30b-a3b" if "moe" in name else RECIPE_MODEL
        for row in measured_steps(records / name):
            label = f"{name}: {row.get('source', row['kind'])} b{row['batch']} w{row['width']} c{row['context']}"
            out.append({"label": label, "model": model, "row": row})
    for label, model, fields in GRID:
        decoding = asdict(Decoding(**fields))
        for batch in (1, 4, 16, 64):
            row = {"kind": "grid", "batch": batch, "width": 0, "context": 1100, "decoding": decoding}
            out.append({"label": f"{label} b{batch}", "model": model, "row": row})
    return out


def generic_against_measured(records: Path = HERE) -> list[tuple[str, float, float]]:
    """(label, measured runtime's seconds, generic runtime's seconds) of every compared shape on the H200."""
    from specsweep.modelling.cost import CostModel

    out = []
    for shape in compared_shapes(records):
        costs = [CostModel.named("H200", shape["model"], name) for name in ("sglang-0.5.16-h200", "sglang")]
        measured, generic_ = (simulated(c, shape["row"]) for c in costs)
        out.append((shape["label"], measured, generic_))
    return out


def compare() -> None:
    """Print the generic runtime against the measured one at every compared shape, largest deviations first."""
    rows = generic_against_measured()
    rows.sort(key=lambda r: -abs(r[2] / r[1] - 1))
    print("| shape | sglang-0.5.16-h200 | sglang (generic) | generic / measured |")
    print("|---|---|---|---|")
    for label, m, g in rows:
        print(f"| {label} | {1000 * m:.2f} ms | {1000 * g:.2f} ms | {g / m:.3f} |")
    within = sum(abs(g / m - 1) <= 0.15 for _, m, g in rows)
    print(f"\n{within} of {len(rows)} shapes within 15%")


def ngram() -> None:
    """Print NGRAM's trie fit (fit_ngram_trie) and the generic runtime's NGRAM rounds against the measured ones,
    random-token and natural prompts, every record of GENERIC_RECORDS."""
    from specsweep.modelling.cost import CostModel

    steps = measured_steps(*(HERE / name for name in GENERIC_RECORDS))
    runtime = CostModel.named("H200", RECIPE_MODEL, "sglang").runtime
    print(fit_ngram_trie(runtime, steps))
    cost = CostModel.named("H200", RECIPE_MODEL, "sglang")
    print("| prompts | draft tokens | concurrency | context | trie tokens | measured (ms) | simulated (ms) | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    rows = [r for r in steps if r["kind"] == "ngram"]
    rows.sort(key=lambda r: (r.get("source") != "trees", r["width"], r["context"] // 500, r["batch"]))
    for r in rows:
        kind = "random" if r.get("source") == "trees" else "natural"
        s = simulated(cost, r)
        print(
            f"| {kind} | {r['width']} | {r['batch']} | {r['context']} | {r['trie_tokens']:.0f} | "
            f"{1000 * r['seconds']:.2f} | {1000 * s:.2f} | {s / r['seconds']:.3f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "step", choices=["one-batch", "dflash", "trees", "numerics", "fit", "generic", "compare", "ngram"]
    )
    parser.add_argument("dir", type=Path, nargs="?", help="where a measurement goes; fit: the first record folder")
    parser.add_argument("--also", nargs="*", type=Path, default=[], help="fit: more record folders")
    parser.add_argument(
        "blocks",
        nargs="*",
        default=["16"],
        help="dflash: block sizes; trees: specs ngram:TOKENS:BREADTH or eagle3:STEPS:TOPK:TOKENS",
    )
    parser.add_argument("--prompts", nargs="+", type=int, default=[1024], help="prompt lengths (dflash)")
    parser.add_argument("--write", type=Path)
    parser.add_argument("--model", type=Path, help="the target's config.json (default: the recipe's Qwen3-8B)")
    parser.add_argument("--drafter", type=Path, help="the DFlash drafter's config.json, block 16 (dflash)")
    args = parser.parse_args()
    global MODEL, DRAFTER
    if args.model:
        MODEL = stage_model(args.model)
    if args.drafter:
        DRAFTER = stage_model(args.drafter)
    if args.step == "one-batch":
        one_batch(args.dir)
    elif args.step == "dflash":
        dflash(args.dir, [int(b) for b in args.blocks], args.prompts)
    elif args.step == "trees":
        trees(args.dir, args.blocks, args.prompts)
    elif args.step == "numerics":
        numerics(args.dir)
    elif args.step == "generic":
        generic(args.write)
    elif args.step == "compare":
        compare()
    elif args.step == "ngram":
        ngram()
    else:
        fit([args.dir, *args.also], args.write)


if __name__ == "__main__":
    main()
