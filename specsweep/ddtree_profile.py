"""A DDTree build's stage profiler, read into cells: where a verify round's time goes, measured.

A build with the profiler (``profiler: true`` in its rules; the v2-runtime fork's ``--speculative-ddtree-profile``
with ``--speculative-ddtree-profile-output FILE.jsonl``) appends one JSON line every ``interval`` verify rounds
(``--speculative-ddtree-profile-interval``, default 50), aggregated over those rounds::

    {"type": "sglang_speculative_tree_profile", "name": "ddtree_v2", "rank": 0, "round_start": 0, "round_end": 50,
     "profiled_rounds": 50, "warmup": 0, "interval": 50,
     "meta": {"verify_width": {"count": 50, "sum": 800.0, "avg": 16.0}, ...},
     "stages": {"target_verify": {"gpu_count": 50, "gpu_sum_ms": 560.0, "gpu_avg_ms": 11.2, "gpu_max_ms": 12.0,
                                  "cpu_count": 50, "cpu_sum_ms": 3.1, "cpu_avg_ms": 0.06, "cpu_max_ms": 0.2}, ...}}

A stage timed on the GPU (CUDA events around its kernels) has ``gpu_*`` and ``cpu_*`` entries; a host-side stage
(the CPU tree builder's) ``cpu_*`` only. ``split`` reads the GPU time where a stage has it, else the CPU time, and
gives seconds per verify round (sum over records of the stage's milliseconds / 1000 / sum of profiled_rounds: a stage
that runs in some rounds only is spread over all of them) in five parts:

- draft: the drafter's forward and the top-k of its per-depth distributions (draft_forward, draft_head_topk);
- tree build: the tree and its verify inputs (tree_gpu_build, or the CPU builder's tree_to_cpu, tree_heap_cpu,
  tree_to_gpu; mask_compile);
- verify: the target's forward over the tree (target_verify);
- follow: accepting the longest verified path and its bonus token (accept_follow);
- other: every stage this module does not know, each also kept by name (``unknown``), never dropped.

The simulated server writes the same records from its cost model's split of the same round (``simulated_split``):
draft, tree build, verify (the target's pass and its tree-mask read) and follow (the per-request walk), and as
other the rest of its modelled step (exposed CPU time; the rank probe's top-32).

Cells take the records appended while their load ran (``ProfileTail``): the server profiles every round of its
life, so a record that straddles two cells (at most ``interval`` rounds) goes to the one during which it was
written, and the last rounds of a server's last cell, never flushed before it stops, are missing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import pandas as pd

from . import algorithms
from .modelling.cost import CostModel
from .modelling.decoding import Decoding

RECORD_TYPE = "sglang_speculative_tree_profile"
PARTS = ("draft", "tree_build", "verify", "follow", "other")
PART_TITLES = {"draft": "draft", "tree_build": "tree build", "verify": "verify", "follow": "follow", "other": "other"}
STAGE_PARTS = {
    "draft_forward": "draft",
    "draft_head_topk": "draft",
    "tree_gpu_build": "tree_build",
    "tree_to_cpu": "tree_build",
    "tree_heap_cpu": "tree_build",
    "tree_to_gpu": "tree_build",
    "mask_compile": "tree_build",
    "target_verify": "verify",
    "accept_follow": "follow",
}
# the stage each part of the simulator's split is written as (the build's own names)
SIMULATED_STAGES = {
    "draft": "draft_forward",
    "tree_build": "tree_gpu_build",
    "verify": "target_verify",
    "follow": "accept_follow",
    "other": "simulated_other",
}
PROFILE_FLAG = "--speculative-ddtree-profile"
OUTPUT_FLAG = "--speculative-ddtree-profile-output"
INTERVAL_FLAG = "--speculative-ddtree-profile-interval"


class ProfileError(ValueError):
    """A profile file or record specsweep cannot read; the message names the file and line."""


def read_records(lines: Iterable[str], where: str, first_line: int = 1) -> list[dict]:
    """The profile records of JSONL text (blank lines skipped); a line that is not a JSON object of the profiler's
    type, with its rounds and stages, is refused naming ``where`` and its line number."""
    records = []
    for number, line in enumerate(lines, start=first_line):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ProfileError(
                f"{where}, line {number}: not JSON ({exc.msg}); the stage profiler writes one JSON object a line"
            ) from None
        problem = _problem(record)
        if problem:
            raise ProfileError(f"{where}, line {number}: {problem}")
        records.append(record)
    return records


def _problem(record) -> str | None:
    if not isinstance(record, dict):
        return "not a JSON object"
    if record.get("type") != RECORD_TYPE:
        return f"type {record.get('type')!r}, not {RECORD_TYPE!r} (a DDTree stage profiler's record)"
    rounds = record.get("profiled_rounds")
    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 0:
        return f"profiled_rounds {rounds!r} is not a count of rounds"
    stages = record.get("stages")
    if not isinstance(stages, dict):
        return "no 'stages' object"
    for name, entry in stages.items():
        if not isinstance(entry, dict) or not any(k in entry for k in ("gpu_sum_ms", "cpu_sum_ms")):
            return f"stage {name!r} has neither gpu_sum_ms nor cpu_sum_ms"
        for key in ("gpu_sum_ms", "cpu_sum_ms"):
            value = entry.get(key)
            if key in entry and (not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0):
                return f"stage {name!r}: {key} {value!r} is not a duration"
    return None


def read_file(path: str | os.PathLike) -> list[dict]:
    """Every record of a profile file (``read_records``)."""
    with open(path, encoding="utf-8") as handle:
        return read_records(handle, str(path))


def split(records: list[dict]) -> dict | None:
    """Seconds per verify round by part and by stage over these records (None where they hold no profiled round).

    part seconds per round = sum over its stages of (sum over records of the stage's gpu_sum_ms, else its
    cpu_sum_ms) / 1000 / sum over records of profiled_rounds; ``other`` is the sum of the unknown stages. Also the
    rounds, the records, the clock each stage was read on, and the profiler's round metadata averaged over rounds
    (verify width, batch size, accepted length, the share of rounds run as a CUDA graph)."""
    rounds = sum(r["profiled_rounds"] for r in records)
    if rounds <= 0:
        return None
    totals: dict[str, float] = {}
    clock: dict[str, str] = {}
    for record in records:
        for name, entry in record["stages"].items():
            on = "gpu" if "gpu_sum_ms" in entry else "cpu"
            totals[name] = totals.get(name, 0.0) + float(entry[f"{on}_sum_ms"]) / 1000.0
            clock[name] = on if clock.get(name, on) == on else "mixed"
    stages = {name: seconds / rounds for name, seconds in sorted(totals.items())}
    parts = dict.fromkeys(PARTS, 0.0)
    for name, seconds in stages.items():
        parts[STAGE_PARTS.get(name, "other")] += seconds
    meta: dict[str, float] = {}
    for key in ("verify_width", "batch_size", "mean_accept_len", "can_run_cuda_graph", "tree_budget", "block_size"):
        count = sum(int(r.get("meta", {}).get(key, {}).get("count", 0)) for r in records)
        if count:
            meta[key] = sum(float(r["meta"][key]["sum"]) for r in records if key in r.get("meta", {})) / count
    return {
        "rounds": rounds,
        "records": len(records),
        "seconds_per_round": parts,
        "stages": stages,
        "clock": dict(sorted(clock.items())),
        "unknown": sorted(n for n in stages if n not in STAGE_PARTS),
        "meta": meta,
        "simulated": any(r.get("simulated") for r in records),
    }


def output_path(argv: list[str]) -> str | None:
    """The profile file a server's command line writes (its profiler on and an output named), else None."""
    if PROFILE_FLAG not in argv:
        return None
    return algorithms.flag_value(argv, OUTPUT_FLAG)


