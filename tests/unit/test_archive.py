"""Archived records: each cell verified on its own (digest and cell schema, and the cell its file names) before
today's report renders a record; a cell that fails is refused by name, never dropped; and the renderer's stamp."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from conftest import REPO
from specsweep import __version__, archive
from specsweep.cells import content_digest
from specsweep.report import renderer_stamp

RECORDS = REPO / "benchmarks" / "gpu"
SMALL = "forced-moe-2026-12-02"  # 9 cells, each carrying its digest
UNDIGESTED = "record-2026-11-30"  # 20 cells written before cells carried a digest: record.yaml lists theirs


def copy_record(tmp_path, name: str):
    """A copy of a committed record's cells, environment record and record.yaml."""
    source, copy = RECORDS / name, tmp_path / name
    shutil.copytree(source / "cells", copy / "cells")
    for extra in ("environment.json", "record.yaml"):
        if (source / extra).exists():
            shutil.copy2(source / extra, copy / extra)
    return copy


def edit(path, change) -> None:
    cell = json.loads(path.read_text())
    change(cell)
    path.write_text(json.dumps(cell, indent=1))


def refusal(record) -> str:
    with pytest.raises(archive.ArchiveError) as caught:
        archive.verified_cells(record, archive.read_settings(record))
    return str(caught.value)


@pytest.mark.parametrize("name", [SMALL, UNDIGESTED])
def test_every_cell_of_a_committed_record_is_verified(name):
    record = RECORDS / name
    cells = archive.verified_cells(record, archive.read_settings(record))
    assert len(cells) == len(list((record / "cells").rglob("*.json")))


@pytest.mark.parametrize("name", [SMALL, UNDIGESTED])
def test_a_changed_number_is_refused_by_the_digest_naming_the_file(tmp_path, name):
    """A cell's own digest (SMALL) or the one record.yaml lists for it (UNDIGESTED) finds one number changed."""
    record = copy_record(tmp_path, name)
    tampered = record / "cells" / "tp1" / "ar" / "short" / "c4.json"

    def faster(cell):
        cell["requests"][3]["output_tokens"] += 1

    edit(tampered, faster)
    message = refusal(record)
    assert f"{tampered}: its content does not match its digest" in message
    assert message.count(str(record / "cells")) == 1  # the others are trusted, and none is dropped in silence
    assert archive.main([str(record), "--out", str(tmp_path / "report.pdf")]) == 1
    assert not (tmp_path / "report.pdf").exists()


def test_a_cell_missing_a_required_field_is_refused_by_the_schema(tmp_path):
    """The field removed and the digest written again over what is left: the schema, not the digest, refuses it."""
    record = copy_record(tmp_path, SMALL)
    broken = record / "cells" / "tp1" / "eagle3-chain-a2" / "short" / "c1.json"

    def without_workload(cell):
        del cell["workload"]
        cell["digest"] = content_digest(cell)

    edit(broken, without_workload)
    message = refusal(record)
    assert f"{broken}: it does not follow the cell schema" in message and "'workload' is a required property" in message


def test_a_cell_written_before_digests_is_trusted_only_with_its_listed_digest(tmp_path):
    record = copy_record(tmp_path, UNDIGESTED)
    settings = (record / "record.yaml").read_text()
    unlisted = "tp1/dflash/long/c16.json"
    (record / "record.yaml").write_text("\n".join(line for line in settings.splitlines() if unlisted not in line))
    assert f"{record / 'cells' / unlisted}: it carries no digest" in refusal(record)
    (record / "record.yaml").write_text(settings.replace("digests:", "digests:\n  tp1/ar/short/c99.json: " + "a" * 64))
    assert "it lists a digest for tp1/ar/short/c99.json, which is not there" in refusal(record)


