"""Archived records: a committed record's cells rendered by today's report, each cell verified on its own (its
digest and the cell schema) instead of against today's configuration.

A record is a folder of cells that older code measured (benchmarks/gpu/<record>/ in this repository):

    cells/tp{tp}/{method}/{workload}/c{concurrency}[-r{rep}].json   the cells, as the workflow wrote them
    environment.json, or env/<backend>@<engine>.json per engine    the environment record of the build(s)
    record.yaml                                                    optional: title, author, orders, digests

Today's configuration gives those cells other keys (HARNESS_VERSION and what a key digests have changed since), so
the workflow's aggregation refuses them (aggregate.verified_cells). Here a cell is used when it follows today's
cell schema, matches its digest and is the cell its file names (cells.integrity_problem, cell_identity_problem);
any other cell stops the rendering with its file and what is wrong, never dropped. A cell that ``budget: verdict``
did not measure left a skipped record in its place (implied.skipped_record: its reason, the cells it was implied
from, no number): it is held to being exactly such a record of the cell its file names, implied from cells the
record holds (skipped_problem), and listed in the report's "Cells not measured". Cells written before cells
carried a digest (harness versions 2 and 3) are upgraded by one rule: the digest they are held to is the one
record.yaml lists for their file (``digests``), computed by cells.content_digest over the files as the commit
``digests_of`` added them. Nothing else is filled in: every metric is computed from the cells' raw records by
today's code (aggregate.write_tables), which reads the fields older cells lack as absent.

The report is today's (report.prepare, the template), from a view made of the cells and the environment record
(view_of_record) in place of the configuration's (rules/common.smk report_view); its title page names the commit
that rendered it (report.renderer_stamp), as every report's does.

    python -m specsweep.archive RECORD [--out PDF] [--figures DIR] [--keep DIR]
    python -m specsweep.archive --all FOLDER     every record directly under FOLDER, each to its report.pdf
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
from datetime import date
from pathlib import Path

import jsonschema
import pandas as pd
import yaml

from . import algorithms, implied
from .aggregate import skipped_cells, write_tables
from .cells import DEFAULT_FAILURES, cell_name, integrity_problem
from .config import check_slo
from .errors import ConfigError
from .layout import REPORT_SECTIONS
from .report import ReportError, build_report, plot_figures, prepare, write_data
from .sections import sampling_text
from .slo import Slo

CELLS = "cells"
SETTINGS = "record.yaml"
CONFIG_SCHEMA = Path(__file__).resolve().parents[1] / "config" / "schema.yaml"  # the configuration's schema (its slo)
ENVIRONMENT = "environment.json"  # one build's environment record; env/<backend>@<engine>.json per engine
CELL_FILE = re.compile(r"tp(?P<tp>\d+)/(?P<method>[^/]+)/(?P<workload>[^/]+)/c(?P<concurrency>\d+)(-r(?P<rep>\d+))?$")

# record.yaml: every key optional
SETTINGS_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "title": {"type": "string", "description": "the report's title (default: the record's folder name)"},
        "author": {"type": "string"},
        "methods": {
            "type": "array",
            "items": {"type": "string"},
            "description": "the methods' order in tables and legends (default: by algorithm, AR first, then by name)",
        },
        "engines": {
            "type": "array",
            "items": {"type": "string"},
            "description": "the engines' order, the first the reference (default: by name)",
        },
        "slo": {
            "type": "object",
            "description": "service-level objectives to judge the cells against, as the configuration's slo: "
            "(objectives, attainment; config/schema.yaml); default: the configuration's defaults",
        },
        "digests": {
            "type": "object",
            "additionalProperties": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
            "description": "{cell file under cells/: its content digest} for cells that carry none",
        },
        "sim": {
            "type": "object",
            "required": ["gpu", "model_profile", "runtime"],
            "properties": {
                "gpu": {"type": "string"},
                "model_profile": {"type": "string"},
                "runtime": {"type": "string"},
            },
            "additionalProperties": False,
            "description": "the cost model whose split of a DDTree round the stage table shows beside the stage "
            "profiler's (the configuration's sim: gpu, model_profile, runtime; default: no modelled columns)",
        },
        "digests_of": {
            "type": "string",
            "pattern": "^[0-9a-f]{40}$",
            "description": "the commit that added the cells whose digests are listed, as they were computed from",
        },
    },
    "dependentRequired": {"digests": ["digests_of"]},
}


class ArchiveError(RuntimeError):
    """A record that cannot be rendered; the message names the record, the file and what to do."""


def read_settings(record: Path) -> dict:
    """The record's record.yaml (an empty mapping where it has none), checked against SETTINGS_SCHEMA."""
    path = record / SETTINGS
    if not path.exists():
        return {}
    try:
        settings = yaml.safe_load(path.read_text()) or {}
        jsonschema.validate(settings, SETTINGS_SCHEMA)
    except (yaml.YAMLError, jsonschema.ValidationError) as exc:
        where = "/".join(str(p) for p in getattr(exc, "absolute_path", ())) or "the top level"
        message = getattr(exc, "message", str(exc))
        raise ArchiveError(f"{path}: at {where}: {message} (its keys: docs/report.md, 'Archived records')") from exc
    return settings


