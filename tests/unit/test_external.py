"""backend external: servers the test starts itself (simulated SGLang servers, and a server of an older build's shape)
on 127.0.0.1, reached at their URLs, checked against their methods, described and keyed; nothing started or stopped
by specsweep."""

from __future__ import annotations

import contextlib
import json
import sys

import pandas as pd
import pytest

from conftest import FIXTURES, fast_config, patience, start_sim, validated
from specsweep import external, jobs, plan
from specsweep.environment import probe
from specsweep.errors import ConfigError
from specsweep.launcher import Server, free_port

DRAFTER = "z-lab/Qwen3-8B-DFlash-b16"


def dflash_flags(block: int) -> list[str]:
    return [
        "--speculative-algorithm",
        "DFLASH",
        "--speculative-draft-model-path",
        DRAFTER,
        "--speculative-dflash-block-size",
        str(block),
    ]


def external_config(urls: dict, **changes) -> dict:
    """The fast plan on backend external: AR and DFlash (block 16), each at its URL."""
    config = fast_config()
    config["backend"] = "external"
    config["methods"] = [
        {"name": "ar", "algorithm": "ar", "url": urls["ar"]},
        {"name": "dflash", "algorithm": "dflash", "url": urls["dflash"]},
    ]
    config.update(changes)
    return validated(config)


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Simulated servers started here: AR, DFlash block 16 (twice, on two ports) and DFlash block 8."""
    folder = tmp_path_factory.mktemp("external")
    started = {}
    try:
        started["ar"] = start_sim(folder)
        started["dflash"] = start_sim(folder, *dflash_flags(16))
        started["dflash-again"] = start_sim(folder, *dflash_flags(16))
        started["dflash-b8"] = start_sim(folder, *dflash_flags(8))
        yield started
    finally:
        for server in started.values():
            server.stop()


def job_of(config: dict, method: str):
    return jobs.server_job(config, config["tp"][0], method)


def test_a_server_that_is_what_its_method_says_is_described_and_keyed_by_its_stable_settings(servers):
    config = external_config({"ar": servers["ar"].url, "dflash": servers["dflash"].url})
    host = probe("external")
    records = {m: external.environment(host, job_of(config, m), servers[m].url) for m in ("ar", "dflash")}
    dflash = records["dflash"]
    assert dflash["backend"] == "external" and dflash["server"]["external"] is True
    assert dflash["simulated"] is True  # a simulated server says so, and its cells will too
    assert dflash["server"]["info_endpoint"] == "/server_info"
    described = dflash["server"]["description"]  # the server's own description, as it gave it
    assert described["port"] == servers["dflash"].port and described["speculative_dflash_block_size"] == 16
    stable = dflash["identity"]["server"]
    assert stable["speculative_algorithm"] == "DFLASH" and stable["speculative_draft_model_path"] == DRAFTER
    assert (stable["tp_size"], stable["model_path"], stable["version"]) == (1, "Qwen/Qwen3-8B", described["version"])
    assert not {"port", "host", "internal_states", "sim_clock", "random_seed"} & set(stable)
    assert records["ar"]["identity"]["server"]["speculative_algorithm"] is None
    assert records["ar"]["identity_digest"] != dflash["identity_digest"]
    # the same build and settings relaunched on another port: the same identity, so the cells stay cached
    again = external.environment(host, job_of(config, "dflash"), servers["dflash-again"].url)
    assert again["server"]["description"]["port"] != described["port"]
    assert again["identity_digest"] == dflash["identity_digest"]
    # the key a server's cells get holds the identity, never the URL
    job = job_of(config, "dflash")
    moved = external_config({"ar": servers["ar"].url, "dflash": servers["dflash-again"].url})
    from specsweep.cells import keyed_cells

    first, _ = keyed_cells(job, dflash["identity_digest"])
    second, _ = keyed_cells(job_of(moved, "dflash"), again["identity_digest"])
    assert [c["key"] for c in first] == [c["key"] for c in second]


def test_a_server_that_is_not_what_its_method_says_is_refused_naming_method_field_and_values(servers):
    host = probe("external")
    swapped = external_config({"ar": servers["dflash"].url, "dflash": servers["ar"].url})
    with pytest.raises(external.ExternalServerError) as ar_at_dflash:
        external.environment(host, job_of(swapped, "ar"), servers["dflash"].url)
    message = str(ar_at_dflash.value)
    assert "method 'ar'" in message and "speculative_algorithm: declared None, served 'DFLASH'" in message
    assert servers["dflash"].url in message and "methods[].url" in message
    with pytest.raises(
        external.ExternalServerError, match="(?s)method 'dflash'.*speculative_algorithm: declared 'DFLASH', served None"
    ):
        external.environment(host, job_of(swapped, "dflash"), servers["ar"].url)
    # the same algorithm with another block size
    other_block = external_config({"ar": servers["ar"].url, "dflash": servers["dflash-b8"].url})
    with pytest.raises(external.ExternalServerError) as block:
        external.environment(host, job_of(other_block, "dflash"), servers["dflash-b8"].url)
    assert "speculative_dflash_block_size: declared '16', served 8" in str(block.value)
    # another TP size, another model
    wider = external_config({"ar": servers["ar"].url, "dflash": servers["dflash"].url}, tp=[2])
    with pytest.raises(external.ExternalServerError, match="tp_size: declared 2, served 1"):
        external.environment(host, job_of(wider, "ar"), servers["ar"].url)
    config = fast_config()
    config["model"] = {"name": "Llama-3.1-8B", "path": "meta-llama/Llama-3.1-8B-Instruct"}
    other_model = external_config(
        {"ar": servers["ar"].url, "dflash": servers["dflash"].url},
        model=config["model"],
        methods=[{"name": "ar", "algorithm": "ar", "url": servers["ar"].url}],
    )
    with pytest.raises(
        external.ExternalServerError,
        match="model_path: declared 'meta-llama/Llama-3.1-8B-Instruct', served 'Qwen/Qwen3-8B'",
    ):
        external.environment(host, job_of(other_model, "ar"), servers["ar"].url)


@contextlib.contextmanager
def info_server(folder, info: dict, key: str = "s3cret"):
    """A server of an older build's shape started here, describing itself with ``info`` at /get_server_info."""
    (folder / "info.json").write_text(json.dumps(info))
    port = free_port()
    server = Server(
        [sys.executable, str(FIXTURES / "older_info_server.py"), str(port), str(folder / "info.json"), key],
        {},
        "127.0.0.1",
        port,
        folder / f"info-{port}.log",
        headers={"Authorization": f"Bearer {key}"},
    )
    server.start(patience(6))
    try:
        yield server
    finally:
        server.stop()