class ProfileTail:
    """The records a profile file gains from now on (``since``): a cell's own, the file's earlier ones left out."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.offset = self.path.stat().st_size if self.path.is_file() else 0
        self.lines = self._count_lines() if self.offset else 0

    def _count_lines(self) -> int:
        with open(self.path, "rb") as handle:
            return handle.read(self.offset).count(b"\n")

    def since(self) -> list[dict]:
        """The complete lines appended after this tail was made (a line still being written is left for later)."""
        if not self.path.is_file():
            return []
        with open(self.path, "rb") as handle:
            handle.seek(self.offset)
            text = handle.read().decode("utf-8", errors="replace")
        complete = text[: text.rfind("\n") + 1]
        return read_records(complete.splitlines(), str(self.path), first_line=self.lines + 1)


def cell_stages(tail: ProfileTail | None) -> dict | None:
    """The split of the records a cell's tail gained (None without a profile or without a profiled round)."""
    if tail is None:
        return None
    found = split(tail.since())
    if found is not None:
        found["file"] = os.path.basename(tail.path)
    return found


def simulated_split(cost: CostModel, decoding: Decoding, contexts: list[int], shared: float = 0.0) -> dict[str, float]:
    """The simulator's split of one verify round (seconds by part; the parts sum to its modelled step,
    CostModel.decode_step, with the build's own costs: CostModel.with_build_costs): draft = draft_seconds + the top-k
    over its per-depth distributions (tree_round_seconds' topk, the profiler's draft_head_topk); tree build =
    tree_build_per_node x budget x batch where the build grows a tree; verify = the target's pass over width x batch
    tokens (verify_seconds) + the tree-mask read (mask_seconds) + the tree's verify work a node (tree_round_seconds'
    verify); follow = verify_per_request x batch; other = the
    step's rest (the round's work the overlap scheduler does not hide, CPU time it does not hide, the rank probe's
    top-32, a hybrid model's recurrent state)."""
    cost = cost.with_build_costs(decoding)
    r, batch = cost.runtime, len(contexts)
    tree = cost.tree_round_seconds(decoding, batch)
    parts = {
        "draft": cost.draft_seconds(decoding, contexts) + tree["topk"],
        "tree_build": r.get("tree_build_per_node", 0.0) * decoding.budget * batch if decoding.builds_tree() else 0.0,
        "verify": cost.verify_seconds(decoding.verify_width() * batch, contexts, shared)
        + cost.mask_seconds(decoding, contexts)
        + tree["verify"],
        "follow": r.get("verify_per_request", 0.0) * batch,
    }
    parts["other"] = max(0.0, cost.decode_step(decoding, contexts, shared) - sum(parts.values()))
    return parts


