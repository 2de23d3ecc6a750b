"""Calibration without Snakemake: the fit against rows generated from a known profile, the fingerprint from the
environment record, the cache entries' checks, and the HTTP measurements against a simulated server whose cost
model is known."""

from __future__ import annotations

import csv
import io
import json
import random
import sys
import time
from dataclasses import asdict

import numpy as np
import pytest

from conftest import FIXTURES, REPO, load_default_config, start_sim, validated
from specsweep.cache import CellCache
from specsweep.calibration import choose
from specsweep.calibration import fit as fitting
from specsweep.calibration import probe as probing
from specsweep.calibration import run as calibration
from specsweep.canon import digest
from specsweep.environment import probe
from specsweep.errors import CalibrationError
from specsweep.modelling.cost import RUNTIME_BOUNDS, CostModel, runtime_problems
from specsweep.modelling.decoding import Decoding
from specsweep.modelling.method import Method
from specsweep.modelling.profiles import profiles

# the measured H200 runtime with the request latency and DFlash prefill `snakemake calibrate` fitted there
# (benchmarks/gpu/calibrate-2026-12-01; 1 us a token where that fit put none): far from the prior in every parameter
TRUTH = {
    **profiles()["runtimes"]["sglang-0.5.16-h200"],
    "request_latency": 7.4e-3,
    "request_latency_per_token": 1e-6,
    "drafter_prefill_fraction": 0.1,
    "drafter_prefill_fixed": 4.7e-3,
    # NGRAM's host work with its trie's content: not fitted by a calibration (held at the generic runtime's)
    "ngram_cpu_per_trie_token": profiles()["runtimes"]["sglang"]["ngram_cpu_per_trie_token"],
}


def _rows(truth: dict, noise: float = 0.0, seed: int = 0) -> list[dict]:
    """Rows as a calibration measures them (AR decode steps, DFlash and NGRAM rounds, the AR and DFlash servers'
    prefills and first tokens), their seconds the truth's modelled ones times a log-normal error of ``noise``."""
    p = profiles()
    cost = CostModel(p["gpus"]["H200"], p["models"]["qwen3-8b"], truth, 1, p["models"]["qwen3-0.6b"])
    rng = random.Random(seed)
    decodings = {
        "ar": Decoding("ar"),
        "dflash": Decoding("dflash", block_size=16),
        "ngram": Decoding("ngram", num_draft_tokens=8, max_bfs_breadth=8, match_type="BFS"),
    }
    rows = []
    for name, decoding in decodings.items():
        for batch in (1, 4, 16, 64):
            for context in (1024, 4096, 16384, 32768):
                rows.append(
                    {"server": name, "kind": "step", "batch": batch, "context": context, "decoding": asdict(decoding)}
                )
    for name in ("ar", "dflash"):  # each server's prefills across a stream and lone requests' first tokens
        for kind in ("prefill", "first-token"):
            for context in (256, 1024, 4096, 16384, 32768):
                row = {
                    "server": name,
                    "kind": kind,
                    "batch": 1,
                    "context": context,
                    "decoding": asdict(decodings[name]),
                }
                rows.append({**row, "stream_context": 140} if kind == "prefill" else row)
    for row in rows:
        row["seconds"] = fitting.modelled_seconds(cost, row) * (1 + rng.gauss(0, noise))
    return rows


def _fit(rows):
    p = profiles()
    truth = TRUTH
    fixed = {k: v for k, v in truth.items() if k not in fitting.FITTED}
    return fitting.fit_runtime(rows, p["gpus"]["H200"], p["models"]["qwen3-8b"], p["models"]["qwen3-0.6b"], 1, fixed)


