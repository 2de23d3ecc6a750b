"""The configuration's sections that a server job carries, typed as the code reads them.

Each is the validated configuration's own dict (config/schema.yaml describes every key and fills its default), so
it stays plain JSON wherever it goes (a server job's params, a cell); the types name its keys, so that a key the
schema does not have is a type error where it is read. Keys are not all present everywhere (a calibration's server
job carries ``load.protocol`` alone; ``load.rate`` only with the poisson model), hence ``total=False``.
"""

from __future__ import annotations

from typing import TypedDict


class ModelSection(TypedDict, total=False):
    """``model``: the target model the servers serve, and the DFlash drafter."""

    name: str
    path: str
    drafter: str
    context_length: int
    load_format: str  # auto or dummy


class ServerSection(TypedDict, total=False):
    """``server``: how every server is started, waited for and stopped."""

    host: str
    startup_timeout: float
    request_timeout: float
    orphan_timeout: float
    flags: list[str]
    env: dict[str, str]
    pass_env: list[str]
    api_key_env: str
    min_free_slots_delay: str | int


class LoadSection(TypedDict, total=False):
    """``load``: how requests are offered to each cell."""

    model: str  # closed or poisson
    rate: float
    think_time: float
    protocol: str  # native, openai-chat or openai-completions
    min_requests: int
    waves: int
    connections: str  # keep-alive or per-request


class SamplingSection(TypedDict, total=False):
    """``sampling``: how the servers sample every reply."""

    temperature: float
    top_p: float
    thinking: bool
    ignore_eos: bool


class SimSection(TypedDict, total=False):
    """``sim``: the simulated backend's profiles, clock and faults; in a server job with the TP's cost model
    (``cost_model``, calibration.choose.sim_settings) and the configuration's DDTree build its method names."""

    gpu: str
    model_profile: str
    draft_model_profile: str
    runtime: str
    profiles: dict
    acceptance: dict
    startup_seconds: float
    calibration: str
    time_scale: float
    tokenizer: str
    faults: dict
    cost_model: dict
    ddtree_builds: dict


def sampling_text(sampling: SamplingSection, load: LoadSection) -> str:
    """How the replies were sampled and the requests offered, as the report's setup table says it (a configuration's
    sections, or a cell's records of them): "temperature 0, top-p 1, thinking off, load closed, protocol native"."""
    return (
        f"temperature {sampling['temperature']:g}, top-p {sampling['top_p']:g}, "
        f"thinking {'on' if sampling.get('thinking') else 'off'}, load {load['model']}, protocol {load['protocol']}"
    )
