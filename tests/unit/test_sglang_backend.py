"""The sglang backend without GPUs: launch commands, flag checks, capability probe, GPU pool, lifecycle."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import psutil
import pytest
import yaml

from conftest import FIXTURES, REPO, load_default_config, patience, validated
from specsweep.jobs import server_job, servers
from specsweep.methods import expand_methods
from specsweep.environment import ServerEnvironmentError, check_methods, probe
from specsweep.gpus import GpuPool, GpuPoolError, visible_devices
from specsweep.launcher import Server, free_port, launch_command, redact
from specsweep.sglang_options import FlagError, check_argv


HELP_0523 = (FIXTURES / "sglang-0.5.23-help.txt").read_text()


def plan_full() -> dict:
    return validated(yaml.safe_load((REPO / "config" / "plan-full.yaml").read_text()))


def test_every_full_plan_launch_command_parses_with_the_recorded_sglang_table():
    config = plan_full()
    commands = []
    for server in servers(config):
        params = server_job(config, server["tp"], server["method"])
        argv, env = launch_command(params, port=30001, max_context=40000, python="/opt/sglang/bin/python")
        assert argv[:3] == ["/opt/sglang/bin/python", "-m", "sglang.launch_server"]
        check_argv(argv[3:], config["sglang"]["options_table"], config["sglang"]["extra_flags"])
        commands.append((server, argv, env))
    assert len(commands) == 36
    for server, argv, env in commands:
        assert argv[argv.index("--tp-size") + 1] == str(server["tp"])
        assert argv[argv.index("--max-running-requests") + 1] == "64"
        assert argv[argv.index("--cuda-graph-max-bs-decode") + 1] == "64"
        assert argv[argv.index("--host") + 1] == "127.0.0.1"
        assert "--enable-metrics" in argv
        if server["method"].startswith("ddtree"):
            assert argv[argv.index("--speculative-algorithm") + 1] == "DDTREE"
            assert env == {"SGLANG_DDTREE_MAX_TOPK": "8"}
        if server["method"].startswith("eagle3"):  # its own head; NGRAM needs none
            assert argv[argv.index("--speculative-draft-model-path") + 1] == "AngelSlim/Qwen3-8B_eagle3"
        if server["method"] == "ngram":
            assert (
                "--speculative-draft-model-path" not in argv
                and argv[argv.index("--speculative-algorithm") + 1] == "NGRAM"
            )


def test_options_table_rejects_what_sglang_rejects():
    with pytest.raises(FlagError, match="--speculative-dflash-blocksize.*did you mean --speculative-dflash-block-size"):
        check_argv(["--model-path", "m", "--speculative-dflash-blocksize", "16"], "0.5.23")
    with pytest.raises(FlagError, match="invalid int value"):
        check_argv(["--model-path", "m", "--tp-size", "four"], "0.5.23")
    with pytest.raises(FlagError, match="invalid choice"):
        check_argv(["--model-path", "m", "--tokenizer-mode", "fast"], "0.5.23")
    with pytest.raises(FlagError, match="--speculative-ddtree-budget"):
        check_argv(["--model-path", "m", "--speculative-ddtree-budget", "8"], "0.5.23")  # not upstream
    check_argv(
        ["--model-path", "m", "--speculative-ddtree-budget", "8"],
        "0.5.23",
        [{"flag": "--speculative-ddtree-budget", "type": "int"}],
    )


def test_fair_scheduling_switch_runs_dflash_without_overlap():
    config = load_default_config()
    config["match_ddtree_scheduling"] = True
    methods = {m.name: m for m in expand_methods(validated(config))}
    assert "--disable-overlap-schedule" in methods["dflash"].flags
    assert "--disable-overlap-schedule" not in methods["ar"].flags


def test_secrets_are_redacted_from_provenance():
    assert redact({"SGLANG_API_KEY": "s3cret", "HF_TOKEN": "t", "SGLANG_DDTREE_MAX_TOPK": "8"}) == {
        "SGLANG_API_KEY": "<redacted>",
        "HF_TOKEN": "<redacted>",
        "SGLANG_DDTREE_MAX_TOPK": "8",
    }


def test_capability_probe_without_ddtree_fails_the_ddtree_method():
    environment = probe("sglang", python=str(FIXTURES / "fake_sglang_python.sh"), help_text=HELP_0523)
    assert "DFLASH" in environment["capabilities"]["algorithms"]
    assert "DDTREE" not in environment["capabilities"]["algorithms"]
    config = plan_full()
    methods = {m.name: m for m in expand_methods(config)}
    check_methods([methods["ar"], methods["dflash"]], environment)
    with pytest.raises(ServerEnvironmentError, match="method 'ddtree-b4'.*--speculative-algorithm DDTREE"):
        check_methods([methods["ddtree-b4"]], environment)


# ------------------------------------------------------------------ GPU pool

_ACQUIRE = """
import json, os, sys, time
from specsweep.gpus import GpuPool
pool = GpuPool(sys.argv[1], [str(i) for i in range(8)])
with pool.acquire(int(sys.argv[2]), poll=0.05, holder=sys.argv[3]) as gpus:
    print(json.dumps({"gpus": gpus, "start": time.time()}), flush=True)
    if len(sys.argv) > 5:  # hold until every job of the barrier folder holds its GPUs (at most 60 s)
        open(os.path.join(sys.argv[5], sys.argv[3]), "w").close()
        deadline = time.monotonic() + 60
        while len(os.listdir(sys.argv[5])) < int(sys.argv[6]) and time.monotonic() < deadline:
            time.sleep(0.05)
        print(json.dumps({"holding_together": len(os.listdir(sys.argv[5]))}), flush=True)
    time.sleep(float(sys.argv[4]))
    print(json.dumps({"end": time.time()}), flush=True)