def test_the_fit_recovers_a_known_profile_from_its_own_steps():
    truth, prior = TRUTH, fitting.prior()
    exact = _fit(_rows(truth))
    # what no row reaches keeps the prior: the CPU behind the overlap scheduler, the draft models' costs, the KV
    # pages two requests share (no two prompts alike)
    untouched = {"cpu_step", "spec_cpu_per_request", "draft_step_overhead", "draft_per_request", "shared_kv_reads"}
    assert untouched <= set(exact.held) <= set(exact.not_identified)
    assert all(exact.runtime[name] == pytest.approx(prior[name], rel=1e-3) for name in untouched)
    # NGRAM at one width cannot split its CPU work per request from per node: one is held, their sum is right
    assert "ngram_cpu_per_node" in exact.held
    per_request = exact.runtime["ngram_cpu_per_request"] + 8 * exact.runtime["ngram_cpu_per_node"]
    assert per_request == pytest.approx(truth["ngram_cpu_per_request"] + 8 * truth["ngram_cpu_per_node"], rel=0.005)
    # every other parameter back at the profile the steps came from, though the fit starts elsewhere
    fitted = [n for n in fitting.FITTED if n not in exact.held and not n.startswith("ngram_cpu")]
    assert {n: exact.runtime[n] for n in fitted} == pytest.approx({n: truth[n] for n in fitted}, rel=0.005)
    assert all(abs(prior[n] / truth[n] - 1) > 0.05 for n in fitted)  # it had somewhere to go


def test_with_measurement_noise_every_identified_parameter_is_within_five_percent():
    """Steps with a 0.5% error each (about what a median of a shape's steps keeps): the parameters the fit calls
    identified are within 5% of the truth, and those it does not are flagged, not silently wrong."""
    truth = TRUTH
    for seed in range(3):
        fit = _fit(_rows(truth, noise=0.005, seed=seed))
        errors = {name: fit.runtime[name] / truth[name] - 1 for name in fit.identified}
        assert all(abs(e) < 0.05 for e in errors.values()), errors
        assert {
            "layer_overhead",
            "attention_bandwidth_efficiency",
            "attention_request_efficiency",
            "verify_attention_reads",
            "verify_request_attention_reads",
        } <= set(fit.identified), fit.not_identified
        assert 0.003 <= fit.scatter < 0.008  # the residuals are the noise, nothing the model lacks


def test_a_fit_with_no_parameter_left_free_keeps_where_it_is():
    """The fit's second pass keeps only the parameters some measured shape depends on; where none is left (a busy
    host had skipped the shapes that did), least squares has nothing to move and returns (it raised a matmul
    ValueError from inside the calibration job)."""
    residuals = np.array([0.1, -0.2, 0.05])
    out = fitting.least_squares(lambda x: residuals, [], limits=(np.array([]), np.array([])))
    assert out.shape == (0,)


def test_parameters_the_rows_cannot_tell_apart_are_not_identified():
    """One AR step (batch 16, 4k context): the KV-read efficiency, the per-layer cost and the compute efficiency
    all move that one number, so at most one of them is identified, and nothing of the drafter or the prefill."""
    truth = TRUTH
    rows = [r for r in _rows(truth) if r["server"] == "ar" and r["kind"] == "step"]
    fit = _fit([r for r in rows if r["context"] == 4096 and r["batch"] == 16])
    assert len(fit.identified) <= 1
    assert "drafter_fraction" in fit.not_identified and "prefill_fixed" in fit.not_identified


def test_fingerprint_of_a_real_gpu_host_and_its_digest():
    environment = json.loads((REPO / "benchmarks/gpu/record-2026-11-30/environment.json").read_text())
    config = {"model": {"name": "Qwen3-8B"}, "tp": [1, 2]}
    value = choose.fingerprint(environment, config, 1)
    assert value == {
        "gpu": "NVIDIA H200",
        "gpu_count": 2,
        "driver": "580.159.04",
        "engine_version": "sglang 0.5.16",
        "engine_commit": "sha256=b8ed16e72c7d6a643e31ba52e3ff106439e9dbb78543950e4c810158b826ea8e",
        "model": "Qwen3-8B",
        "tp": 1,
    }
    names = {e["digest"] for e in calibration.fingerprints({None: environment}, config)}
    assert len(names) == 2 and all(len(n) == 12 for n in names)  # one per TP
    other = json.loads(json.dumps(environment))
    other["hardware"]["driver"] = "580.200.01"
    assert choose.fingerprint_digest(choose.fingerprint(other, config, 1)) != choose.fingerprint_digest(value)
    assert choose.fingerprint_digest(value) == choose.fingerprint_digest(dict(value))