def record_slo(record: Path, settings: dict) -> Slo:
    """The service-level objectives a record is judged against: record.yaml's ``slo`` (checked against the
    configuration's own schema of ``slo`` and check_slo), each key it leaves out the configuration's default. SLOs
    are analysis only (no cell key holds them), so today's defaults apply to a record measured before they existed."""
    schema = yaml.safe_load(CONFIG_SCHEMA.read_text())
    section_schema = {**schema["properties"]["slo"], "$defs": schema.get("$defs", {})}
    section = settings.get("slo", {})
    try:
        jsonschema.validate(section, section_schema)
        filled = {key: section.get(key, spec.get("default")) for key, spec in section_schema["properties"].items()}
        check_slo({"slo": filled})
    except (jsonschema.ValidationError, ConfigError) as exc:
        where = "/".join(["slo", *(str(p) for p in getattr(exc, "absolute_path", ()))])
        message = getattr(exc, "message", str(exc))
        raise ArchiveError(
            f"{record / SETTINGS}: at {where}: {message} (the keys of slo: docs/configuration.md)"
        ) from exc
    return Slo.from_config(filled)


def cell_identity_problem(cell: dict, name: str) -> str | None:
    """Why a cell is not the cell its file names (``name``: its path under cells/ without .json), or None."""
    match = CELL_FILE.match(name)
    if match is None:
        return "its file is not named tp<tp>/<method>/<workload>/c<concurrency>[-r<repetition>].json"
    named = {
        "tp": int(match["tp"]),
        "method": match["method"],
        "workload": match["workload"],
        "concurrency": int(match["concurrency"]),
        "repetition": int(match["rep"] or 0),
    }
    if cell["cell"] != named:
        return f"it holds the cell {cell_name(cell['cell'])}, not {cell_name(named)} as its file says"
    return None


def skipped_problem(record: Path, cell: dict, name: str, listed: dict) -> str | None:
    """Why a file under cells/ that says it is a cell not measured (implied.is_skipped) is not one the record can
    list as such: a file record.yaml lists a digest for (a measured cell), not exactly a skipped record, implied
    from a cell the record does not hold, or not the cell its file names; None when it is one."""
    if name in listed:
        return "it says it is a cell not measured, but record.yaml lists a digest for it (a measured cell)"
    problem = implied.skipped_problem(cell)
    if problem is None:
        missing = [p for p in cell["implied_by"] if not (record / str(p).removeprefix("results/")).is_file()]
        if missing:
            problem = f"it is implied from cells the record does not hold: {', '.join(missing)}"
    return problem or cell_identity_problem(cell, name.removesuffix(".json"))


def verified_cells(record: Path, settings: dict) -> dict[str, dict]:
    """{file under the record: cell} of every cell under its cells/ folder, each following the cell schema,
    matching its digest (its own, or the one record.yaml lists for it) and being the cell its file names;
    ArchiveError naming every other cell and what is wrong with it, and a record without cells."""
    listed = settings.get("digests") or {}
    files = sorted((record / CELLS).rglob("*.json"))
    if not files:
        raise ArchiveError(f"{record}: no cell under {record / CELLS} (a record holds cells/tp*/<method>/...json)")
    unknown = sorted(set(listed) - {f.relative_to(record / CELLS).as_posix() for f in files})
    cells, refused = {}, [f"{record / SETTINGS}: it lists a digest for {name}, which is not there" for name in unknown]
    for path in files:
        name = path.relative_to(record / CELLS).as_posix()
        try:
            cell = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            refused.append(f"{path}: it cannot be read as JSON ({exc})")
            continue
        if implied.is_skipped(cell):  # a cell budget: verdict did not measure: no number, listed by skipped_cells
            problem = skipped_problem(record, cell, name, listed)
            if problem:
                refused.append(f"{path}: {problem}")
            continue
        problem = integrity_problem(cell, listed.get(name))
        if problem is None:
            problem = cell_identity_problem(cell, name.removesuffix(".json"))
        if problem:
            refused.append(f"{path}: {problem}")
        else:
            cells[path.relative_to(record).as_posix()] = cell
    if refused:
        raise ArchiveError(
            f"{len(refused)} cell(s) of the record {record} refused:\n  "
            + "\n  ".join(refused)
            + "\nA record's cells are rendered as they were measured: restore each refused file from the record's "
            "history (git checkout -- <file>), or remove it from the record and say so in its README."
        )
    return cells