def test_a_nextn_method_is_served_as_eagle_as_sglang_stores_it(tmp_path, monkeypatch):
    """SGLang's server_args rewrites NEXTN to EAGLE: a real NEXTN server reports EAGLE, and is what its method says;
    a server of another algorithm is still refused."""
    served = {
        "version": "0.5.16",
        "model_path": "Qwen/Qwen3-8B",
        "tp_size": 1,
        "speculative_algorithm": "EAGLE",
        "speculative_num_steps": 3,
        "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 4,
    }
    monkeypatch.setenv("MTP_KEY", "s3cret")
    with info_server(tmp_path, served) as server:
        config = external_config({"ar": server.url, "dflash": server.url})
        config["methods"] = [{"name": "mtp", "algorithm": "nextn", "url": server.url, "api_key_env": "MTP_KEY"}]
        config = validated(config)
        record = external.environment(probe("external"), job_of(config, "mtp"), server.url)
        assert record["server"]["description"]["speculative_algorithm"] == "EAGLE"
    with info_server(tmp_path, {**served, "speculative_algorithm": "NGRAM"}) as server:
        config["methods"][0]["url"] = server.url
        with pytest.raises(
            external.ExternalServerError, match="speculative_algorithm: declared 'NEXTN', served 'NGRAM'"
        ):
            external.environment(probe("external"), job_of(config, "mtp"), server.url)