def test_every_start_of_a_server_is_kept_and_the_longest_first_start_is_cold():
    """An entry written before starts were kept counts as its one start; a server started again adds its start;
    cold is the longest first start (a first start on a host whose caches an earlier run filled is warm), warm the
    median of the others; a calibration of one server (AR alone) has both, so that the plan can use it."""
    legacy = {"startup_s": 150.0, "first_on_host": True, "measured_at": "2026-12-01T18:00:00+00:00"}
    assert calibration.startups(legacy) == [{"seconds": 150.0, "first_on_host": True, "at": legacy["measured_at"]}]
    assert calibration.startups(None) == []
    ar = {"startups": calibration.startups(legacy) + [{"seconds": 70.0, "first_on_host": True, "at": "later"}]}
    dflash = {"startups": [{"seconds": s, "first_on_host": False, "at": "t"} for s in (76.0, 68.0, 90.0)]}
    assert calibration.startup([ar, dflash]) == {"cold_s": 150.0, "warm_s": 76.0}
    # every start warm: the longest is cold; one server's one start: warm is that start (no later server is slower)
    assert calibration.startup([dflash]) == {"cold_s": 90.0, "warm_s": 76.0}
    assert calibration.startup([{"startups": [{"seconds": 120.0, "first_on_host": True, "at": "t"}]}]) == {
        "cold_s": 120.0,
        "warm_s": 120.0,
    }


def test_a_cache_entry_is_used_only_when_its_checks_pass():
    entry = {"key": "k" * 64, "fingerprint": {"tp": 1}, "rows": [], "startup_s": 1.0}
    entry["digest"] = digest(entry)
    assert calibration.entry_problem(entry, "k" * 64, {"tp": 1}) is None
    edited = dict(entry, startup_s=2.0)
    assert "digest" in calibration.entry_problem(edited, "k" * 64, {"tp": 1})
    assert "key" in calibration.entry_problem(entry, "j" * 64, {"tp": 1})
    assert "fingerprint" in calibration.entry_problem(entry, "k" * 64, {"tp": 2})
    assert calibration.entry_problem({}, "k" * 64, {"tp": 1}) is not None


@pytest.fixture
def truth_server(tmp_path):
    truth = json.dumps({"runtimes": {"truth": TRUTH}})
    server = start_sim(tmp_path, "--sim-runtime", "truth", "--sim-profiles", truth, "--max-running-requests", "8")
    yield server
    server.stop()


def _cost():
    return CostModel.named("H200", "qwen3-8b", "truth", overrides={"runtimes": {"truth": TRUTH}})


def test_measured_decode_steps_and_prefill_match_the_simulated_cost_model(truth_server):
    """Through the HTTP API only: a batch's steps and a prefill across a streaming request, against the cost model
    the simulated server sleeps (within 5%: the chunks' timing on a shared machine)."""
    probe = probing.open_probe(truth_server.url, {}, truth_server.alive, 60, 40960)
    assert probe.tokens_per_word == 1.0  # the simulator counts a word as a token
    step = probing.measure_batch(probe, 4, 4096, 24, "a")
    row = {"kind": "step", "batch": 4, "context": step["context"], "decoding": asdict(Decoding())}
    assert step["seconds"] == pytest.approx(fitting.modelled_seconds(_cost(), row), rel=0.05)
    prefill = probing.measure_prefill(probe, 8192, 2, 24, "b")
    row = {"kind": "prefill", "batch": 1, "context": prefill["context"], "decoding": asdict(Decoding())}
    row["stream_context"] = prefill["stream_context"]
    assert prefill["seconds"] == pytest.approx(fitting.modelled_seconds(_cost(), row), rel=0.05)
    # a lone request's first token: its prefill and the time outside the steps (request_latency, 9 ms at 4k
    # tokens in this runtime, 8% of the whole: a server that left it out would be outside 5%)
    first = probing.measure_first_token(probe, 4096, 3, "f")
    row = {"kind": "first-token", "batch": 1, "context": first["context"], "decoding": asdict(Decoding())}
    assert _cost().request_latency(first["context"]) > 0.07 * fitting.modelled_seconds(_cost(), row)
    assert first["seconds"] == pytest.approx(fitting.modelled_seconds(_cost(), row), rel=0.05)