def test_a_cell_under_another_cells_name_is_refused(tmp_path):
    record = copy_record(tmp_path, SMALL)
    moved = record / "cells" / "tp1" / "ar" / "short" / "c8.json"
    shutil.move(record / "cells" / "tp1" / "ar" / "short" / "c4.json", moved)
    assert f"{moved}: it holds the cell tp1/ar/short/c4, not tp1/ar/short/c8 as its file says" in refusal(record)


VERDICT = "spec-verdict-2026-12-03"  # measured under budget: verdict: 40 cells and 16 skipped records
IMPLIED = ("dflash", "short", "c4")  # one of the cells it did not measure


def test_a_record_with_cells_not_measured_verifies_its_measured_cells_and_holds_each_skipped_record_to_its_cell(
    tmp_path,
):
    """The skipped records are not cells (no number), and each is held to being exactly one: a measured cell whose
    schema says "not measured", a skipped record copied over a measured cell's file, or one implied from a cell the
    record does not hold is refused by name, never dropped."""
    record = RECORDS / VERDICT
    files = list((record / "cells").rglob("*.json"))
    cells = archive.verified_cells(record, archive.read_settings(record))
    skipped = [f for f in files if json.loads(f.read_text()).get("skipped")]
    assert len(skipped) == 16 and len(cells) == len(files) - 16
    assert all(not cell.get("skipped") and cell["requests"] for cell in cells.values())

    copy = copy_record(tmp_path, VERDICT)
    measured = copy / "cells" / "tp1" / "ar" / "short" / "c1.json"
    edit(measured, lambda cell: cell.update(schema="specsweep-skipped-cell/1"))
    assert f"{measured}: it says it is a cell not measured" in refusal(copy)

    copy = copy_record(tmp_path / "2", VERDICT)
    implied_cell = copy / "cells" / "tp1" / IMPLIED[0] / IMPLIED[1] / f"{IMPLIED[2]}.json"
    target = copy / "cells" / "tp1" / "dflash" / "long" / "c64.json"
    shutil.copy2(implied_cell, target)
    assert f"{target}: it holds the cell tp1/dflash/short/c4" in refusal(copy)

    copy = copy_record(tmp_path / "3", VERDICT)
    implied_cell = copy / "cells" / "tp1" / IMPLIED[0] / IMPLIED[1] / f"{IMPLIED[2]}.json"
    (copy / "cells" / "tp1" / "dflash" / "short" / "c64.json").unlink()
    assert f"{implied_cell}: it is implied from cells the record does not hold" in refusal(copy)


def test_record_settings_are_checked(tmp_path):
    record = copy_record(tmp_path, SMALL)
    (record / "record.yaml").write_text("titel: typo\n")
    with pytest.raises(archive.ArchiveError, match="record.yaml: at the top level: Additional properties"):
        archive.read_settings(record)
    (record / "record.yaml").write_text("methods: [ar]\n")
    cells = archive.verified_cells(record, {})
    with pytest.raises(archive.ArchiveError, match="are not its cells' methods"):
        archive.method_order(cells, archive.read_settings(record))


def test_a_ddtree_records_stage_table_is_modelled_by_the_cost_model_its_settings_name(tmp_path):
    """record.yaml's sim (gpu, model_profile, runtime) prices the simulator's split of each profiled DDTree round
    beside the stage profiler's; without it the stage table has no modelled columns; a sim missing a key is refused."""
    from specsweep import ddtree_profile

    record = REPO / "benchmarks" / "gpu" / "ddtree-2026-12-03"
    settings = archive.read_settings(record)
    cells = archive.verified_cells(record, settings)
    modelled = ddtree_profile.stage_rows(cells, archive.stage_costs(cells, settings))
    assert len(modelled) == 16 and modelled["modelled_ms_round"].gt(0).all()
    assert set(modelled["cost_model"]) == {"sglang-0.5.16-h200"}
    bare = ddtree_profile.stage_rows(cells, archive.stage_costs(cells, {}))
    assert bare["modelled_ms_round"].isna().all()
    copy = copy_record(tmp_path, SMALL)
    (copy / "record.yaml").write_text("sim: {gpu: H200, runtime: sglang-0.5.16-h200}\n")
    with pytest.raises(archive.ArchiveError, match="model_profile"):
        archive.read_settings(copy)


