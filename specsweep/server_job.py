"""A server job: everything one server is started with and measured under, and nothing else.

The workflow's jobs build it from a configuration (jobs.server_job); the launcher starts its server, the cells
measure under it, a calibration starts its servers from it. Kept apart from jobs.py, which reads the configuration,
so that the launcher below the workflow's jobs can take one.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, fields

from .layout import server_name


@dataclass(frozen=True)
class ServerJob:
    """Everything one server's bench job depends on (and nothing else).

    It reaches the job as canonical JSON through ``params:`` (``as_dict``), so a change in any of it reruns the
    job, and nothing outside it does; the job reads it back with ``from_dict``. Nested settings stay the
    configuration's own dicts (the schema names their keys).
    """

    backend: str  # "sim" or "sglang"
    model: dict
    tp: int
    method: dict  # methods.Method.as_dict()
    server: dict
    sim: (
        dict | None
    )  # the simulator's settings with the TP's cost model (calibration.choose.sim_settings); None on SGLang
    sglang: dict
    gpu_pool: dict
    workloads: list
    concurrency: list
    warmup: int
    repetition: int | None
    seed: int
    sampling: dict
    load: dict
    adaptive: dict | None  # None: fixed-size cells
    cache_dir: str

    @property
    def name(self) -> str:
        return server_name(self.tp, self.method["name"], self.repetition)

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "ServerJob":
        known = {f.name for f in fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"server job: unknown keys {', '.join(sorted(unknown))}")
        return cls(**copy.deepcopy(values))

    def workload(self, name: str) -> dict:
        return next(w for w in self.workloads if w["name"] == name)