def test_shapes_the_server_cannot_take_are_skipped_with_the_reason(truth_server):
    probe = probing.open_probe(truth_server.url, {}, truth_server.alive, 60, 2048)
    assert "model.context_length" in probing.measure_batch(probe, 1, 4096, 24, "c")["skipped"]
    probe.capacity = 10_000
    assert "KV cache" in probing.measure_batch(probe, 8, 2048 - 64, 24, "d")["skipped"]
    probe.context_length = 40960
    probe.capacity = None
    # more requests than the server runs at once (--max-running-requests 8): never all in flight together
    assert "did not hold the batch" in probing.measure_batch(probe, 16, 256, 24, "e")["skipped"]


def test_the_sglang_path_calibrates_a_server_that_speaks_sglang_and_reuses_its_cache(tmp_path, monkeypatch):
    """backend: sglang end to end (environment probe, launch command, flag checks, the pool's GPU lookup) against
    a stand-in interpreter whose `-m sglang.launch_server` runs the simulated server; the second calibration of the
    same fingerprint starts no server."""
    monkeypatch.setenv("SPECSWEEP_PYTHON", sys.executable)
    python = str(FIXTURES / "sglang_via_sim.sh")
    config = load_default_config()
    config.update(backend="sglang", sglang={"python": python}, cache_dir=str(tmp_path / "cache"))
    config["server"] = {"pass_env": ["SPECSWEEP_PYTHON"]}  # the stand-in's interpreter, which the host passes
    config["methods"] = [{"name": "ar", "algorithm": "ar"}, {"name": "dflash", "algorithm": "dflash"}]
    config["calibration"] = {"batches": [1, 4], "contexts": [1024, 4096], "new_tokens": 24, "prefill_repeats": 1}
    config = validated(config)
    environment = probe("sglang", python)
    environment["hardware"]["gpus"] = [{"index": 0, "name": "NVIDIA H200", "driver": "580.159.04"}]  # as on a GPU host
    job = calibration.calibration_job(config, environment, 1)
    out = (str(tmp_path / "profile.yaml"), str(tmp_path / "table.csv"))
    first = calibration.calibrate(job, environment, *out, tmp_path)
    assert first["measured"] == ["ar", "dflash"] and first["cached"] == []
    profile = calibration.read_profile(out[0])
    assert profile["fingerprint"]["engine_version"] == "sglang 0.5.23" and profile["simulated"] is False
    assert profile["profiles"] == {"gpu": config["sim"]["gpu"], "model": config["sim"]["model_profile"]}
    # on each server its prefills and first tokens, then every batch x context
    with open(out[1]) as handle:  # a shape skipped (on a busy host, say) is named with its reason
        skipped = [(r["server"], r["kind"], r["batch"], r["context"], r["skipped"]) for r in csv.DictReader(handle)]
    assert profile["shapes"]["measured"] == 2 * (2 + 2 + 4), [r for r in skipped if r[-1]]
    # the profile written is the one the plan and the simulated backend choose on this host (same fingerprint)
    chosen = choose.choose(config, environment, str(tmp_path))["by_tp"]["1"]
    assert chosen["calibration"] == out[0] and chosen["label"].startswith("measured on ")
    assert (tmp_path / "server-calibration-tp1-dflash.log").exists()
    (tmp_path / "server-calibration-tp1-dflash.log").unlink()
    again = calibration.calibrate(job, environment, *out, tmp_path)
    assert again["measured"] == [] and again["cached"] == ["ar", "dflash"]
    assert not (tmp_path / "server-calibration-tp1-dflash.log").exists()
    assert calibration.read_profile(out[0])["runtime"] == profile["runtime"]
    # an entry edited in the cache is named, not used, and its server measured again
    cache = CellCache(tmp_path / "cache" / "calibration")
    key = calibration.entry_key(job, calibration.job_methods(job)[1])
    entry = cache.get(key)
    entry["rows"][0]["seconds"] *= 2
    cache.put(key, entry)
    log = io.StringIO()
    third = calibration.calibrate(job, environment, *out, tmp_path, log=log)
    assert third["measured"] == ["dflash"] and third["cached"] == ["ar"]
    assert f"cache entry {cache.path(key)} not used: its content does not match its digest" in log.getvalue()
    # one more context: each server starts again for the shapes its entry lacks, and only those are measured
    config["calibration"]["contexts"] = [512, 1024, 4096]
    more = calibration.calibration_job(config, environment, 1)
    assert calibration.entry_key(more, calibration.job_methods(more)[1]) == key  # the shapes are not part of the key
    with open(out[1]) as handle:  # a shape the last calibration skipped for a reason that passes is measured again
        retried = {
            f"calibration {r['server']} {r['kind']} b{r['batch']} c{r['context']}"
            for r in csv.DictReader(handle)
            if r["skipped"]
        }
    log = io.StringIO()
    fourth = calibration.calibrate(more, environment, *out, tmp_path, log=log)
    assert fourth["measured"] == ["ar", "dflash"] and fourth["cached"] == []
    shapes = [
        line.split(": ")[0]
        for line in log.getvalue().splitlines()
        if line.startswith(("calibration ar ", "calibration dflash "))
    ]
    # each server: a prefill, a first token and two batches at 512 tokens, and whatever a busy host had it skip
    assert sorted(s for s in shapes if s.endswith(" c512")) == sorted(
        f"calibration {server} {kind} b{batch} c512"
        for server in ("ar", "dflash")
        for kind, batch in (("prefill", 1), ("first-token", 1), ("step", 1), ("step", 4))
    ), shapes
    assert {s for s in shapes if not s.endswith(" c512")} <= retried, shapes
    assert calibration.read_profile(out[0])["shapes"]["measured"] == 2 * (3 + 3 + 6)
    # and back to the first shapes: all of them in the cache, no server started
    config["calibration"]["contexts"] = [1024, 4096]
    fifth = calibration.calibrate(calibration.calibration_job(config, environment, 1), environment, *out, tmp_path)
    assert fifth["measured"] == [] and calibration.read_profile(out[0])["shapes"]["measured"] == 16


