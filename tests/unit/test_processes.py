"""Processes, locks and journals: nothing left behind, nothing double-booked, damaged lines cost only themselves."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import patience
from specsweep.cache import Journal, server_runs


def _run(journal: Journal, server: str, cells: list[str]) -> None:
    journal.write("server_start", server=server)
    for cell in cells:
        journal.write("measured", server=server, cell=cell, key=cell)
    journal.write("server_stop", server=server)


def test_a_damaged_journal_line_is_skipped_with_a_warning_naming_the_file_and_line(tmp_path, capsys):
    path = tmp_path / "journal.jsonl"
    journal = Journal(path)
    _run(journal, "tp1/ar", ["c1"])
    lines = path.read_text().splitlines(keepends=True)
    lines[1] = lines[1][: len(lines[1]) // 2] + "\n"  # the measured event cut in half
    path.write_text("".join(lines))
    runs = server_runs(path)
    assert f"warning: journal {path}, line 2: damaged" in capsys.readouterr().err
    assert list(runs) == ["tp1/ar"] and runs["tp1/ar"][1] == []


def test_a_run_after_a_writer_killed_mid_line_is_read_back(tmp_path, capsys):
    path = tmp_path / "journal.jsonl"
    journal = Journal(path)
    _run(journal, "tp1/ar", ["c1"])
    with open(path, "a") as handle:  # a job killed while it wrote: no newline at the end
        handle.write(json.dumps({"time": 1.0, "event": "server_start", "server": "tp1/ar"})[:25])
    _run(journal, "tp1/ar", ["c2", "c3"])
    runs = server_runs(path)
    assert f"warning: journal {path}, line 4: damaged" in capsys.readouterr().err
    assert runs["tp1/ar"][1] == ["c2", "c3"]  # the later run, whole
    assert len(path.read_text().splitlines()) == 8


@pytest.mark.parametrize("line", ["[1, 2]", '{"event": "server_stop"}', '"text"', "\x00\x00\x00"])
def test_lines_that_are_json_but_no_event_are_damaged_too(tmp_path, capsys, line):
    path = tmp_path / "journal.jsonl"
    _run(Journal(path), "tp1/ar", ["c1"])
    with open(path, "a") as handle:
        handle.write(line + "\n")
    assert server_runs(path)["tp1/ar"][1] == ["c1"]
    assert f"warning: journal {path}, line 4: damaged" in capsys.readouterr().err


def test_the_default_gpu_lock_folder_is_one_per_host_whatever_the_working_folder(tmp_path, monkeypatch):
    import tempfile

    from specsweep.gpus import GpuPool, GpuPoolError, lock_folder

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "host-tmp"))
    (tmp_path / "host-tmp").mkdir()
    pools = []
    for name in ("first", "second"):  # two results folders
        (tmp_path / name).mkdir()
        monkeypatch.chdir(tmp_path / name)
        pools.append(GpuPool(lock_folder(None), ["0", "1"]))
    assert pools[0].lock_dir == pools[1].lock_dir and pools[0].lock_dir.is_relative_to(tmp_path / "host-tmp")
    assert pools[0].lock_dir.stat().st_mode & 0o7777 == 0o1777  # every user of the host shares it
    with pools[0].acquire(2, holder="first"):
        with pytest.raises(GpuPoolError, match="not free within"):
            with pools[1].acquire(1, timeout=0.3, poll=0.1, holder="second"):
                pass
    with pools[1].acquire(2, holder="second") as devices:
        assert devices == ["0", "1"]


def test_a_run_record_names_the_run_that_measured_this_jobs_cells_never_another_configurations(tmp_path):
    from specsweep.cache import write_run_record

    folder = tmp_path / "journal" / "tp1-ar"
    ours = Journal(folder / "run-a.jsonl", "run-a")
    _run(ours, "tp1/ar", ["k1", "k2"])  # this configuration's cells (key = cell name here)
    _run(Journal(folder / "run-b.jsonl", "run-b"), "tp1/ar", ["x1"])  # later: another configuration, same server
    this_job = Journal(folder / "run-c.jsonl", "run-c")
    this_job.write("cache_hit", server="tp1/ar", cell="k1", key="k1")  # every cell from the cache
    write_run_record(tmp_path / "record.json", "tp1/ar", this_job, {"k1", "k2"})
    record = json.loads((tmp_path / "record.json").read_text())["latest_run"]
    assert record["run"] == "run-a" and record["cells"] == ["k1", "k2"]
    _run(this_job, "tp1/ar", ["k2"])  # a job that measured is its own run, whatever ran after it elsewhere
    _run(Journal(folder / "run-d.jsonl", "run-d"), "tp1/ar", ["k1", "k2"])
    write_run_record(tmp_path / "record.json", "tp1/ar", this_job, {"k1", "k2"})
    assert json.loads((tmp_path / "record.json").read_text())["latest_run"]["run"] == "run-c"


def test_an_api_key_file_is_private_and_gone_on_every_way_out_this_process_runs_code_on(tmp_path, monkeypatch):
    import tempfile

    from specsweep.launcher import ApiKeyFile, secrets_folder

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("SPECSWEEP_TEST_KEY", "sk-unit-1")
    with ApiKeyFile("SPECSWEEP_TEST_KEY") as key:
        path = Path(key.args[1])
        assert key.args[0] == "--config" and path.read_text() == 'api-key: "sk-unit-1"\n'
        assert path.stat().st_mode & 0o777 == 0o600 and secrets_folder().stat().st_mode & 0o777 == 0o700
        key.remove()  # the server is ready: it read the file
        assert not path.exists() and key.headers == {"Authorization": "Bearer sk-unit-1"}
    with pytest.raises(RuntimeError):
        with ApiKeyFile("SPECSWEEP_TEST_KEY") as key:
            path = Path(key.args[1])
            raise RuntimeError("the server failed")
    assert not path.exists() and list(secrets_folder().iterdir()) == []


def test_a_key_file_a_sigkill_left_is_swept_at_the_next_start(tmp_path):
    import subprocess
    import sys

    code = (
        "import sys, time\nfrom specsweep.launcher import ApiKeyFile\n"
        "with ApiKeyFile('SPECSWEEP_TEST_KEY') as key:\n    print(key.args[1], flush=True)\n    time.sleep(600)\n"
    )
    env = {**os.environ, "TMPDIR": str(tmp_path), "SPECSWEEP_TEST_KEY": "sk-unit-2"}
    holder = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    try:
        path = Path(holder.stdout.readline().strip())
        check = "from specsweep.launcher import sweep_secrets\nprint(len(sweep_secrets()))\n"
        assert (
            subprocess.run(
                [sys.executable, "-c", check], env=env, capture_output=True, text=True, timeout=patience(12)
            ).stdout.strip()
            == "0"
        )  # its owner runs: kept
        holder.kill()
        holder.wait(timeout=patience(6))
        assert path.exists()
        assert (
            subprocess.run(
                [sys.executable, "-c", check], env=env, capture_output=True, text=True, timeout=patience(12)
            ).stdout.strip()
            == "1"
        )
        assert not path.exists() and not path.parent.exists()
    finally:
        holder.kill()


def test_a_secrets_folder_others_may_read_is_refused_by_name(tmp_path, monkeypatch):
    import tempfile

    from specsweep.launcher import ApiKeyFile, ServerError

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    folder = tmp_path / f"specsweep-secrets-{os.getuid()}"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    monkeypatch.setenv("SPECSWEEP_TEST_KEY", "sk-unit-3")
    with pytest.raises(ServerError, match=f"{folder} is not a private folder"):
        with ApiKeyFile("SPECSWEEP_TEST_KEY"):
            pass
    assert list(folder.iterdir()) == []


_WORKFLOW = (
    "import os, sys, time\nfrom specsweep import runs\n"
    "runs.start(sys.argv[1], float(sys.argv[2]))\nprint(os.environ[runs.HEARTBEAT_ENV], flush=True)\n"
    "time.sleep(float(sys.argv[3]))\n"
)
_JOB = (
    "import signal, sys, time\nfrom specsweep import runs\n"
    "signal.signal(signal.SIGTERM, lambda *_: (print('stopped', flush=True), sys.exit(3)))\n"
    "runs.stop_with_workflow(poll=0.05)\nprint('watching', flush=True)\ntime.sleep(120)\n"
)


def _job_watching(heartbeat: str):
    """A job started by this test (a parent that lives on, as a cluster's job step does) watching ``heartbeat``."""
    import subprocess
    import sys

    env = {**os.environ, "SPECSWEEP_HEARTBEAT": heartbeat}
    job = subprocess.Popen(
        [sys.executable, "-c", _JOB], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert job.stdout.readline().strip() == "watching"
    return job


def test_a_cluster_job_stops_when_the_workflow_is_killed_outright_and_not_while_it_lives(tmp_path):
    import subprocess
    import sys

    workflow = subprocess.Popen(
        [sys.executable, "-c", _WORKFLOW, str(tmp_path / "runs"), "2", "600"], stdout=subprocess.PIPE, text=True
    )
    job = None
    try:
        heartbeat = workflow.stdout.readline().strip()
        path = Path(heartbeat.rpartition(":")[0])
        assert heartbeat.endswith(":2") and path.parent == tmp_path / "runs" and path.exists()
        job = _job_watching(heartbeat)
        # the workflow alive: its job keeps running through more than two timeouts' worth of heartbeats
        with pytest.raises(subprocess.TimeoutExpired):
            job.wait(timeout=5)
        workflow.kill()  # SIGKILL: the heartbeat file stays, and stops changing
        workflow.wait(timeout=patience(6))
        assert path.exists()
        out, err = job.communicate(timeout=patience(12))
        assert job.returncode == 3 and out.strip() == "stopped"
        assert f"has not touched {path} for 2 s: stopping" in err
    finally:
        for proc in (workflow, job):
            if proc is not None and proc.poll() is None:
                proc.kill()


def test_a_workflow_that_ends_removes_its_heartbeat_and_a_job_left_behind_stops(tmp_path):
    import subprocess
    import sys

    workflow = subprocess.Popen(
        [sys.executable, "-c", _WORKFLOW, str(tmp_path / "runs"), "2", "0.5"], stdout=subprocess.PIPE, text=True
    )
    heartbeat = workflow.stdout.readline().strip()
    assert workflow.wait(timeout=patience(12)) == 0
    assert list((tmp_path / "runs").iterdir()) == []  # removed at its exit
    job = _job_watching(heartbeat)  # a job it left (a missing heartbeat file does not change either)
    try:
        out, err = job.communicate(timeout=patience(12))
        assert job.returncode == 3 and "has not touched" in err
    finally:
        if job.poll() is None:
            job.kill()


def test_a_new_run_removes_the_heartbeat_files_of_dead_runs_and_no_other(tmp_path):
    import socket
    import subprocess
    import sys
    import time

    from specsweep import runs

    folder = tmp_path / "runs"
    killed = subprocess.Popen([sys.executable, "-c", _WORKFLOW, str(folder), "0.5", "600"], stdout=subprocess.PIPE)
    left = Path(killed.stdout.readline().decode().strip().rpartition(":")[0])
    killed.kill()  # SIGKILL: no code of its own runs, its heartbeat file stays
    killed.wait(timeout=patience(12))
    assert left.read_text() == "0.5\n"  # the file says its run's timeout
    host = "".join(c if c.isalnum() or c in "-." else "-" for c in socket.gethostname())
    files = {
        "killed, still for 60 of its 0.5 s timeouts": (left, None, 30),
        "dead, still for 5 of its 60 s timeouts": (folder / f"20260101T000000Z-{host}-{killed.pid}.alive", "60", 300),
        "alive here (stopped, say), still for an hour": (
            folder / f"20260101T000000Z-{host}-{os.getpid()}.alive",
            "1",
            3600,
        ),
        "another host's, no timeout written, still for 15 of this run's": (
            folder / "20260101T000000Z-node-7-12.alive",
            "",
            30,
        ),
        "another host's, still for 2 timeouts": (folder / "20260101T000000Z-node-7-13.alive", "2", 4),
    }
    for path, text, age in files.values():
        if text is not None:
            path.write_text(text)
        os.utime(path, (time.time() - age, time.time() - age))

    new = subprocess.run(
        [sys.executable, "-c", _WORKFLOW, str(folder), "2", "0"],
        capture_output=True,
        text=True,
        timeout=patience(12),
        check=True,
    )
    assert new.stdout.strip().endswith(":2")  # its own file, removed at its exit
    kept = {name for name, (path, _, _) in files.items() if path.exists()}
    assert kept == {
        "dead, still for 5 of its 60 s timeouts",
        "alive here (stopped, say), still for an hour",
        "another host's, still for 2 timeouts",
    }
    assert sorted(p.name for p in folder.iterdir()) == sorted(files[name][0].name for name in kept)
    assert runs.sweep_heartbeats(str(tmp_path / "none"), 2) == []  # no folder yet: nothing to do


_SIGTERM_WHILE_LOCKED = """
import os, signal, sys, threading, time
from snakemake.scheduling.job_scheduler import JobScheduler
from specsweep.runs import off_the_main_thread

scheduler = object.__new__(JobScheduler)  # the state its SIGTERM handler reads
scheduler._lock, scheduler._open_jobs, scheduler._user_kill = threading.Lock(), threading.Semaphore(0), None
handler = JobScheduler.exit_gracefully
if sys.argv[1] == "off the main thread":  # as rules/common.smk installs it
    handler = off_the_main_thread(handler)
signal.signal(signal.SIGTERM, handler.__get__(scheduler))
with scheduler._lock:  # the main thread handling a failed job when SLURM's SIGTERM arrives
    print("signalled", flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.5)  # the handler runs here, between two steps of this thread
scheduler._open_jobs.acquire()  # the scheduler's next round, woken by the handler
print(scheduler._user_kill, flush=True)
"""


def test_snakemake_s_sigterm_handler_run_off_the_main_thread_does_not_deadlock_a_scheduler_holding_its_lock():
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _SIGTERM_WHILE_LOCKED, "off the main thread"],
        capture_output=True,
        text=True,
        timeout=patience(12),
    )
    assert (done.returncode, done.stdout.split()) == (0, ["signalled", "graceful"]), done.stderr
    # as Snakemake installs it, the same signal at the same moment waits on its own lock for ever
    as_is = subprocess.Popen([sys.executable, "-c", _SIGTERM_WHILE_LOCKED, "as is"], stdout=subprocess.PIPE, text=True)
    try:
        assert as_is.stdout.readline().strip() == "signalled"
        with pytest.raises(subprocess.TimeoutExpired):
            as_is.wait(timeout=5)
    finally:
        as_is.kill()
        as_is.wait()
