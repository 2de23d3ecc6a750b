"""Rerun triggers: a job's tracked param changes exactly when its settings do, and says what changed in one line."""

from __future__ import annotations

import copy
import json

from conftest import fast_config, validated
from specsweep import rerun
from specsweep.jobs import server_job


def job_settings(config: dict, method: str = "ar") -> dict:
    return server_job(validated(config), 1, method).as_dict()


def test_the_tracked_param_changes_exactly_when_the_settings_do():
    config = fast_config()
    settings = job_settings(config)
    text = rerun.tracked("tp1/ar", settings)
    assert text.startswith("tp1/ar; settings ") and len(text) < 100  # not the kilobytes of the settings
    assert len(json.dumps(settings)) > 1000
    shuffled = dict(reversed(list(json.loads(json.dumps(settings, sort_keys=True)).items())))  # keys re-ordered
    assert rerun.tracked("tp1/ar", shuffled) == text
    for edit in (
        lambda c: c["sampling"].update(temperature=0.5),
        lambda c: c["workloads"][0].update(max_new_tokens=49),
        lambda c: c.update(seed=1),
        lambda c: c["sim"].update(startup_seconds=0.2),
    ):
        edited = copy.deepcopy(config)
        edit(edited)
        assert rerun.tracked("tp1/ar", job_settings(edited)) != text
    report_only = copy.deepcopy(config)
    report_only["report"] = {"title": "Another title"}  # no server job depends on it
    assert rerun.tracked("tp1/ar", job_settings(report_only)) == text
    assert rerun.digest_in(["'failures {}'", repr(text)]) == rerun.settings_digest(settings)
    assert rerun.digest_in(['\'{"backend": "sim"}\'']) is None  # params recorded before they carried one


def test_what_changed_is_named_by_the_keys_a_user_writes():
    config = fast_config()
    before = job_settings(config)
    config["sampling"]["temperature"] = 0.5
    assert rerun.change_line("tp1/ar", before, job_settings(config)) == "tp1/ar: sampling.temperature changed"
    config["workloads"][0]["max_new_tokens"] = 64
    config["workloads"].append({"name": "long", "family": "long", "requests": 4, "max_new_tokens": 32})
    config["concurrency"] = [1]
    line = rerun.change_line("tp1/ar", before, job_settings(config))
    assert line == (
        "tp1/ar: workloads[short].max_new_tokens, workloads[long] (added), concurrency, sampling.temperature changed"
    )
    config["seed"] = 5
    assert rerun.change_line("tp1/ar", before, job_settings(config)).endswith(" and 1 more changed")


def test_what_changed_across_server_jobs_is_said_once_per_key():
    config = fast_config()
    before = {name: job_settings(config, name.split("/")[1]) for name in ("tp1/ar", "tp1/dflash")}
    config["sampling"]["temperature"] = 0.5
    config["methods"] = config["methods"][:1]
    after = {"tp1/ar": job_settings(config)}
    assert rerun.change_line("aggregate", before, after, by="server job") == (
        "aggregate: server job tp1/dflash removed; sampling.temperature (in every server job) changed"
    )


def test_settings_are_kept_under_their_digest_and_read_back_only_if_they_match(tmp_path):
    settings = job_settings(fast_config())
    name = rerun.keep(tmp_path, settings)
    assert name == rerun.settings_digest(settings) and rerun.kept(tmp_path, name) == settings
    assert rerun.keep(tmp_path, settings) == name and len(list(tmp_path.iterdir())) == 1
    (tmp_path / f"{name}.json").write_text(json.dumps({**settings, "seed": 99}))  # edited: no longer that value
    assert rerun.kept(tmp_path, name) is None
    assert rerun.kept(tmp_path, "0" * rerun.DIGEST_CHARS) is None
