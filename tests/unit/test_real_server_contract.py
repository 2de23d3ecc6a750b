"""What a real SGLang server does that the client and the launch commands must match (SGLang 0.5.16 on a GPU).

Checked offline against what that server answered and offered on an H200 (the cells of benchmarks/gpu, its help
text in tests/fixtures, its option table in specsweep/data), and on loopback through the timing stub and the
simulated server, which reproduce that behaviour. Tests with a live SGLang: test_sglang_live.py (on demand).

In-band failures, aborts, long stream lines, incremental streams, fixed output lengths, SGLang's own
acceptance length, the attention backend per method, the DDTree spelling, flags chosen from the probed build,
the cache report for OpenAI protocols, the min-free-slots delay, dummy weights and git pins.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace

import pytest
import yaml

from conftest import REPO, fast_config, load_default_config, one, patience, start_sim, start_stub, validated
from specsweep import config as cfg
from specsweep import implied
from specsweep.jobs import server_job, servers
from specsweep.methods import expand_methods
from specsweep import metrics as m
from specsweep.bench import Progress, bench_server
from specsweep.cells import keyed_cells
from specsweep.client import LoadModel, measure
from specsweep.environment import ServerEnvironmentError, probe, resolve_git_refs
from specsweep.launcher import (
    ServerError,
    launch_command,
    min_free_slots_delay,
    server_arguments,
    start_server,
    stream_mode,
)


SCHEDULE = "0.01:1,0.01:1,0.01:1,0.01:1,0.01:1,0.01:1"  # six chunks of one token


def _records(url, protocol, n, concurrency=1, **load):
    sessions = [one(f"prompt {i}", 6) for i in range(n)]
    return [
        r.as_dict()
        for r in measure(
            url,
            sessions,
            concurrency,
            {"temperature": 0.0},
            timeout=patience(4),
            load=LoadModel(protocol=protocol, **load),
        )
    ]


@pytest.mark.parametrize("protocol", ["native", "openai-chat", "openai-completions"])
def test_in_band_errors_and_aborts_are_failed_requests(tmp_path, protocol):
    server = start_stub(tmp_path, "--schedule", SCHEDULE, "--behaviours", "ok,error@0,error@3,abort@2")
    try:
        records = _records(server.url, protocol, 4)
    finally:
        server.stop()
    assert [r["error"] for r in records] == [None, "server_error", "server_error", "aborted"]
    failed_after = [len(r["chunk_times"]) for r in records]
    assert failed_after == [6, 0, 3, 2]  # what arrived before the failure is kept in the record
    cell = m.cell_metrics(records, tp=1, concurrency=1)
    assert cell["requests_completed"] == 1 and cell["requests_failed"] == 3
    assert cell["failures"] == {"server_error": 2, "aborted": 1}
    assert cell["output_tokens"] == 6  # partial outputs of failed requests never enter throughput
    assert cell["ttft"]["n"] == 1  # nor latency statistics
    assert cell["ttft_with_failures"]["n"] == 4


def test_a_huge_stream_line_is_read_and_a_broken_chunk_fails_only_its_request(tmp_path):
    server = start_stub(tmp_path, "--schedule", SCHEDULE, "--behaviours", "ok,longline,garbage,ok")
    try:
        records = _records(server.url, "native", 4, concurrency=2)
    finally:
        server.stop()
    errors = sorted(str(r["error"]) for r in records)
    assert errors == ["None", "None", "None", "client_error"]
    long = [r for r in records if len(r["output_text"]) > 600 * 1024]
    assert len(long) == 1 and long[0]["output_tokens"] == 6  # a 600 KiB line (aiohttp's limit is 512 KiB)
    broken = next(r for r in records if r["error"])
    assert "AttributeError" in broken["error_detail"]
    assert m.cell_metrics(records, tp=1, concurrency=1)["requests_sent"] == 4  # the cell keeps every record


def test_incremental_and_cumulative_streams_give_the_same_text_and_tokens(tmp_path):
    prompts = [one("Write a haiku about the sea.", 40), one("def f(x):\n    return x * 2\n" * 4, 40)]
    results = {}
    for mode, flags in (("cumulative", ()), ("incremental", ("--incremental-streaming-output",))):
        server = start_sim(tmp_path, *flags)
        try:
            records = measure(
                server.url, prompts, 1, {"temperature": 0.0}, 30, load=LoadModel(incremental=mode == "incremental")
            )
        finally:
            server.stop()
        results[mode] = [(r.output_text, r.chunk_tokens, r.error) for r in records]
    assert results["incremental"] == results["cumulative"]
    assert all(text for text, _, _ in results["cumulative"])


def test_ignore_eos_asks_for_exact_lengths_and_counts_mismatches(tmp_path):
    server = start_stub(tmp_path, "--schedule", SCHEDULE)  # always six tokens
    try:
        asked_six = _records(server.url, "native", 2, ignore_eos=True)
        asked_more = [
            r.as_dict() for r in measure(server.url, [one("x", 10)] * 3, 1, {}, 20, load=LoadModel(ignore_eos=True))
        ]
        natural = [r.as_dict() for r in measure(server.url, [one("x", 10)] * 3, 1, {}, 20)]
    finally:
        server.stop()
    assert m.length_mismatches(asked_six) == 0
    assert m.length_mismatches(asked_more) == 3
    assert m.length_mismatches(natural) == 0  # without ignore_eos a shorter reply is a natural stop


def test_per_request_connections_open_a_new_connection_for_every_request(tmp_path):
    server = start_stub(tmp_path, "--schedule", "0.01:1,0.01:1")
    ports = {}
    try:
        for mode in ("per-request", "keep-alive"):
            seen = []
            measure(
                server.url,
                [one("x", 2)] * 6,
                1,
                {},
                20,
                load=LoadModel(connections=mode),
                on_chunk=lambda now, chunk: seen.append(chunk["meta_info"]["client_port"]),
            )
            ports[mode] = len(set(seen))
    finally:
        server.stop()
    assert ports == {"per-request": 6, "keep-alive": 1}


def test_sglang_acceptance_length_is_recorded_beside_ours(tmp_path):
    server = start_sim(tmp_path, "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", "d")
    try:
        records = [
            r.as_dict()
            for r in measure(server.url, [one("1, 2, 3, 4, 5, 6, 7, 8, 9", 64)] * 3, 1, {"temperature": 0.0}, 30)
        ]
    finally:
        server.stop()
    verify = sum(r["verify_ct"] for r in records)
    tokens = sum(r["output_tokens"] for r in records)
    assert m.acceptance_length(records) == pytest.approx((tokens - 3) / verify)  # ours: the prefill token excluded
    assert m.acceptance_length_sglang(records) == pytest.approx(tokens / verify)  # SGLang's spec_accept_length
    assert all(r["server_accept_length"] == pytest.approx(r["output_tokens"] / r["verify_ct"]) for r in records)


# ------------------------------------------------------------------ launch commands


def _params(config, method, protocol="native"):
    config.setdefault("load", {})["protocol"] = protocol
    c = validated(config)
    return c, server_job(c, 1, method)


def test_ddtree_spelling_follows_the_pull_request_and_records_the_attention_backend():
    config = load_default_config()
    config["methods"] = [
        {"name": "ar", "algorithm": "ar"},
        {"name": "dflash", "algorithm": "dflash"},
        {"name": "t", "algorithm": "ddtree", "budget": [8, 32]},
    ]
    methods = {x.name: x for x in expand_methods(validated(config))}
    for name in ("t-b8", "t-b32"):
        flags = list(methods[name].flags)
        assert flags[flags.index("--page-size") + 1] == "1"
        assert flags[flags.index("--attention-backend") + 1] == "triton"
        assert methods[name].attention_backend == "triton"
    assert methods["ar"].attention_backend is None and "--attention-backend" not in methods["ar"].flags
    assert methods["dflash"].as_dict()["attention_backend"] is None  # the server's default (fa3 on Hopper)

    config["match_ddtree_attention"] = True
    matched = {x.name: x for x in expand_methods(validated(config))}
    assert {x.attention_backend for x in matched.values()} == {"triton"}
    assert "--attention-backend" in matched["ar"].flags


def test_a_tree_budget_on_another_attention_backend_is_refused_naming_the_method():
    config = load_default_config()
    config["methods"] = [{"name": "t", "algorithm": "ddtree", "budget": 32, "attention_backend": "fa3"}]
    with pytest.raises(cfg.ConfigError, match=r"methods\[0\] \(t\).*budget 32 builds a tree.*triton"):
        validated(config)
    config["methods"][0]["budget"] = 15  # budget <= block_size - 1: a chain (spine mode), any backend
    assert expand_methods(validated(config))[0].attention_backend == "fa3"


def test_launch_flags_come_from_the_build_that_will_run():
    config = load_default_config()
    config["methods"] = [{"name": "dflash", "algorithm": "dflash"}]
    c, params = _params(config, "dflash")
    newer = server_arguments(params, 30000, 8192)  # no build at hand: the recorded table
    assert "--cuda-graph-max-bs-decode" in newer and "--cuda-graph-max-bs" not in newer
    older_build = {"--cuda-graph-max-bs", "--stream-output"}
    older = server_arguments(params, 30000, 8192, offered=older_build)
    assert older[older.index("--cuda-graph-max-bs") + 1] == "16"  # the highest concurrency
    assert "--stream-output" in older and stream_mode(older, "native") == "incremental"
    assert "--cuda-graph-max-bs-decode" not in older and "--min-free-slots-delay" not in older


def test_openai_protocols_ask_for_the_cache_report_and_native_for_incremental_streams():
    _, native = _params(load_default_config(), "ar")
    _, chat = _params(load_default_config(), "ar", "openai-chat")
    native_argv, chat_argv = server_arguments(native, 1, 8192), server_arguments(chat, 1, 8192)
    assert "--incremental-streaming-output" in native_argv and "--enable-cache-report" not in native_argv
    assert "--enable-cache-report" in chat_argv and stream_mode(chat_argv, "openai-chat") == "deltas"


def test_simulated_openai_usage_reports_cached_tokens_only_with_the_cache_report(tmp_path):
    import requests

    body = {"messages": [{"role": "user", "content": "hello " * 100}], "max_tokens": 4, "stream": False}
    details = {}
    for flags in ((), ("--enable-cache-report",)):
        server = start_sim(tmp_path, *flags)
        try:
            for _ in range(2):
                usage = requests.post(server.url + "/v1/chat/completions", json=body, timeout=30).json()["usage"]
        finally:
            server.stop()
        details[flags] = usage["prompt_tokens_details"]
    assert details[()] is None
    assert details[("--enable-cache-report",)]["cached_tokens"] > 0


def test_min_free_slots_delay_is_a_setting_per_server_and_method():
    config = load_default_config()
    config["methods"] = [
        {"name": "dflash", "algorithm": "dflash"},
        {"name": "dflash-sglang", "algorithm": "dflash", "min_free_slots_delay": "sglang"},
        {"name": "dflash-4", "algorithm": "dflash", "min_free_slots_delay": 4},
    ]
    c = validated(config)
    argv = {name: server_arguments(server_job(c, 1, name), 1, 8192) for name in ("dflash", "dflash-sglang", "dflash-4")}
    assert argv["dflash"][argv["dflash"].index("--min-free-slots-delay") + 1] == "0"  # default: disabled
    assert "--min-free-slots-delay" not in argv["dflash-sglang"]  # SGLang's own rule
    assert argv["dflash-4"][argv["dflash-4"].index("--min-free-slots-delay") + 1] == "4"
    config["server"] = {"min_free_slots_delay": "sglang"}
    c = validated(config)
    assert "--min-free-slots-delay" not in server_arguments(server_job(c, 1, "dflash"), 1, 8192)
    # a job that names no setting gets the schema's default, the one a configuration without the key gets
    schema = yaml.safe_load((REPO / "config" / "schema.yaml").read_text())
    default = schema["properties"]["server"]["properties"]["min_free_slots_delay"]["default"]
    unset = server_job(c, 1, "dflash")
    unset = replace(unset, server={}, method=replace(unset.method, min_free_slots_delay=None))
    assert min_free_slots_delay(unset) == default


def test_dummy_weights_load_for_target_and_drafter():
    config = load_default_config()
    config["model"]["load_format"] = "dummy"
    config["methods"] = [{"name": "ar", "algorithm": "ar"}, {"name": "dflash", "algorithm": "dflash"}]
    c = validated(config)
    ar = server_arguments(server_job(c, 1, "ar"), 1, 8192)
    dflash = server_arguments(server_job(c, 1, "dflash"), 1, 8192)
    assert ar[ar.index("--load-format") + 1] == "dummy" and "--speculative-draft-load-format" not in ar
    assert dflash[dflash.index("--speculative-draft-load-format") + 1] == "dummy"
    with pytest.raises(ServerError, match="model.load_format: dummy needs --speculative-draft-load-format"):
        server_arguments(server_job(c, 1, "dflash"), 1, 8192, offered={"--load-format"})


def test_a_flag_the_probed_build_lacks_stops_before_any_server_starts(tmp_path):
    config = load_default_config()
    config["methods"] = [{"name": "ar", "algorithm": "ar"}]
    config["server"] = {"flags": ["--sampling-backend", "pytorch"]}
    c = validated(config)
    params = server_job(c, 1, "ar")
    environment = probe("sim")
    environment["capabilities"]["flags"] = [
        f for f in environment["capabilities"]["flags"] if f != "--sampling-backend"
    ]
    with pytest.raises(ServerError, match="does not offer --sampling-backend"):
        start_server(params, {"short": []}, environment, tmp_path / "server.log", None, [], {})
    assert not (tmp_path / "server.log").exists()  # nothing was started


def test_gpu_check_config_is_valid_and_sized_for_its_concurrency():
    config = yaml.safe_load((REPO / "config" / "gpu-check.yaml").read_text())
    assert config["model"]["load_format"] == "dummy" and config["tp"] == [1]
    assert {m["algorithm"] for m in config["methods"]} == {"ar", "dflash"}
    assert {w["family"] for w in config["workloads"]} == {"short", "long"}
    assert config["concurrency"] == [1, 4, 16]
    assert all(w["requests"] >= 3 * max(config["concurrency"]) for w in config["workloads"])
    c = validated(config)  # its launch commands parse with SGLang 0.5.16's recorded option table
    for server in servers(c):
        argv, _ = launch_command(server_job(c, 1, server["method"]), 30000, 16384, "python3")
        assert argv[argv.index("--attention-backend") + 1] == "triton"
        assert argv[argv.index("--load-format") + 1] == "dummy"


# ------------------------------------------------------------------ provenance


def _git(*args, cwd):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def test_a_moving_git_ref_is_pinned_to_a_commit_that_is_part_of_the_identity(tmp_path):
    repo = tmp_path / "sglang"
    repo.mkdir()
    _git("init", "-q", "-b", "main", cwd=repo)
    _git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "one", cwd=repo)
    requirement = f"sglang[all] @ git+file://{repo}@main#subdirectory=python"
    pinned, pins = resolve_git_refs([requirement, "numpy==2.0"])
    first = pins[0]["commit"]
    assert len(first) == 40 and pinned[0] == requirement.replace("@main#", f"@{first}#") and pinned[1] == "numpy==2.0"
    _git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "two", cwd=repo)
    second = resolve_git_refs([requirement])[1][0]["commit"]
    assert second != first
    fake = str(REPO / "tests" / "fixtures" / "fake_sglang_python.sh")
    help_text = (REPO / "tests" / "fixtures" / "sglang-0.5.23-help.txt").read_text()
    a = probe("sglang", fake, help_text, pins=[{**pins[0]}])
    b = probe("sglang", fake, help_text, pins=[{**pins[0], "commit": second}])
    assert a["server"]["commit"] == first and b["server"]["commit"] == second
    assert a["identity_digest"] != b["identity_digest"]  # two hosts that built different heads share no cells
    assert a["software"]["sglang-kernel"] == "0.4.5"
    with pytest.raises(ServerEnvironmentError, match="cannot resolve 'no-such-branch'"):
        resolve_git_refs([f"x @ git+file://{repo}@no-such-branch"])


def test_progress_lines_say_cell_requests_and_time_left():
    import io

    out = io.StringIO()
    cells = [{"output": f"c{i}.json", "workload": "short", "concurrency": c} for i, c in enumerate((1, 4, 16))]
    progress = Progress("tp1/ar", cells, cells[1:], {"c1.json": 100.0, "c2.json": 50.0}, every=0.0, out=out)
    progress.start(cells[1], 4)  # the first cell came from the cache
    progress.request_done()
    progress.request_done()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith(
        "[tp1/ar] cell 2 of 3 (short, concurrency 4; 1 of 2 to measure): 0/4 requests done; about 2 min 30 s left"
    )
    assert "2/4 requests done; about 1 min 40 s left" in lines[-1]  # half of this cell (50 s) + the last (50 s)


def test_the_recorded_0516_build_offers_what_the_gpu_check_needs():
    help_text = (REPO / "tests" / "fixtures" / "sglang-0.5.16-help.txt").read_text()
    environment = probe("sglang", str(REPO / "tests" / "fixtures" / "fake_sglang_python.sh"), help_text)
    assert "DFLASH" in environment["capabilities"]["algorithms"]
    assert "DDTREE" not in environment["capabilities"]["algorithms"]
    config = validated(yaml.safe_load((REPO / "config" / "gpu-check.yaml").read_text()))
    offered = set(environment["capabilities"]["flags"])
    for server in servers(config):
        argv, _ = launch_command(server_job(config, 1, server["method"]), 30000, 16384, "python3", offered)
        assert not [a for a in argv if a.startswith("--") and a not in offered]
        assert "--cuda-graph-max-bs-decode" in argv and "--incremental-streaming-output" in argv


def test_the_committed_gpu_record_is_valid_and_complete():
    """The cells measured on the H200 (benchmarks/gpu/record-*) follow the cell schema and say what they are."""
    import json

    from specsweep.cells import validate_cell

    record = sorted((REPO / "benchmarks" / "gpu").glob("record-*"))[-1]
    cells = [json.loads(p.read_text()) for p in sorted((record / "cells").rglob("*.json"))]
    assert len(cells) == 20
    for cell in cells:
        validate_cell(cell)
        assert cell["simulated"] is False and cell["provenance"]["load_format"] == "dummy"
        assert cell["metrics"]["requests_failed"] == 0 and cell["metrics"]["length_mismatches"] == 0
        assert cell["provenance"]["server_info"]["attention_backend"] == "triton"
        assert len(cell["provenance"]["gpus_assigned"]) == cell["cell"]["tp"]
    environment = json.loads((record / "environment.json").read_text())
    assert environment["server"]["version"] == "0.5.16" and environment["software"]["sglang-kernel"] == "0.4.5"
    assert [g["name"] for g in environment["hardware"]["gpus"]] == ["NVIDIA H200", "NVIDIA H200"]


# engines that are builds, not releases: the version their server reports (benchmarks/gpu/device.sh install-d)
BUILD_VERSIONS = {"ddtree-v2": "0.0.0.dev20260719+ddtree.v2.g433c58e"}


def test_sglang_0516s_recorded_answers_keep_the_contract_the_client_and_the_simulator_follow():
    """Every request SGLang answered on the H200 (the committed GPU records: 0.5.16, and 0.5.14 beside it where a
    record compares engines): token counts, fixed output lengths and SGLang's own acceptance length are what the
    client reads and the simulator reproduces; each cell was served by the release its engine names."""
    import json

    paths = sorted((REPO / "benchmarks" / "gpu").glob("*/cells/**/*.json"))
    assert len(paths) >= 20
    speculative = 0
    for path in paths:
        cell = json.loads(path.read_text())
        if implied.is_skipped(cell):  # a cell budget: verdict did not measure: a reason, no requests
            assert implied.skipped_problem(cell) is None and "requests" not in cell, path
            continue
        engine = cell["method"].get("engine") or "sglang-0.5.16"
        release = BUILD_VERSIONS.get(engine, engine.removeprefix("sglang-"))
        assert cell["simulated"] is False and cell["provenance"]["server_info"]["version"] == release, path
        for r in cell["requests"]:
            assert r["error"] is None and sum(r["chunk_tokens"]) == r["output_tokens"], path  # incremental chunks
            assert r["output_tokens"] == r["expected_tokens"] and r["finish_reason"] == "length", path
            if cell["method"]["algorithm"] == "ar":
                assert r["verify_ct"] is None and r["server_accept_length"] is None, path
            else:  # spec_accept_length = N / verify rounds, the prefill token included (the simulator's, above)
                assert r["server_accept_length"] == pytest.approx(r["output_tokens"] / r["verify_ct"]), path
                speculative += 1
    assert speculative > 1000


def test_a_declared_build_flag_runs_on_the_simulator_as_the_configuration_check_accepts_it(tmp_path, monkeypatch):
    """A private build's flag, declared in sglang.extra_flags and put in a DDTree method's flags: the configuration
    check, the bench job's capability check and the simulated server all accept it; the server's log and
    /server_info record it; the log's decoding says the overlap scheduler is off, as DDTree's steps are charged."""
    flag = "--speculative-ddtree-allow-hybrid-unsafe"
    config = fast_config(requests=2, max_new_tokens=16)
    config["sglang"] = {"extra_flags": [{"flag": "--speculative-ddtree-budget", "type": "int"}, {"flag": flag}]}
    config["methods"] = [{"name": "ddtree", "algorithm": "ddtree", "budget": 8, "flags": [flag, "1"]}]
    config["concurrency"] = [1]
    job = replace(server_job(validated(config), 1, "ddtree"), cache_dir=str(tmp_path / "cache"))
    environment = probe("sim")
    assert flag not in environment["capabilities"]["flags"]  # the simulator's --help does not list it
    expected, _ = keyed_cells(job, environment["identity_digest"])
    monkeypatch.chdir(tmp_path)
    bench_server(job, [c["path"] for c in expected], environment, tmp_path / "logs", all_methods=[job.method])
    cell = json.loads((tmp_path / expected[0]["path"]).read_text())
    assert cell["provenance"]["server_info"]["speculative_ddtree_allow_hybrid_unsafe"] == "1"
    (log,) = [p.read_text() for p in (tmp_path / "logs").rglob("*.log") if "simulated SGLang server" in p.read_text()]
    assert f"declared build flags, accepted and not modelled: {flag}" in log
    assert "algorithm='ddtree'" in log and "overlap=False" in log and "overlap=True" not in log


def test_sglangs_rounds_by_drafts_accepted_under_forced_acceptance_are_what_the_simulator_forces():
    """The H200's EAGLE-3 cells at forced acceptance (benchmarks/gpu/forced-*): SGLang 0.5.16 reported every
    request's rounds by drafts accepted (spec_correct_drafts_histogram), one entry a verify round, each round
    floor(a) - 1 or floor(a) drafts, as the simulator's ForcedDrafter commits them; the per-depth acceptance read from
    them sums to the drafts accepted a round."""
    import json
    import math

    from specsweep.metrics import acceptance_by_depth

    paths = sorted((REPO / "benchmarks" / "gpu").glob("forced*/cells/tp1/eagle3-*/short/c*.json"))
    assert len(paths) >= 30
    for path in paths:
        cell = json.loads(path.read_text())
        forced = cell["method"]["params"]["accept_length"]
        assert cell["provenance"]["environment"]["SGLANG_SIMULATE_ACC_LEN"] == str(forced), path
        for r in cell["requests"]:
            histogram = r["correct_drafts_histogram"]
            assert sum(histogram) == r["verify_ct"], path
            assert {k for k, n in enumerate(histogram) if n} <= {math.floor(forced) - 1, math.floor(forced)}, path
        depths = acceptance_by_depth(cell["requests"])
        rounds = sum(r["verify_ct"] for r in cell["requests"])
        drafts = sum(k * n for r in cell["requests"] for k, n in enumerate(r["correct_drafts_histogram"]))
        assert sum(depths) == pytest.approx(drafts / rounds) and sum(depths) == pytest.approx(forced - 1, abs=0.05)