def environments(record: Path, cells: dict[str, dict], settings: dict) -> tuple[list[str], dict]:
    """(the engines' order, {engine name or None: environment record}) of a record: one build's environment.json, or
    with engines (cells whose method names one) env/<backend>@<engine>.json for each engine its cells ran on, in
    record.yaml's order (``engines``, which must name exactly those) or by name."""
    names = sorted({c["method"]["engine"] for c in cells.values() if c["method"].get("engine")})
    if not names:
        path = record / ENVIRONMENT
        if not path.exists():
            raise ArchiveError(f"{record}: no environment record ({path}): the report's setup table reads it")
        return [], {None: json.loads(path.read_text())}
    order = settings.get("engines") or names
    if sorted(order) != names:
        raise ArchiveError(
            f"{record / SETTINGS}: engines {order} are not the engines its cells ran on ({', '.join(names)})"
        )
    found = {}
    for name in order:
        matches = sorted((record / "env").glob(f"*@{name}.json"))
        if len(matches) != 1:
            raise ArchiveError(f"{record}: no single environment record env/<backend>@{name}.json of engine {name}")
        found[name] = json.loads(matches[0].read_text())
    return list(order), found


def _warmup_fill(records: list[dict]) -> str | None:
    """Whether the record's cells were measured with the warm-up that fills a wave (workloads.warmup_fill, which
    every cell since 2026-12-03 records, 0 where its concurrency is at most ``warmup``; earlier cells record none):
    "all", "some" or None."""
    filled = ["warmup_fill" in c["workload"] for c in records]
    return "all" if all(filled) else "some" if any(filled) else None


def method_order(cells: dict[str, dict], settings: dict) -> list[str]:
    """The methods in tables and legends: record.yaml's ``methods`` (which must name exactly the cells' methods),
    else by algorithm in the registry's order (AR first), then by name with its numbers read as numbers (ngram-d8
    before ngram-d32), as a configuration lists its methods and their sweeps."""
    algorithm = {c["cell"]["method"]: c["method"]["algorithm"] for c in cells.values()}
    if settings.get("methods"):
        if sorted(settings["methods"]) != sorted(algorithm):
            raise ArchiveError(
                f"{SETTINGS}: methods {settings['methods']} are not its cells' methods ({', '.join(sorted(algorithm))})"
            )
        return list(settings["methods"])
    rank = {name: i for i, name in enumerate(algorithms.REGISTRY)}

    def key(method: str) -> tuple:
        parts = re.split(r"(\d+)", method)
        return rank[algorithm[method]], [int(p) if p.isdigit() else p for p in parts]

    return sorted(algorithm, key=key)


def _distinct(values) -> list:
    """Each value once, in order of first appearance (values compared as JSON)."""
    seen: dict[str, object] = {}
    for value in values:
        seen.setdefault(json.dumps(value, sort_keys=True), value)
    return list(seen.values())


def view_of_record(record: Path, cells: dict[str, dict], settings: dict) -> dict:
    """What the report reads of a run besides its tables (rules/common.smk report_view), from the cells: title
    (record.yaml's, else the folder's name), author, model, methods (method_order), warm-up requests, load model,
    sampling, the cost model of simulated cells, and the date line: when the cells were measured and when rendered.
    Where cells differ (two models, two warm-ups), every value is named."""
    records = list(cells.values())
    started = sorted(c["provenance"]["started_at"][:10] for c in records)
    measured = started[0] if started[0] == started[-1] else f"{started[0]} to {started[-1]}"
    load_models = _distinct(c["load"]["model"] for c in records)
    simulated = any(c["simulated"] for c in records)
    return {
        "title": settings.get("title") or f"Record {record.resolve().name}",
        "author": settings.get("author") or "specsweep",
        "date": f"cells measured {measured}; rendered {date.today().isoformat()}",
        "model": "; ".join(_distinct(c["model"].get("name") or c["model"].get("path") for c in records)),
        "methods": method_order(cells, settings),
        "warmup": ", ".join(str(w) for w in sorted(_distinct(c["workload"]["warmup"] for c in records))),
        "warmup_fill": _warmup_fill(records),
        "load_model": load_models[0] if len(load_models) == 1 else "mixed",
        "sampling": "; ".join(_distinct(sampling_text(c["sampling"], c["load"]) for c in records)),
        "sim_profile": "as each cell records it (provenance.sim_profile)" if simulated else "",
        "plan_profile": "",
        "cost_model": "; ".join(
            _distinct(c["provenance"]["cost_model"] for c in records if c["provenance"].get("cost_model"))
        ),
    }