"""


def _acquirers(lock_dir, count, need, hold, barrier=None):
    together = [str(barrier), str(count)] if barrier else []
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _ACQUIRE, str(lock_dir), str(need), f"job{i}", str(hold), *together],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(count)
    ]
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=patience(18))
        lines = [json.loads(l) for l in out.splitlines()]
        results.append({k: v for line in lines for k, v in line.items()})
    return results


def test_gpu_pool_hands_disjoint_devices_to_eight_concurrent_jobs(tmp_path):
    barrier = tmp_path / "holding"
    barrier.mkdir()
    results = _acquirers(tmp_path / "locks", 8, 1, 0, barrier)
    devices = [r["gpus"][0] for r in results]
    assert sorted(devices) == [str(i) for i in range(8)]
    # all eight held their GPU at the same time (no one waited for another): each kept it until it saw all eight
    # holding theirs, however slowly the interpreters started
    assert [r["holding_together"] for r in results] == [8] * 8


def test_gpu_pool_never_hands_out_more_than_exist(tmp_path):
    results = _acquirers(tmp_path, 4, 4, 1.0)  # TP-4 jobs on an 8-GPU host: two at a time
    for t in sorted({r["start"] for r in results}):
        holding = [r for r in results if r["start"] <= t < r["end"]]
        in_use = [g for r in holding for g in r["gpus"]]
        assert len(in_use) == len(set(in_use)) <= 8
        assert len(holding) <= 2
    with pytest.raises(GpuPoolError, match="needs 9 GPUs but this host offers 8"):
        with GpuPool(tmp_path, [str(i) for i in range(8)]).acquire(9):
            pass


def test_gpu_pool_recovers_locks_of_a_killed_process(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", _ACQUIRE, str(tmp_path), "8", "doomed", "60"], stdout=subprocess.PIPE, text=True
    )
    assert json.loads(holder.stdout.readline())["gpus"] == [str(i) for i in range(8)]
    pool = GpuPool(tmp_path, [str(i) for i in range(8)])
    with pytest.raises(GpuPoolError, match="not free"):
        with pool.acquire(1, timeout=0.5, poll=0.1):
            pass
    holder.kill()
    holder.wait()
    with pool.acquire(8, timeout=patience(1), poll=0.1) as gpus:
        assert len(gpus) == 8


def test_gpu_pool_chooses_only_among_granted_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    assert visible_devices(8) == ["2", "5"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert visible_devices(3) == ["0", "1", "2"]


# ------------------------------------------------------------------ lifecycle


def _group_members(pids):
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def test_stop_kills_a_process_tree_that_ignores_sigterm(tmp_path):
    port = free_port()
    pidfile = tmp_path / "pids"
    server = Server(
        [sys.executable, str(FIXTURES / "stubborn_server.py"), str(port), str(pidfile)],
        {},
        "127.0.0.1",
        port,
        tmp_path / "stubborn.log",
    )
    server.start(patience(6))
    pids = [int(p) for p in pidfile.read_text().split()]
    assert len(_group_members(pids)) == 3
    server.stop(grace=1.0)  # SIGTERM is ignored: SIGKILL after the grace
    assert _group_members(pids) == []


def test_server_killed_with_its_job(tmp_path):
    """If the job process dies without cleaning up, the kernel's parent-death signal stops the server."""
    code = (
        "import sys, time\n"
        "from specsweep.launcher import Server, free_port\n"
        "port = free_port()\n"
        "s = Server([sys.executable, '-m', 'specsweep.sim', '--model-path', 'm', '--port', str(port), "
        "'--sim-startup-seconds', '0'], {}, '127.0.0.1', port, sys.argv[1])\n"
        "s.start(30)\n"
        "print(s.process.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    job = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "s.log")], stdout=subprocess.PIPE, text=True)
    server_pid = int(job.stdout.readline())
    job.kill()
    job.wait()
    deadline = time.monotonic() + patience(2)
    while time.monotonic() < deadline and _group_members([server_pid]):
        time.sleep(0.1)
    assert _group_members([server_pid]) == []