def test_shapes_beyond_the_time_bound_are_skipped_and_listed(truth_server):
    probe = probing.open_probe(truth_server.url, {}, truth_server.alive, 60, 40960)
    settings = {"batches": [1], "contexts": [512, 1024, 2048, 4096], "new_tokens": 24, "prefill_repeats": 1}
    method = Method("ar", "ar", {}, (), {})
    rows = probing.measure_shapes(probe, method, settings, time.monotonic() + 0.3, log=io.StringIO())
    assert len(rows) == 4 + 4 + 4 and "seconds" in rows[0]  # prefills, first tokens, steps; the first always runs
    skipped = [r for r in rows if r.get("skipped")]
    assert skipped and all("time bound (calibration.max_seconds_per_tp)" == r["skipped"] for r in skipped)
    assert rows[-1] in skipped  # what is left when the share is spent


def test_a_shape_the_simulated_server_ran_late_is_measured_again(monkeypatch):
    """On the simulated backend the server's own account of late steps (specsweep_sim counters) marks a shape the
    host did not run in time: it is measured again (at most LATE_RETRIES times), the last kept with its share."""
    results = iter([{"seconds": 2.0, "late_share": 0.2}, {"seconds": 1.5, "late_share": 0.03}, {"seconds": 1.0}])
    calls = []

    def once(*args):
        calls.append(args)
        return next(results)

    monkeypatch.setattr(probing, "_measure_batch_once", once)
    assert probing.measure_batch(None, 4, 512, 24, "s") == {"seconds": 1.0} and len(calls) == 3
    results = iter([{"seconds": 3.0, "late_share": 0.5}] * 3)
    calls.clear()
    assert probing.measure_batch(None, 4, 512, 24, "s") == {"seconds": 3.0, "late_share": 0.5}
    assert len(calls) == 1 + probing.LATE_RETRIES


