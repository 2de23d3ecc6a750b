"""A server job: everything one server is started with and measured under, and nothing else.

The workflow's jobs build it from a configuration (jobs.server_job); the launcher starts its server, the cells
measure under it, a calibration starts its servers from it. Kept apart from jobs.py, which reads the configuration,
so that the launcher below the workflow's jobs can take one.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, fields

from .layout import server_name
from .modelling.method import Method
from .sections import LoadSection, ModelSection, SamplingSection, ServerSection, SimSection
from .workloads import warmup_fill


@dataclass(frozen=True)
class ServerJob:
    """Everything one server's bench job depends on (and nothing else).

    It reaches the job as canonical JSON through ``params:`` (``as_dict``), so a change in any of it reruns the
    job, and nothing outside it does; the job reads it back with ``from_dict``. Its method travels as a Method (JSON
    only there); the other nested settings stay the configuration's own dicts (the schema names their keys, the
    sections' types name those the code reads).
    """

    backend: str  # "sim", "sglang" or "external"
    model: ModelSection
    tp: int
    method: Method
    server: ServerSection
    sim: SimSection | None  # the simulator's settings with the TP's cost model (calibration.choose.sim_settings)
    sglang: dict
    gpu_pool: dict
    workloads: list
    concurrency: list
    warmup: int
    repetition: int | None
    seed: int
    sampling: SamplingSection
    load: LoadSection
    adaptive: dict | None  # None: fixed-size cells
    cache_dir: str
    endpoint: dict | None = None  # backend external: the method's server, {url, api_key_env} (external.endpoint)
    # budget: verdict's settings (verdict_stopping) for a speculative method's server; None: every session measured
    # (budget: exhaustive, and AR's server always). Left out of as_dict when None, so that exhaustive cells keep
    # their keys.
    budget: dict | None = None

    @property
    def name(self) -> str:
        return server_name(self.tp, self.method.name, self.repetition)

    def as_dict(self) -> dict:
        """Plain JSON values: every field as the configuration gave it, the method as Method.as_dict()."""
        out = {f.name: copy.deepcopy(getattr(self, f.name)) for f in fields(self)}
        out["method"] = self.method.as_dict()
        if self.endpoint is None:  # a started server's job keeps the params it had
            del out["endpoint"]
        if out["budget"] is None:
            del out["budget"]
        return out

    @classmethod
    def from_dict(cls, values: dict) -> "ServerJob":
        known = {f.name for f in fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"server job: unknown keys {', '.join(sorted(unknown))}")
        return cls(**{**copy.deepcopy(values), "method": Method.from_dict(values["method"])})

    def workload(self, name: str) -> dict:
        return next(w for w in self.workloads if w["name"] == name)

    def warmup_fill(self, cell: dict) -> int:
        """The sessions filling a cell's warm-up to one wave of its concurrency (workloads.warmup_fill)."""
        return warmup_fill(self.warmup, cell["concurrency"], self.workload(cell["workload"]))
