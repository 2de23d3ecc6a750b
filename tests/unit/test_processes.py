"""Processes, locks and journals: nothing left behind, nothing double-booked, damaged lines cost only themselves."""

from __future__ import annotations

import json

import pytest

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