def test_an_older_build_is_read_at_get_server_info_with_the_key_the_configuration_names(tmp_path, monkeypatch):
    """A server whose /server_info is 404 describes itself at /get_server_info; its API key comes from the variable
    methods[].api_key_env names, and a missing one is refused naming the variable."""
    info = {
        "version": "0.5.16",
        "model_path": "Qwen/Qwen3-8B",
        "tp_size": 1,
        "speculative_algorithm": "DFLASH",
        "speculative_draft_model_path": DRAFTER,
        "speculative_dflash_block_size": None,  # left unset at launch: SGLang stores the block under its alias
        "speculative_num_draft_tokens": 16,
        "api_key": "s3cret",
        "port": 1234,
    }
    (tmp_path / "info.json").write_text(json.dumps(info))
    port = free_port()
    server = Server(
        [sys.executable, str(FIXTURES / "older_info_server.py"), str(port), str(tmp_path / "info.json"), "s3cret"],
        {},
        "127.0.0.1",
        port,
        tmp_path / "older.log",
        headers={"Authorization": "Bearer s3cret"},
    )
    server.start(patience(6))
    try:
        config = external_config({"ar": server.url, "dflash": server.url + "/"})
        config["methods"][1]["api_key_env"] = "OLDER_KEY"
        job = jobs.server_job(config, 1, "dflash")
        assert job.endpoint == {"url": server.url, "api_key_env": "OLDER_KEY"}
        monkeypatch.delenv("OLDER_KEY", raising=False)
        with pytest.raises(external.ExternalServerError, match=r"(?s)method .dflash..*\$OLDER_KEY.*unset or empty"):
            external.environment(probe("external"), job, server.url)
        monkeypatch.setenv("OLDER_KEY", "wrong")
        with pytest.raises(external.ExternalServerError, match="/server_info: HTTP 401; /get_server_info: HTTP 401"):
            external.environment(probe("external"), job, server.url)
        monkeypatch.setenv("OLDER_KEY", "s3cret")
        record = external.environment(probe("external"), job, server.url)
        assert record["server"]["info_endpoint"] == "/get_server_info" and record["server"]["version"] == "0.5.16"
        assert record["simulated"] is False and record["server"]["name"] == "sglang"
        assert record["server"]["description"]["api_key"] == "<redacted>"  # never the key itself
        assert "s3cret" not in json.dumps(record)
    finally:
        server.stop()


def test_a_url_that_is_no_server_is_refused_naming_the_method_and_url():
    url = f"http://127.0.0.1:{free_port()}"
    config = external_config({"ar": url, "dflash": url})
    with pytest.raises(external.ExternalServerError, match=rf"method 'ar': the server at {url} \(methods\[\]\.url\)"):
        external.environment(probe("external"), job_of(config, "ar"), url)
    server = external.ExternalServer(url, {})
    with pytest.raises(external.ExternalServerError, match=rf"{url} does not answer /health \(before cell x\)"):
        server.check_alive("before cell x")
    server.stop()  # nothing to stop: it is not ours


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda c: c["methods"][0].pop("url"), r"methods\[0\] \(ar\)\.url: required on backend external"),
        (lambda c: c.update(backend="sim"), r"methods\[0\] \(ar\)\.url: only backend external"),
        (lambda c: c.update(tp=[1, 2]), "tp: .*the TP size it runs at"),
        (
            lambda c: c["methods"][0].update(url="http://me:s3cret@10.0.0.5:30000"),
            r"methods\[0\] \(ar\)\.url: holds credentials",
        ),
        (
            lambda c: c["methods"].append(
                {"name": "dd", "algorithm": "ddtree", "budget": [8, 16], "url": "http://h:1"}
            ),
            r"methods \(dd\): a sweep needs one server per value",
        ),
    ],
)
def test_a_configuration_external_cannot_run_is_refused_naming_the_key(change, message):
    config = fast_config()
    config["backend"] = "external"
    config["methods"] = [
        {"name": "ar", "algorithm": "ar", "url": "http://10.0.0.5:30000"},
        {"name": "dflash", "algorithm": "dflash", "url": "http://10.0.0.6:30000"},
    ]
    change(config)
    with pytest.raises(ConfigError, match=message):
        validated(config)


