"""The fault matrix: real servers, real Snakemake runs; nothing lost, nothing left running, every error explained."""

from __future__ import annotations

import json
import os
import socket
import sys
from dataclasses import replace

import psutil
import pytest

from conftest import fast_config, server_processes_under, validated
from specsweep.jobs import server_job
from specsweep.launcher import start_server


def test_port_taken_is_retried_on_another_port(tmp_path):
    config = validated(fast_config())
    params = server_job(config, 1, "ar")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server, argv, _ = start_server(
            params, {}, {"python": sys.executable}, tmp_path / "s.log", None, [], {}, first_port=port
        )
        try:
            assert server.port != port and server.alive()
            assert "address already in use" in (tmp_path / "s.log").read_text().lower()
        finally:
            server.stop()


def test_shell_metacharacters_in_flags_and_env_reach_the_server_unchanged(tmp_path):
    from specsweep.launcher import Server, free_port

    name = "m; touch pwned && $(touch pwned2) `id` | cat"
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "specsweep.sim",
        "--model-path",
        "m",
        "--port",
        str(port),
        "--served-model-name",
        name,
        "--sim-startup-seconds",
        "0",
    ]
    note = "8; touch pwned3 $(touch pwned4)"
    server = Server(argv, {"SPECSWEEP_TEST_NOTE": note}, "127.0.0.1", port, tmp_path / "s.log")
    server.start(30)
    try:
        import requests

        assert requests.get(server.url + "/v1/models", timeout=10).json()["data"][0]["id"] == name
        assert psutil.Process(server.process.pid).environ()["SPECSWEEP_TEST_NOTE"] == note
    finally:
        server.stop()
    assert not any((tmp_path / n).exists() for n in ("pwned", "pwned2", "pwned3", "pwned4"))
    assert not any(os.path.exists(n) for n in ("pwned", "pwned2", "pwned3", "pwned4"))


def test_endurance_at_concurrency_256_is_clean_and_bounded(tmp_path):
    """A short run of benchmarks/endurance.py (the 60 s figures are in docs/faults.md, "Endurance")."""
    import importlib.util

    from conftest import REPO

    spec = importlib.util.spec_from_file_location("endurance", REPO / "benchmarks" / "endurance.py")
    endurance = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(endurance)
    result = endurance.run(256, 6, tmp_path)
    # every round's 512 requests (two per slot) came back as records, none failed
    assert result["rounds"] >= 1 and result["requests"] == result["rounds"] * 512 and result["client_errors"] == {}
    assert result["server_peak_rss_mb"] < 1024 and result["client_peak_rss_mb"] < 2048


def test_bench_outputs_that_do_not_name_the_servers_cells_are_refused_before_any_server(tmp_path):
    from conftest import load_default_config
    from specsweep.bench import bench_server
    from specsweep.cells import CellError
    from specsweep.jobs import cells_of_server
    from specsweep.server_job import ServerJob

    config = validated(load_default_config())
    job = replace(
        ServerJob.from_dict(json.loads(json.dumps(server_job(config, 1, "ar").as_dict()))),
        cache_dir=str(tmp_path / "cache"),
    )
    environment = {"backend": "sim", "capabilities": {"algorithms": [], "flags": []}, "identity_digest": "x"}
    paths = [c["path"] for c in cells_of_server(config, 1, "ar")]
    renamed = paths[:-1] + ["results/cells/tp1/ar/elsewhere.json"]  # as if the rule and cell_path disagreed
    with pytest.raises(CellError, match=f"no output for {paths[-1]}"):
        bench_server(job, renamed, environment, tmp_path, tmp_path / "run.json")
    assert not (tmp_path / "cache" / "journal").exists() and not (tmp_path / "run.json").exists()
    assert server_processes_under(tmp_path) == []


def test_atomic_writes_get_the_permissions_open_would_give(tmp_path):
    # results and the cell cache are shared (other users, other SLURM nodes): not private to their writer
    from specsweep.canon import atomic_write_text

    atomic_write_text(tmp_path / "a.json", "{}")
    (tmp_path / "b.json").write_text("{}")
    assert (tmp_path / "a.json").stat().st_mode & 0o777 == (tmp_path / "b.json").stat().st_mode & 0o777
    assert (tmp_path / "a.json").read_text() == "{}" and not list(tmp_path.glob(".*.tmp"))


def test_a_servers_port_leaves_room_for_sglang_0_5_14s_grpc_port():
    """SGLang 0.5.14 opens gRPC at the HTTP port + 10000 and refuses a port past 65535 (the lent H200's record):
    every port the launcher picks stays at or below 55535 and is free (the system's ephemeral range reaches 60999,
    so 60 picks without the bound would almost surely pass it)."""
    from specsweep.launcher import HIGHEST_PORT, free_port

    ports = [free_port() for _ in range(60)]
    assert HIGHEST_PORT == 55535 and max(ports) <= HIGHEST_PORT
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))
