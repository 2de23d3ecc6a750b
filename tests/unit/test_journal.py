"""Journals and run records: damaged lines cost only themselves."""

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