def test_the_plan_prices_no_start_up_on_external_servers():
    config = external_config({"ar": "http://10.0.0.5:30000", "dflash": "http://10.0.0.6:30000"})
    cold, warm = plan.startup_seconds(config, 1)
    assert cold == warm == plan.JOB_OVERHEAD_SECONDS
    assert plan.startup_text(config, 1).startswith("not priced: backend external starts no server")
    started = validated(dict(fast_config(), backend="sglang", sim={}))
    assert plan.startup_seconds(started, 1)[0] > plan.JOB_OVERHEAD_SECONDS  # a started server's is priced


def test_repeated_cells_on_an_external_server_are_keyed_by_its_description(servers):
    """With repetitions, each repetition's server job measures the same external server: the environment record
    describes it once, and every repetition's cells are keyed by its identity (never the client host's), which the
    plan and the aggregation read."""
    config = external_config({"ar": servers["ar"].url, "dflash": servers["dflash"].url}, repetitions=2)
    host = probe("external")
    described = jobs.external_servers(config)
    assert sorted(external.server_key(j) for j in described) == ["tp1/ar", "tp1/dflash"]
    record = dict(host, servers=external.describe_servers(host, described))
    repeated = [jobs.server_job(config, s["tp"], s["method"], s["repetition"]) for s in jobs.servers(config)]
    assert {j.repetition for j in repeated} == {0, 1}
    identities = external.identities({None: record})
    for job in repeated:
        own = external.environment(host, job, servers[job.method.name].url)["identity_digest"]
        assert own != host["identity_digest"]
        assert external.identity_digest(record, job) == own
        assert identities[external.server_key(job)] == own


def test_every_reported_setting_that_changes_numbers_keys_the_cells_and_launch_details_do_not(tmp_path, monkeypatch):
    """Two launches of one build with one set of settings (other port, host, seed, counters) share an identity; a
    server relaunched with another KV cache dtype, quantization, page size, attention backend, batch limit or radix
    cache setting (none of them a flag of the method) gets another one."""
    base = {
        "version": "0.5.16",
        "model_path": "Qwen/Qwen3-8B",
        "tp_size": 1,
        "speculative_algorithm": None,
        "kv_cache_dtype": "auto",
        "quantization": None,
        "page_size": 1,
        "attention_backend": "fa3",
        "max_running_requests": 256,
        "disable_radix_cache": False,
        "dp_size": 1,
        "host": "10.0.0.5",
        "port": 30000,
        "random_seed": 12345,
        "internal_states": [{"avg_spec_accept_length": None, "launched_at": 1.0}],
        "metrics_http_port": 9000,
        "api_key": "s3cret",
    }
    relaunched = {
        **base,
        "host": "10.0.0.6",
        "port": 30001,
        "random_seed": 999,
        "internal_states": [{"launched_at": 2.0}],
        "metrics_http_port": 9001,
    }
    changed = [
        ("kv_cache_dtype", "fp8_e4m3"),
        ("quantization", "fp8"),
        ("page_size", 16),
        ("attention_backend", "flashinfer"),
        ("max_running_requests", 64),
        ("disable_radix_cache", True),
        ("dp_size", 2),
    ]
    monkeypatch.setenv("INFO_KEY", "s3cret")

    def identity(info: dict, folder) -> str:
        folder.mkdir()
        with info_server(folder, info) as server:
            config = external_config({"ar": server.url, "dflash": server.url})
            config["methods"] = [{"name": "ar", "algorithm": "ar", "url": server.url, "api_key_env": "INFO_KEY"}]
            record = external.environment(probe("external"), job_of(validated(config), "ar"), server.url)
            assert "s3cret" not in json.dumps(record["identity"])
            return record["identity_digest"]

    first = identity(base, tmp_path / "base")
    assert identity(relaunched, tmp_path / "relaunched") == first
    for index, (field, value) in enumerate(changed):
        assert identity({**base, field: value}, tmp_path / f"changed{index}") != first, field