def test_the_fit_keeps_every_parameter_within_its_bounds(monkeypatch):
    """Steps a thousand times slower than any engine's (a host that stalled throughout): the fit puts what it moves
    at the edge of its bounds, not past them, so that the profile it writes is one the cost model reads back (with
    only the -40..40 box of before, the per-layer and fixed costs went past their bounds)."""
    rows = [{**row, "seconds": 1000 * row["seconds"]} for row in _rows(TRUTH) if row["server"] == "ar"]
    fit = _fit(rows)
    assert runtime_problems(fit.runtime) == []
    assert fit.runtime["layer_overhead"] == pytest.approx(RUNTIME_BOUNDS["layer_overhead"].high, rel=1e-3)
    monkeypatch.setattr(fitting, "_free_limits", lambda names: (-40.0, 40.0))
    assert any(p.startswith(("layer_overhead", "prefill_fixed")) for p in runtime_problems(_fit(rows).runtime))


def test_a_configured_runtime_that_cannot_price_a_step_is_refused_before_any_server(tmp_path):
    """The parameters the fit takes from the configured runtime (bandwidth_efficiency, allreduce_latency, ...) out
    of their bounds: the calibration names the parameter before it starts a server (it ended in a
    ZeroDivisionError after measuring)."""
    config = load_default_config()
    config.update(cache_dir=str(tmp_path / "cache"))
    config["methods"] = [{"name": "ar", "algorithm": "ar"}]
    environment = {"backend": "sim", "server": {"version": "test"}}
    job = calibration.calibration_job(validated(config), environment, 1)
    job["sim_profiles"]["runtime"]["bandwidth_efficiency"] = 0
    with pytest.raises(CalibrationError) as raised:
        calibration.calibrate(job, environment, str(tmp_path / "p.yaml"), str(tmp_path / "t.csv"), tmp_path)
    assert str(raised.value).startswith(
        "calibration tp1: the runtime sim.runtime names cannot price a step (bandwidth_efficiency: 0 must be above 0"
    )
    assert not list(tmp_path.glob("server-*.log")) and not (tmp_path / "p.yaml").exists()


def test_a_calibration_entry_is_keyed_by_what_its_server_runs_not_by_names():
    """A renamed method or engine finds its measurements (the fingerprint holds the engine's build), as a renamed
    engine's cells do; its parameters still key it."""
    job = {"fingerprint": {"gpu": "H200", "engine_version": "sglang 0.5.16"}, "server_job": {"model": {}, "server": {}}}
    job["server_job"]["sim"] = None
    method = {"name": "ar@base", "engine": "base", "algorithm": "ar", "params": {}, "flags": [], "env": {}}
    settings = {"new_tokens": 24, "prefill_repeats": 1}
    key = calibration.server_key(job, method, settings)
    assert calibration.server_key(job, dict(method, name="ar@renamed", engine="renamed"), settings) == key
    assert calibration.server_key(job, dict(method, env={"SGLANG_X": "1"}), settings) != key
