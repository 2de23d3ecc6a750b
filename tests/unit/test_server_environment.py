"""What reaches a server from the host it starts on: the platform's variables (one list), those the configuration
names, what it sets; never a variable that changes decoding from the shell (real server processes)."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace

import psutil
import pytest

from conftest import fast_config, server_processes_under, validated
from specsweep.bench import bench_server
from specsweep.cells import keyed_cells
from specsweep.environment import probe
from specsweep.jobs import server_job
from specsweep.launcher import PLATFORM_ENV, Server, ServerError, free_port, platform_variable
from specsweep.sglang_options import decoding_variable

NVLINK_MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
# a proxy set as a host sets one, which this test's own requests to the server on loopback go around
LOOPBACK_NO_PROXY = {"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}


def platform_values(monkeypatch) -> dict:
    """Each entry of PLATFORM_ENV set in this process (a prefix through a name of its own), as a host sets them:
    the values the host had where it had one (PATH, HOME, TMPDIR keep working), a marker of the name's otherwise."""
    values = {}
    for entry in PLATFORM_ENV:
        name = entry[:-1] + "SPECSWEEP_PROBE" if entry.endswith("*") else entry
        given = {**NVLINK_MULTICAST_OFF, **LOOPBACK_NO_PROXY}.get(name)
        values[name] = given or os.environ.get(name) or f"marker-of-{name}"
        monkeypatch.setenv(name, values[name])
    return values


def test_every_platform_variable_and_those_the_configuration_names_reach_the_server_and_nothing_else(
    tmp_path, monkeypatch
):
    values = platform_values(monkeypatch)
    assert {k: values[k] for k in NVLINK_MULTICAST_OFF} == NVLINK_MULTICAST_OFF  # the host's switches, named
    monkeypatch.setenv("SPECSWEEP_LICENCE", "licence-server:27000")  # named in server.pass_env
    monkeypatch.setenv("SPECSWEEP_UNLISTED", "the shell's")  # named nowhere: stays in the shell
    port = free_port()
    argv = [sys.executable, "-m", "specsweep.sim", "--model-path", "m", "--port", str(port)]
    argv += ["--sim-startup-seconds", "0", "--sim-tokenizer", "approximate"]
    server = Server(
        argv, {"SPECSWEEP_TEST_NOTE": "set"}, "127.0.0.1", port, tmp_path / "s.log", pass_env=["SPECSWEEP_LICENCE"]
    )
    server.start(60)
    try:
        seen = psutil.Process(server.process.pid).environ()
    finally:
        server.stop()
    for name, value in values.items():
        assert seen.get(name) == value, name
    assert seen["SPECSWEEP_LICENCE"] == "licence-server:27000" and seen["SPECSWEEP_TEST_NOTE"] == "set"
    assert "SPECSWEEP_UNLISTED" not in seen
    assert set(seen) - {"SPECSWEEP_TEST_NOTE"} == set(server.host_env)  # what the cell's provenance records
    assert all(platform_variable(name) for name in set(seen) - {"SPECSWEEP_TEST_NOTE", "SPECSWEEP_LICENCE"})


def test_no_platform_variable_is_one_that_changes_decoding():
    """A variable of the platform's list reaches every server from the host, keyed by nothing: none may be one that
    SGLang or a DDTree build reads to change decoding (a build's own variable must be SGLANG_*)."""
    assert not [entry for entry in PLATFORM_ENV if decoding_variable(entry.rstrip("*"))]
    assert decoding_variable("SGLANG_DDTREE_DEPTH_BONUS") and not platform_variable("SGLANG_DDTREE_DEPTH_BONUS")


def test_a_decoding_variable_in_the_shell_stops_the_bench_job_before_its_server_starts(tmp_path, monkeypatch):
    """SGLANG_DDTREE_DEPTH_BONUS=-3 and SGLANG_DDTREE_MAX_TOPK=1 exported: the bench job on the simulator refuses
    them by name, saying where in the configuration to set them, before any server starts or anything is written."""
    config = fast_config(requests=2, max_new_tokens=16)
    config["methods"] = [{"name": "tree", "algorithm": "ddtree", "budget": 32, "topk": "uncapped"}]
    config["concurrency"] = [1]
    job = replace(server_job(validated(config), 1, "tree"), cache_dir=str(tmp_path / "cache"))
    environment = probe("sim")
    expected, _ = keyed_cells(job, environment["identity_digest"])
    monkeypatch.setenv("SGLANG_DDTREE_DEPTH_BONUS", "-3")
    monkeypatch.setenv("SGLANG_DDTREE_MAX_TOPK", "1")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ServerError) as info:
        bench_server(job, [c["path"] for c in expected], environment, tmp_path / "logs", all_methods=[job.method])
    message = str(info.value)
    assert "SGLANG_DDTREE_DEPTH_BONUS='-3', SGLANG_DDTREE_MAX_TOPK='1'" in message
    assert "server.env (every server) or a method's env (methods[].env)" in message
    assert "unset SGLANG_DDTREE_DEPTH_BONUS SGLANG_DDTREE_MAX_TOPK" in message
    assert not (tmp_path / "cache").exists() and not (tmp_path / "results").exists()
    assert server_processes_under(tmp_path) == []


def test_a_cell_records_what_the_host_passed_its_server_and_keys_none_of_it(tmp_path, monkeypatch):
    """The cell's provenance holds what the configuration set (environment) and what the host passed
    (host_environment, secrets redacted); neither a variable server.pass_env names nor its value changes the key."""
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    monkeypatch.setenv("SPECSWEEP_LICENCE_TOKEN", "secret-value")
    config = fast_config(requests=2, max_new_tokens=16)
    config["methods"] = [{"name": "ar", "algorithm": "ar", "env": {"SPECSWEEP_TEST_NOTE": "method"}}]
    config["concurrency"] = [1]
    environment = probe("sim")
    plain = server_job(validated(config), 1, "ar")
    config["server"] = {"pass_env": ["SPECSWEEP_LICENCE_TOKEN"]}
    job = replace(server_job(validated(config), 1, "ar"), cache_dir=str(tmp_path / "cache"))
    expected, _ = keyed_cells(job, environment["identity_digest"])
    assert [c["key"] for c in expected] == [c["key"] for c in keyed_cells(plain, environment["identity_digest"])[0]]
    monkeypatch.chdir(tmp_path)
    bench_server(job, [c["path"] for c in expected], environment, tmp_path / "logs", all_methods=[job.method])
    cell = json.loads((tmp_path / expected[0]["path"]).read_text())
    provenance = cell["provenance"]
    assert provenance["environment"] == {"SPECSWEEP_TEST_NOTE": "method"}
    assert provenance["host_environment"]["NCCL_NVLS_ENABLE"] == "0"
    assert provenance["host_environment"]["SPECSWEEP_LICENCE_TOKEN"] == "<redacted>"
    assert "secret-value" not in json.dumps(cell)
