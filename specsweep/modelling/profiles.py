"""The simulator's profiles: GPUs, models, runtimes (what the cost model prices a step with) and draft models'
acceptance (drafters), shipped in specsweep/data/sim_profiles.yaml, with a configuration's overrides
(``sim.profiles``)."""

from __future__ import annotations

import math
from functools import lru_cache
from typing import TypeGuard
from importlib import resources

from ..algorithms import REGISTRY
from ..canon import yaml_data


# The sizes every model profile states, from the model's config.json: what the cost model sizes a draft head
# (EAGLE, EAGLE-3, an MTP head: CostModel.draft_head) and prefill attention with. No default: a missing one would
# size the head as another model's.
MODEL_DIMS = {
    "hidden_size": "hidden_size (the residual stream's width; a draft head's LM head and fusion are this wide)",
    "q_dim": "num_attention_heads x head_dim (the query projection's width)",
    "kv_dim": "num_key_value_heads x head_dim (one of K or V a token, a layer)",
    "vocab": "vocab_size (a draft head's LM head has this many rows)",
}

# What else the cost model reads of every model profile (sim_profiles.yaml says what each is).
MODEL_REQUIRED = ("weight_bytes", "active_params", "layers", "kv_bytes_per_token", "hybrid")

# Where a profile states them (all shipped ones do), the counts the dims above are products of.
MODEL_HEADS = {"q_dim": "heads", "kv_dim": "kv_heads"}


class ProfileError(ValueError):
    """A profile the cost model cannot price with; the message names the profile, the key and the fix."""


