"""Drafters per target family: a model profile's drafter_family picks its drafters' acceptance (sim_profiles.yaml
drafter_families), a configuration overrides it, and the profiles are checked at load."""

from __future__ import annotations

import pytest
from conftest import fast_config, validated
from specsweep.jobs import server_job
from specsweep.launcher import free_port, launch_command
from specsweep.modelling.acceptance import drafter_acceptance, mean_tau, model_drafter_family
from specsweep.modelling.decoding import Decoding
from specsweep.modelling.profiles import ProfileError, profiles
from specsweep.modelling.published import content_prompts
from specsweep.sim.args import parse_args
from specsweep.sim.engine import Engine

DFLASH = Decoding("dflash", 16, overlap=False)


def _engine(model_profile: str, profile_overrides: dict | None = None) -> Engine:
    config = fast_config()
    config["sim"]["model_profile"] = model_profile
    if profile_overrides:
        config["sim"]["profiles"] = profile_overrides
    job = server_job(validated(config), 1, "dflash")
    argv, _ = launch_command(job, free_port(), 8192)
    return Engine(parse_args(argv[3:]))


def test_a_qwen3_5_family_model_gets_its_familys_drafter_and_accepts_more_on_chat():
    """hybrid-27b (Qwen3.5-27B's shape) names the qwen3.5 family: the simulated server runs that family's DFlash
    drafter, not Qwen3-8B's, and on chat prompts it accepts more a round, as published (MT-Bench 5.47 against
    Qwen3-8B's 3.2-4.3)."""
    p = profiles()
    assert model_drafter_family(p, "hybrid-27b") == "qwen3.5"
    assert model_drafter_family(p, "qwen3-8b") == "qwen3"
    hybrid, qwen3 = _engine("hybrid-27b"), _engine("qwen3-8b")
    assert hybrid.drafter_family == "qwen3.5" and qwen3.drafter_family == "qwen3"
    assert hybrid.acceptance == drafter_acceptance(DFLASH, p, None, "qwen3.5")
    assert hybrid.acceptance != qwen3.acceptance
    chat = content_prompts(6)["chat"]
    own = mean_tau(chat, DFLASH, rounds=100, profile_set=p, family="qwen3.5")
    qwen3_tau = mean_tau(chat, DFLASH, rounds=100, profile_set=p, family="qwen3")
    assert own > qwen3_tau * 1.2


def test_a_configuration_overrides_the_family_and_its_drafters():
    """sim.profiles.models.NAME.drafter_family picks another family for a model; sim.profiles.drafter_families
    changes a family's drafter; sim.acceptance still goes over the family's DFlash parameters."""
    overridden = _engine("hybrid-27b", {"models": {"hybrid-27b": {"drafter_family": "qwen3"}}})
    assert overridden.drafter_family == "qwen3"
    assert overridden.acceptance == _engine("qwen3-8b").acceptance
    own = {"drafter_families": {"mine": {"dflash": {"base": 0.9}}}, "models": {"qwen3-8b": {"drafter_family": "mine"}}}
    mine = _engine("qwen3-8b", own)
    assert mine.drafter_family == "mine" and mine.acceptance["base"] == 0.9
    assert drafter_acceptance(DFLASH, profiles(own), {"base": 0.5}, "mine")["base"] == 0.5
    eagle3 = Decoding("eagle3", num_steps=3, topk=1, num_draft_tokens=4)
    p = profiles()
    for family in ("qwen3", "llama3"):  # a draft model's profile with the family's entry over it
        expected = {**p["drafters"]["eagle3"], **p["drafter_families"][family].get("eagle3", {})}
        got = drafter_acceptance(eagle3, p, None, family)
        assert {k: got[k] for k in expected} == expected


@pytest.mark.parametrize(
    "overrides, named",
    [
        ({"models": {"qwen3-8b": {"drafter_family": "qwen9"}}}, "model profile 'qwen3-8b': drafter_family 'qwen9'"),
        ({"drafter_families": {"mine": {"medusa": {}}}}, "drafter family 'mine': 'medusa' is not a drafter"),
        ({"drafter_families": {"mine": {"dflash": {"basis": 0.9}}}}, "drafter family 'mine': dflash.basis"),
    ],
)
def test_the_families_are_checked_at_load(overrides, named):
    with pytest.raises(ProfileError, match=named):
        profiles(overrides)