class SimulatedProfiler:
    """The simulated server's stage profiler: every verify round's split (``simulated_split``) summed, one record of
    the build's format written every ``interval`` rounds, marked ``"simulated": true``."""

    def __init__(self, path: str | os.PathLike, interval: int = 50, name: str = "ddtree_v2"):
        self.path, self.interval, self.name = Path(path), max(1, int(interval)), name
        self.round = 0
        self._reset()

    def _reset(self) -> None:
        self.start = self.round
        self.rounds = 0
        self.seconds = dict.fromkeys(PARTS, 0.0)
        self.meta: dict[str, float] = {}

    def record_round(self, parts: Mapping[str, float], **meta: float) -> None:
        for part, seconds in parts.items():
            self.seconds[part] += seconds
        for key, value in meta.items():
            self.meta[key] = self.meta.get(key, 0.0) + float(value)
        self.rounds += 1
        self.round += 1
        if self.rounds >= self.interval:
            self.flush()

    def flush(self) -> None:
        if not self.rounds:
            return
        stages = {}
        for part, stage in SIMULATED_STAGES.items():
            total = self.seconds[part] * 1000.0
            stages[stage] = {
                "gpu_count": self.rounds,
                "gpu_sum_ms": total,
                "gpu_avg_ms": total / self.rounds,
                "gpu_max_ms": total / self.rounds,
            }
        record = {
            "type": RECORD_TYPE,
            "name": self.name,
            "rank": 0,
            "round_start": self.start,
            "round_end": self.round,
            "profiled_rounds": self.rounds,
            "warmup": 0,
            "interval": self.interval,
            "meta": {k: {"count": self.rounds, "sum": v, "avg": v / self.rounds} for k, v in sorted(self.meta.items())},
            "stages": stages,
            "simulated": True,
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as out:
            out.write(json.dumps(record, sort_keys=True) + "\n")
        self._reset()


STAGE_COLUMNS = (
    ["simulated", "tp", "method", "engine", "workload", "concurrency", "budget", "verify_width", "batch", "context"]
    + ["rounds", "records", "cuda_graph_share", "unknown"]
    + [f"measured_ms_{p}" for p in PARTS]
    + ["measured_ms_round"]
    + [f"modelled_ms_{p}" for p in PARTS]
    + ["modelled_ms_round", "cost_model"]
)


def stage_rows(cells: Mapping[str, dict], costs: Mapping[str, dict] | None = None) -> pd.DataFrame:
    """One row per cell with stage records (``stages``): its split in milliseconds per verify round, measured (the
    build's records; on the simulated backend its cost model's, written as the build writes them) beside the
    simulator's split of the same round (``simulated_split`` at the cell's mean batch of the profiled rounds and its
    mean context, prompt + output / 2 of its completed requests), with the cost model ``costs`` gives for
    "<engine>|<tp>" (a cost model's settings: calibration.choose.sim_settings; none: no modelled columns).
    ``unknown`` names the stages kept as other."""
    rows = []
    for cell in cells.values():
        stages = cell.get("stages")
        if not stages:
            continue
        method, where = cell["method"], cell["cell"]
        params = method.get("params") or {}
        done = [r for r in cell["requests"] if r.get("error") is None]
        prompt = sum(r.get("prompt_tokens") or 0 for r in done) / max(len(done), 1)
        output = sum(r.get("output_tokens") or 0 for r in done) / max(len(done), 1)
        batch = stages["meta"].get("batch_size") or float(where["concurrency"])
        row = {
            "simulated": bool(cell["simulated"]),
            "tp": where["tp"],
            "method": where["method"],
            "engine": method.get("engine") or "",
            "workload": where["workload"],
            "concurrency": where["concurrency"],
            "budget": params.get("budget"),
            "verify_width": stages["meta"].get("verify_width"),
            "batch": batch,
            "context": prompt + output / 2,
            "rounds": stages["rounds"],
            "records": stages["records"],
            # the share of profiled rounds whose verify ran as a captured CUDA graph (the build's can_run_cuda_graph)
            "cuda_graph_share": stages["meta"].get("can_run_cuda_graph"),
            "unknown": ";".join(stages["unknown"]),
            **{f"measured_ms_{p}": stages["seconds_per_round"][p] * 1000 for p in PARTS},
            "measured_ms_round": sum(stages["seconds_per_round"].values()) * 1000,
        }
        settings = (costs or {}).get(f"{row['engine']}|{where['tp']}")
        if settings is not None and algorithms.get(method["algorithm"]).builds_trees:
            cost = CostModel.named(
                settings["gpu"], settings["model_profile"], settings["runtime"], where["tp"],
                settings.get("profiles"), settings.get("draft_model_profile"),
            )  # fmt: skip
            decoding = Decoding.of_params(method["algorithm"], params, "--disable-overlap-schedule" not in
                                          (cell["provenance"].get("command") or []), {})  # fmt: skip
            parts = simulated_split(cost, decoding, [int(row["context"])] * max(1, round(batch)))
            row.update({f"modelled_ms_{p}": parts[p] * 1000 for p in PARTS})
            row["modelled_ms_round"] = sum(parts.values()) * 1000
            row["cost_model"] = (settings.get("cost_model") or {}).get("label", settings["runtime"])
        rows.append(row)
    frame = pd.DataFrame(rows, columns=STAGE_COLUMNS)
    return frame.sort_values(["tp", "workload", "concurrency", "method"]).reset_index(drop=True)