def skipped_records(record: Path, cells: dict[str, dict]) -> pd.DataFrame:
    """The record's cells not measured (aggregate.skipped_cells): the files under cells/ that verified_cells passed
    over (``cells``: what it returned), the skipped records, since any other would have stopped it."""
    others = (p for p in sorted((record / CELLS).rglob("*.json")) if p.relative_to(record).as_posix() not in cells)
    return skipped_cells([str(p) for p in others])


def stage_costs(cells: dict[str, dict], settings: dict) -> dict | None:
    """The cost model of record.yaml's ``sim`` for every engine and TP size of the record's cells (the stage table's
    "<engine>|<tp>": ddtree_profile.stage_rows), or None where it states none."""
    sim = settings.get("sim")
    if not sim:
        return None
    return {f"{c['method'].get('engine') or ''}|{c['cell']['tp']}": dict(sim) for c in cells.values()}


def render(record: Path, out_pdf: Path | None = None, figures: Path | None = None, work: Path | None = None) -> Path:
    """The record's report rendered by today's code into ``out_pdf`` (default: report.pdf in the record), and with
    ``figures`` every chart as a PNG there, one folder per section (as the workflow's report_figures draws them):
    verified cells (verified_cells), today's tables (aggregate.write_tables, under the default failure thresholds),
    today's report data and template. Built in ``work`` (its tables, report/data.json, report.tex, data/ and the
    LaTeX log report.log are kept there), else in a temporary folder: the record gets the PDF alone."""
    record = Path(record)
    settings = read_settings(record)
    cells = verified_cells(record, settings)
    order, envs = environments(record, cells, settings)
    view = view_of_record(record, cells, settings)
    out = Path(out_pdf) if out_pdf else record / "report.pdf"
    with tempfile.TemporaryDirectory(prefix="specsweep-archive-") as temporary:
        folder = Path(work) if work is not None else Path(temporary)
        (folder / "tables").mkdir(parents=True, exist_ok=True)
        (folder / "report").mkdir(exist_ok=True)
        write_tables(
            cells,
            folder / "tables",
            DEFAULT_FAILURES,
            order,
            envs,
            record_slo(record, settings),
            skipped_records(record, cells),
            stage_costs(cells, settings),
        )
        context, csv = prepare(folder / "tables", envs[order[0] if order else None], view)
        data = folder / "report" / "data.json"
        write_data(context, csv, data)
        build_report(str(data), str(folder / "report" / "report.pdf"), str(folder / "report" / "latexmk.log"))
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(folder / "report" / "report.pdf", out)
        if figures is not None:
            plot_figures(str(data), {section: str(Path(figures) / section) for section in REPORT_SECTIONS})
    return out


def records_under(folder: Path) -> list[Path]:
    """Every record directly under a folder: each sub-folder with a cells/ folder, by name."""
    return sorted(p for p in Path(folder).iterdir() if (p / CELLS).is_dir())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specsweep.archive",
        description="Render a committed record's cells with today's report, verifying each cell by its digest and "
        "the cell schema (docs/report.md, 'Archived records').",
    )
    parser.add_argument("records", nargs="*", type=Path, help="record folders (each with cells/)")
    parser.add_argument("--all", type=Path, metavar="FOLDER", help="every record directly under FOLDER")
    parser.add_argument("--out", type=Path, help="the PDF (one record only; default: RECORD/report.pdf)")
    parser.add_argument("--figures", type=Path, help="also every chart as a PNG under this folder (one record only)")
    parser.add_argument("--keep", type=Path, help="build in this folder and keep it: tables, report.tex, data/, logs")
    args = parser.parse_args(argv)
    records = list(args.records) + (records_under(args.all) if args.all else [])
    if not records:
        parser.error("name a record folder, or --all FOLDER")
    if len(records) > 1 and (args.out or args.figures or args.keep):
        parser.error("--out, --figures and --keep take one record")
    failed = []
    for record in records:
        try:
            print(f"{record}: {render(record, args.out, args.figures, args.keep)}")
        except (ArchiveError, ReportError) as exc:
            failed.append(record)
            print(f"archive: {exc}", file=sys.stderr)
    if failed:
        print(
            f"archive: {len(failed)} of {len(records)} record(s) not rendered: {', '.join(map(str, failed))}",
            file=sys.stderr,
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