def _real(value: object) -> TypeGuard[float]:
    """A finite int or float (not a bool, whose type is int's)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def model_problems(name: str, model: dict) -> list[str]:
    """Why model profile ``name`` cannot price a step or size its draft head, one message each (empty when it can):
    a key of MODEL_REQUIRED missing, a size of MODEL_DIMS missing or not a positive whole number, or q_dim / kv_dim
    not heads / kv_heads x head_dim where the profile states those."""
    out = [
        f"model profile '{name}': {key} missing; state it (sim.profiles.models.{name}.{key}, as in "
        "specsweep/data/sim_profiles.yaml)"
        for key in MODEL_REQUIRED
        if key not in model
    ]
    for key, what in MODEL_DIMS.items():
        value = model.get(key)
        if value is None:
            out.append(
                f"model profile '{name}': {key} missing, the model's {what}; state it from the model's config.json "
                f"(sim.profiles.models.{name}.{key})"
            )
        elif not (_real(value) and value > 0 and value == int(value)):
            out.append(f"model profile '{name}': {key}: {value!r} is not a positive whole number ({what})")
    for key, heads in MODEL_HEADS.items():
        if all(isinstance(model.get(k), (int, float)) for k in (key, heads, "head_dim")):
            if model[key] != model[heads] * model["head_dim"]:
                out.append(
                    f"model profile '{name}': {key} {model[key]:g} is not {heads} x head_dim "
                    f"({model[heads]:g} x {model['head_dim']:g}); fix one of them from the model's config.json"
                )
    return out


# Acceptance model, fitted by benchmarks/calibrate_sim.py to published DFlash acceptance by content and the DDTree
# paper's Qwen3-8B rows (batch 1, temperature 0); config `sim.acceptance` overrides. A draft model's profile
# (sim_profiles.yaml drafters) sets its own base, gain, cap, depth decay and second-choice ratio, and has no hard
# positions (hard_share 0).
ACCEPTANCE = {
    # a position the drafter finds easy: top-1 = min(cap, base + gain x predictability) x depth_decay^depth
    "base": 0.729,
    "gain": 0.6213,
    "cap": 0.98,
    # predictability = repetition + digit_weight x digits (text_features)
    "digit_weight": 3.9,
    "second_choice_ratio": 0.55,  # easy positions: how fast the rest of the mass falls over ranks 2, 3, ...
    "depth_decay": 0.9867,
    # the share of a draft's positions the drafter finds hard: hard_share x exp(-hard_gain x predictability) +
    # hard_structure x symbols (structure: positions where the text chooses among a few forms); at
    # a hard position its top-1 is hard_top1 and the rest falls over ranks 2, 3, ... at
    # hard_ratio x (1 - min(0.9, structure_focus x symbols)): in structured text a hard position is a choice among
    # few tokens (a key, a bracket), in prose among many
    "hard_share": 0.3429,
    "hard_gain": 2.321,
    "hard_structure": 0.08,
    "hard_top1": 0.3213,
    "hard_ratio": 0.936,
    "structure_focus": 0.4543,
    "thinking": 0.45,  # every top-1 x this with thinking mode on
    "temperature": 0.35,  # every top-1 / (1 + temperature_factor x T)
    # a request that shares its step with others: the chance, per drafted depth and round, that the batch's bf16
    # numerics (kernels and reductions chosen by the batch's shape) move the drafter's ranking there, so that the
    # target's token is ranked afresh (0 for a request alone: its numerics are the reference)
    "batch_numerics": 0.01,
}


def family_problems(profile_set: dict) -> list[str]:
    """Why the drafter families do not hold together, one message each: a model profile's ``drafter_family`` that
    ``drafter_families`` does not have, a family entry for a drafter that is neither ``dflash`` nor one of
    ``drafters`` nor an algorithm of the registry, or a parameter that drafter's acceptance model does not have
    (acceptance.ACCEPTANCE, or the drafter profile's own keys)."""
    families = profile_set.get("drafter_families", {})
    drafters = profile_set.get("drafters", {})
    out = []
    for name, model in profile_set.get("models", {}).items():
        family = model.get("drafter_family")
        if family is not None and family not in families:
            out.append(
                f"model profile '{name}': drafter_family '{family}' is not a drafter family (one of "
                f"{', '.join(sorted(families))}, sim_profiles.yaml drafter_families, or your own under "
                "sim.profiles.drafter_families)"
            )
    for family, entries in families.items():
        for drafter, params in (entries or {}).items():
            # a draft-model algorithm whose drafters profile is missing is the method's error (its acceptance)
            if drafter != "dflash" and drafter not in drafters and drafter not in REGISTRY:
                out.append(
                    f"drafter family '{family}': '{drafter}' is not a drafter (dflash, {', '.join(sorted(drafters))})"
                )
                continue
            known = set(ACCEPTANCE) | set(drafters.get(drafter, {}))
            for key in params or {}:
                if key not in known:
                    out.append(
                        f"drafter family '{family}': {drafter}.{key} is not a parameter of its acceptance model "
                        "(specsweep/modelling/acceptance.py ACCEPTANCE, or the drafters profile's keys)"
                    )
    return out


GENERIC_RUNTIME = "sglang"  # the generic runtime: the H200 fit in the form that transfers (sim_profiles.yaml)
AUTO = "auto"  # sim.runtime: the measured runtime of the GPU and model where there is one, else GENERIC_RUNTIME


def auto_runtime(gpu: str, model_profile: str, overrides: dict | None = None) -> str:
    """The runtime profile ``sim.runtime: auto`` means for this GPU and model profile: the measured runtime (the
    profiles' ``measured``: its gpu and models) where one was measured on them, else the generic one."""
    for name, measured in profiles(overrides).get("measured", {}).items():
        if measured.get("gpu") == gpu and model_profile in measured.get("models", []):
            return name
    return GENERIC_RUNTIME


def runtime_description(runtime: str, overrides: dict | None = None) -> str:
    """What a runtime profile is, as plan.md, cells and the report say it: "measured runtime <name> (<what>)", "generic
    runtime sglang (...)", or "runtime profile <name>"."""
    measured = profiles(overrides).get("measured", {})
    if runtime in measured:
        return f"measured runtime {runtime} ({measured[runtime].get('what', 'measured')})"
    if runtime == GENERIC_RUNTIME:
        return f"generic runtime {runtime} (the H200 fit on this GPU's datasheet)"
    return f"runtime profile {runtime}"


@lru_cache(maxsize=1)
def default_profiles() -> dict:
    """Hardware, model and runtime profiles shipped in specsweep/data/sim_profiles.yaml."""
    return yaml_data(resources.files("specsweep").joinpath("data/sim_profiles.yaml").read_text())


ALLREDUCE_LATENCY_MAX = 1e-3  # seconds an all-reduce step, a GPU's links' or a runtime's (cost.RUNTIME_BOUNDS)


def gpu_problems(name: str, gpu: dict) -> list[str]:
    """Why GPU profile ``name`` cannot price a step, one message each: its bandwidth or flops not a positive number,
    or its links' allreduce_latency (optional) not seconds between 0 and ALLREDUCE_LATENCY_MAX."""
    out = []
    for key in ("bandwidth", "flops"):
        value = gpu.get(key)
        if not (_real(value) and value > 0):
            out.append(
                f"GPU profile '{name}': {key} {value!r} is not a positive number (sim.profiles.gpus.{name}.{key})"
            )
    if "allreduce_latency" in gpu:
        value = gpu["allreduce_latency"]
        if not (_real(value) and 0 <= value <= ALLREDUCE_LATENCY_MAX):
            out.append(
                f"GPU profile '{name}': allreduce_latency {value!r} is not seconds between 0 and "
                f"{ALLREDUCE_LATENCY_MAX:g} (sim.profiles.gpus.{name}.allreduce_latency: one all-reduce step over "
                "its links, e.g. 75.0e-6 for 75 us)"
            )
    return out


def profiles(overrides: dict | None = None) -> dict:
    """Shipped profiles with config overrides (sim.profiles) merged in, entry by entry; every GPU and model profile
    checked (gpu_problems, model_problems: ProfileError naming the profiles and keys at fault)."""
    base = default_profiles()
    out = {kind: {name: dict(entry) for name, entry in base[kind].items()} for kind in base}
    for kind, entries in (overrides or {}).items():
        for name, entry in entries.items():
            out.setdefault(kind, {}).setdefault(name, {}).update(entry)
    problems = [why for name, gpu in out.get("gpus", {}).items() for why in gpu_problems(name, gpu)]
    problems += [why for name, model in out.get("models", {}).items() for why in model_problems(name, model)]
    problems += family_problems(out)
    if problems:
        raise ProfileError("; ".join(problems))
    return out