def test_a_record_is_judged_against_its_own_slos_or_the_configurations_defaults(tmp_path):
    """record.yaml's slo (checked as the configuration checks it) sets the objectives the SLO tables judge; without
    one, the configuration's defaults; the judged table names each objective and says where each cell met it."""
    record = copy_record(tmp_path, SMALL)
    defaults = archive.record_slo(record, {})
    assert [o.name for o in defaults.objectives] == ["interactive", "fast"] and defaults.attainment == 0.9
    own = archive.record_slo(record, {"slo": {"objectives": [{"name": "chat", "ttft_ms": 500}], "attainment": 0.8}})
    assert [(o.name, o.targets) for o in own.objectives] == [
        ("chat", {"ttft_ms": 500.0, "tpot_ms": None, "itl_ms": None})
    ] and own.attainment == 0.8
    for bad, says in (
        ({"objectives": [{"name": "x"}]}, "sets no target"),
        ({"objectives": [{"name": "x", "ttft_ms": -1}]}, "at slo/objectives/0/ttft_ms"),
        ({"attainment": 2}, "at slo/attainment"),
    ):
        with pytest.raises(archive.ArchiveError, match=says):
            archive.record_slo(record, {"slo": bad})
    tables = tmp_path / "tables"
    cells = archive.verified_cells(record, {})
    written = archive.write_tables(cells, tables, archive.DEFAULT_FAILURES, slo=own)
    assert set(written["slo"]["slo"]) == {"chat"}
    assert "slo_chat_share" in written["summary"].columns


def test_methods_are_ordered_by_algorithm_then_by_name_with_numbers_read_as_numbers():
    record = RECORDS / "spec-2026-12-01"
    cells = archive.verified_cells(record, archive.read_settings(record))
    assert archive.method_order(cells, {}) == [
        "ar",
        "dflash",
        "ngram-d8",
        "ngram-d32",
        "eagle3-chain",
        "eagle3-tree",
        "standalone",
    ]


def git(folder, *args) -> str:
    return subprocess.run(
        ["git", "-C", str(folder), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def test_the_stamp_names_the_checkout_commit_and_its_uncommitted_changes(tmp_path):
    package = tmp_path / "checkout" / "specsweep"
    package.mkdir(parents=True)
    (package / "report.py").write_text("# one\n")
    assert renderer_stamp(package) == f"specsweep {__version__} (not a git checkout: commit unknown)"
    git(package.parent, "init", "-q")
    git(package.parent, "add", ".")
    git(package.parent, "commit", "-qm", "one")
    head = git(package.parent, "rev-parse", "HEAD")
    stamp = renderer_stamp(package)
    assert stamp.startswith(f"specsweep {__version__}, commit ") and head.startswith(stamp.rsplit(" ", 1)[1])
    (tmp_path / "checkout" / "results.csv").write_text("elsewhere in the checkout: not the renderer's code\n")
    assert renderer_stamp(package) == stamp
    (package / "report.py").write_text("# two\n")
    assert renderer_stamp(package) == stamp + " with uncommitted changes"
    inner = package / "vendored" / "specsweep"  # a copy inside another checkout is not that checkout's code
    inner.mkdir(parents=True)
    assert "commit unknown" in renderer_stamp(inner)


def test_the_methodology_says_which_cells_filled_their_warm_up_to_a_wave():
    """Cells since the warm-up filled a wave record warmup_fill (0 at a concurrency of at most warmup); a record of
    such cells says so for all, a record mixing them with earlier cells says it of those that record it."""
    new = [{"workload": {"warmup": 2, "warmup_fill": f}} for f in (0, 2, 14)]
    old = [{"workload": {"warmup": 2}}]
    assert archive._warmup_fill(new) == "all"
    assert archive._warmup_fill(new + old) == "some"
    assert archive._warmup_fill(old) is None
