"""A method: one decoding method as a server runs it (an algorithm of the registry, its parameters, drafter, flags
and environment).

The workflow's jobs expand the configured methods into these (specsweep.methods); a server job carries one to the
launcher, the cells, the plan and a calibration, each of which asks it what it needs (its algorithm, how the
simulator decodes it, what a round verifies) instead of looking its algorithm up again. It becomes JSON once, where
it leaves a job (``as_dict``: a server job's params, a cell's ``method``, a calibration's cache entry), and is read
back there (``from_dict``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

from .. import algorithms
from .decoding import Decoding


@dataclass(frozen=True)
class Method:
    """One decoding method as a server runs it: algorithm, parameters, drafter, flags, environment."""

    name: str
    algorithm: str  # a name of specsweep.algorithms.REGISTRY (its entry: ``spec``)
    params: dict  # the algorithm's parameters (specsweep.algorithms), resolved as the server runs them
    flags: tuple  # server flags (argument list), substituted; --attention-backend included when set
    env: dict  # environment variables, substituted
    attention_backend: str | None = None  # None: the server's own default (fa3 on Hopper for SGLang)
    min_free_slots_delay: str | int | None = None  # None: server.min_free_slots_delay
    drafter: str | None = None  # the method's own drafter (None: none, or model.drafter for DFlash and DDTree)
    engine: str | None = None  # the engine it runs on (configuration ``engines``; None: the one engine)

    def __post_init__(self):
        algorithms.get(self.algorithm)  # an unknown algorithm is refused here, never run as another

    def as_dict(self) -> dict:
        """The method as plain JSON values; ``drafter`` and ``engine`` only where the method has one (so that
        methods without one keep the content address they had)."""
        out = {
            "name": self.name,
            "algorithm": self.algorithm,
            "params": dict(self.params),
            "flags": list(self.flags),
            "env": dict(self.env),
            "attention_backend": self.attention_backend,
            "min_free_slots_delay": self.min_free_slots_delay,
        }
        if self.drafter is not None:
            out["drafter"] = self.drafter
        if self.engine is not None:
            out["engine"] = self.engine
        return out

    @classmethod
    def from_dict(cls, values: Mapping) -> "Method":
        """The method ``as_dict`` gave (a server job's, a cell's or a calibration's); ValueError naming an unknown
        key, AlgorithmError an unknown algorithm."""
        unknown = set(values) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"method: unknown keys {', '.join(sorted(unknown))}")
        return cls(
            **{
                **values,
                "params": dict(values["params"]),
                "flags": tuple(values["flags"]),
                "env": dict(values["env"]),
            }
        )

    @property
    def spec(self) -> algorithms.Algorithm:
        """Its algorithm's registry entry."""
        return algorithms.get(self.algorithm)

    @property
    def decoding(self) -> Decoding:
        """How the simulator decodes it: its algorithm and parameters, the overlap scheduler as its flags leave it,
        its environment (a DDTree build's tuning, the rank probe)."""
        return Decoding.of_params(self.algorithm, self.params, "--disable-overlap-schedule" not in self.flags, self.env)

    def shape(self) -> tuple[str, int] | None:
        """("chain", 1) or ("tree", width) of what one round verifies; None without drafting (the registry's)."""
        return self.spec.shape(self.params)

    def verify_width(self) -> int:
        """Tokens verified per request in one round (the registry's)."""
        return self.spec.verify_width(self.params)

    def tree(self) -> tuple[str | None, str | None, int | None]:
        """(its tree build, mode, width): the registry's ``tree`` of its parameters."""
        return self.spec.tree(self.params)