def test_the_stamp_and_provenance_describe_the_external_servers_not_the_client(servers):
    """On backend external the verdict's stamp and the report's provenance name the engines the servers describe
    (never "external") and say their GPUs are not reported (never the client's, which run none of them)."""
    from specsweep import report, verdict

    config = external_config({"ar": servers["ar"].url, "dflash": servers["dflash"].url})
    host = probe("external")
    assert host["hardware"]["gpus"] == []  # the client's GPUs are not the servers'
    record = dict(host, servers=external.describe_servers(host, jobs.external_servers(config)))
    version = record["servers"]["tp1/ar"]["version"]
    assert version and version.startswith("specsweep-sim")
    engine = verdict.engine_text(record)
    assert engine == f"{version} (release; no commit recorded)" and "external" not in engine
    assert verdict.gpus_text(record) == "GPUs not reported by the external servers"
    rows = dict(report.provenance(pd.DataFrame(), record, {"model": "Qwen3-8B"}, True))
    assert (rows["Server"], rows["GPUs"]) == (engine, verdict.gpus_text(record))


def test_an_external_job_takes_no_gpu_of_this_host_and_its_journal_says_reached_not_started(
    servers, tmp_path, monkeypatch
):
    """A configured GPU pool is the host's: a job on an external server takes none of it (nor waits for it), and its
    journal and result say the server was reached, not started or stopped."""
    from dataclasses import replace

    from conftest import Journal
    from specsweep.bench import bench_server
    from specsweep.cells import keyed_cells

    config = external_config(
        {"ar": servers["ar"].url, "dflash": servers["dflash"].url},
        gpu_pool={"devices": 1, "lock_dir": str(tmp_path / "locks")},
        workloads=[{"name": "short", "family": "short", "requests": 2, "max_new_tokens": 8}],
        concurrency=[1],
        warmup=0,
    )
    job = replace(job_of(config, "ar"), cache_dir=str(tmp_path / "cache"))
    assert job.gpu_pool["devices"] == 1
    environment = external.environment(probe("external"), job, servers["ar"].url)
    expected, _ = keyed_cells(job, environment["identity_digest"])
    journal = Journal(tmp_path, "cache")
    monkeypatch.chdir(tmp_path)
    done = bench_server(job, [c["path"] for c in expected], probe("external"), tmp_path / "logs")
    assert done["server_reached"] is True and "server_started" not in done
    events = {e["event"]: e for e in journal.new_events()}
    start, stop = events["server_start"], events["server_stop"]
    assert (start["gpus"], start["offered"], start["external"]) == (None, [], True)
    assert "not started" in start["note"] and "not stopped" in stop["note"]
    assert servers["ar"].alive()


def test_a_flag_is_checked_under_the_name_sglang_stores_it(tmp_path, monkeypatch):
    """A method's flag in another spelling (--data-parallel-size, SGLang's dp_size) is checked against the field
    SGLang stores it under: a server with another value is refused, one with the declared value accepted and
    nothing is left unsaid."""
    served = {"version": "0.5.23", "model_path": "Qwen/Qwen3-8B", "tp_size": 1, "speculative_algorithm": None}
    served |= {"dp_size": 1, "fp8_gemm_runner_backend": "cutlass"}
    monkeypatch.setenv("DP_KEY", "s3cret")
    flags = ["--data-parallel-size", "2", "--fp8-gemm-backend", "cutlass"]
    for dp, refused in ((1, True), (2, False)):
        folder = tmp_path / f"dp{dp}"
        folder.mkdir()
        with info_server(folder, {**served, "dp_size": dp}) as server:
            config = external_config({"ar": server.url, "dflash": server.url})
            config["methods"] = [
                {"name": "ar", "algorithm": "ar", "url": server.url, "api_key_env": "DP_KEY", "flags": flags}
            ]
            job = job_of(validated(config), "ar")
            assert {"dp_size": "2", "fp8_gemm_runner_backend": "cutlass"}.items() <= external.declared_settings(
                job
            ).items()
            if refused:
                with pytest.raises(external.ExternalServerError, match="dp_size: declared '2', served 1"):
                    external.environment(probe("external"), job, server.url)
            else:
                assert external.environment(probe("external"), job, server.url)["server"]["unreported"] == []
