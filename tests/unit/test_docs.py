"""The repository's own text: the documents it cites are in it, every name a doc page gives (a file, a module, a
configuration key, a command) exists, config/README.md is what the schema gives, and the pages count what the data
holds."""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from specsweep import algorithms, metrics, traces, workloads

TEXT = ["README.md", "Snakefile", "benchmarks", "config", "docs", "rules", "scripts", "specsweep", "tests", "tools"]
SUFFIXES = {".md", ".py", ".smk", ".yaml", ".rst", ".j2", ".sh", ".toml", ""}
# the pages a user reads: each name they give is checked against the checkout
PAGES = ["README.md", "config/README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))]
# folders of the checkout a page names files in (results/, logs/ and the like are what a run writes)
TRACKED = ("specsweep", "benchmarks", "tests", "tools", "config", "rules", "scripts", "docs", "profiles", "envs", ".ci")
README_LINES = 200
# packages that live in the servers' environment, not this one: a name in them (`sglang.launch_server`) is not
# checked, nor taken for a configuration key of the same first word
ELSEWHERE = ("sglang",)
# a file's name is not a dotted key or module (`plan.csv`, `metrics.py`)
FILE_NAME = re.compile(r".*\.(py|csv|md|tex|html|json|jsonl|yaml|parquet|pdf|png|sh|smk|txt|log|j2)")


def _docs_tool():
    """tools/docs.py, which writes the docs generated from the code."""
    spec = importlib.util.spec_from_file_location("docs_tool", REPO / "tools" / "docs.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["docs_tool"] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


docs_tool = _docs_tool()
SCHEMA = docs_tool.load_schema()
KEYS = docs_tool.paths(SCHEMA)
RULES = {
    m
    for f in [REPO / "Snakefile", *(REPO / "rules").glob("*.smk")]
    for m in re.findall(r"^(?:rule|checkpoint)\s+(\w+)\s*:", f.read_text(), re.M)
}


def test_every_document_cited_is_in_the_repository():
    held = {p.name for p in REPO.rglob("*.md") if ".git" not in p.parts}
    cited = {}
    for part in TEXT:
        root = REPO / part
        for path in [root] if root.is_file() else (p for p in root.rglob("*") if p.is_file()):
            if path.suffix in SUFFIXES and "__pycache__" not in path.parts:
                for name in re.findall(r"\b[A-Z][A-Z0-9_]*\.md\b", path.read_text(errors="replace")):
                    cited.setdefault(name, path.relative_to(REPO))
    assert "README.md" in cited
    missing = {name: str(where) for name, where in cited.items() if name not in held}
    assert not missing, f"cited but not in the repository: {missing}"


# ---------------------------------------------------------------------------------------------------------------
# stale names


def _segments(key: str) -> list[str]:
    """A key's segments, list indices written as [] and placeholders (<name>, <key>) as *."""
    key = re.sub(r"\[[^\]]*\]", "[]", key)
    return ["*" if re.fullmatch(r"<[^>]*>(\[\])?", s) else s for s in key.split(".")]


def is_key(key: str) -> bool:
    """Whether a configuration key path (``sim.calibration``, ``methods[i].name``, ``defaults.<algorithm>``) is one
    the schema has."""
    wanted = _segments(key)
    for known in KEYS:
        have = _segments(known)
        if len(have) == len(wanted) and all(a == b or "*" in (a, b) for a, b in zip(have, wanted)):
            return True
    return False


def resolves(dotted: str) -> bool:
    """Whether a dotted name (``specsweep.calibrate.fingerprint_digest``) is a module, or an attribute of one."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            node = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(node, attribute):
                try:
                    node = importlib.import_module(f"{node.__name__}.{attribute}")
                    continue
                except (ImportError, AttributeError):
                    return False
            node = getattr(node, attribute)
        return True
    return False


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(h) for h in re.findall(r"^#+ (.+)$", page.read_text(), re.M)}


def _code(text: str) -> list[tuple[int, str]]:
    """(line number, code) of every fenced block's line and every inline code span."""
    found, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced:
            found.append((number, line))
        else:
            found += [(number, span) for span in re.findall(r"`([^`]+)`", line)]
    return found


def _exists(path: str) -> bool:
    if re.search(r"[<{*]", path):
        pattern = re.sub(r"<[^>]*>|\{[^}]*\}", "*", path)
        return any(REPO.glob(pattern.rstrip("/")))
    return (REPO / path).exists()


def stale_names(page: Path, text: str) -> list[str]:
    """Every name a page gives that the checkout lacks, as 'page:line: what': a file (specsweep/..., tests/...,
    config/...; relative links from the page's folder, with their #anchors), a module (specsweep.x.y, or in
    backquotes x.y for a module of the package), a configuration key in backquotes (`sim.calibration`), a
    command's Snakemake target, --config key, python -m module or .venv tool."""
    where = page.relative_to(REPO)
    problems: list[str] = []
    lines = text.splitlines()
    tops = set(SCHEMA["properties"])
    package = {p.stem for p in (REPO / "specsweep").iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    for number, line in enumerate(lines, 1):
        for path in re.findall(rf"(?<![\w./~$-])((?:{'|'.join(re.escape(t) for t in TRACKED)})/[\w./<>*{{}}-]*)", line):
            path = path.rstrip(".,:;")
            if not _exists(path):
                problems.append(f"{where}:{number}: file {path}")
        for target in re.findall(r"\]\(([^)\s]+)\)", line):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            linked = (page.parent / file).resolve() if file else page
            if not linked.exists():
                problems.append(f"{where}:{number}: link {target}")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                problems.append(f"{where}:{number}: link {target} (no such heading)")
        for dotted in re.findall(r"(?<![\w./])specsweep(?:\.[A-Za-z_]\w*)+", line):
            if not resolves(dotted):
                problems.append(f"{where}:{number}: module {dotted}")
    for number, code in _code(text):
        span = code.strip()
        first = re.split(r"[.\[]", span, maxsplit=1)[0]
        dotted = re.fullmatch(r"[a-z_]\w*(\[[^\]]*\])?(\.(<[^>]+>|[A-Za-z_]\w*)(\[[^\]]*\])?)+", span)
        if dotted and not FILE_NAME.fullmatch(span) and not (first in ELSEWHERE and not is_key(span)):
            if first in tops and not is_key(span) and not (first in package and resolves(f"specsweep.{span}")):
                problems.append(f"{where}:{number}: configuration key {span}")
            elif first in package and first not in tops and not resolves(f"specsweep.{span}"):
                problems.append(f"{where}:{number}: module {span}")
        for target in re.findall(r"\bsnakemake\s+([A-Za-z_]\w*)(?=\s|$)", code) + re.findall(
            r"--forcerun\s+([A-Za-z_]\w*)", code
        ):
            if target not in RULES:
                problems.append(f"{where}:{number}: Snakemake target {target}")
        for key in re.findall(r"--config\s+['\"]?([A-Za-z_][\w.\[\]]*)=", code):
            if not is_key(key):
                problems.append(f"{where}:{number}: --config key {key}")
        for module in re.findall(r"\bpython3?\s+-m\s+([\w.]+)", code):  # specsweep's own: checked above
            top = module.split(".")[0]
            if top != "specsweep" and top not in ELSEWHERE and importlib.util.find_spec(module) is None:
                problems.append(f"{where}:{number}: python -m {module}")
        for tool in re.findall(r"\.venv/bin/(\w[\w-]*)", code):
            if not (Path(sys.executable).parent / tool).exists():
                problems.append(f"{where}:{number}: tool .venv/bin/{tool}")
    return problems


@pytest.mark.parametrize("page", PAGES)
def test_every_name_a_page_gives_exists(page):
    path = REPO / page
    problems = stale_names(path, path.read_text())
    assert not problems, "stale names (renamed or removed since the page was written):\n" + "\n".join(problems)


def test_the_stale_name_check_finds_each_kind_of_stale_name():
    page = REPO / "docs" / "example.md"
    text = "\n".join(
        [
            "Good: `specsweep/metrics.py`, specsweep.metrics.tpot, `sim.calibration`, `methods[i].name`,",
            "`defaults.<algorithm>`, `engines[1].sim.gpu`, `runs.off_the_main_thread`,",
            "[faults](faults.md#faults-and-bad-input).",
            "Stale: specsweep/nowhere.py, specsweep.metrics.nothing, `sim.calibrashun`, `runs.nothing`,",
            "[a](missing.md), [b](faults.md#no-such-heading)",
            "```bash",
            ".venv/bin/snakemake calibrate --config remeasure=x; .venv/bin/snakemake nosuchrule --config nokey=1",
            "python -m specsweep.sim; python -m nosuchmodule; bash tools/nosuch.sh; .venv/bin/nosuchtool",
            "```",
        ]
    )
    found = stale_names(page, text)
    assert [p.split(": ", 1)[1] for p in found] == [
        "file specsweep/nowhere.py",
        "module specsweep.metrics.nothing",
        "link missing.md",
        "link faults.md#no-such-heading (no such heading)",
        "file tools/nosuch.sh",
        "configuration key sim.calibrashun",
        "module runs.nothing",
        "Snakemake target nosuchrule",
        "--config key nokey",
        "python -m nosuchmodule",
        "tool .venv/bin/nosuchtool",
    ], found
    assert all(p.startswith("docs/example.md:") for p in found)


# ---------------------------------------------------------------------------------------------------------------
# the docs generated from the code


def test_config_readme_is_what_the_schema_gives():
    expected = docs_tool.render(SCHEMA)
    assert (REPO / "config" / "README.md").read_text() == expected, (
        f"config/README.md is stale (config/schema.yaml changed): run {docs_tool.COMMAND}"
    )


def test_every_list_of_the_algorithms_is_the_registrys():
    """config/schema.yaml's algorithm enum, drafter description, spelling and defaults keys, the cell schema's enum
    and docs/configuration.md's table are what tools/docs.py writes from the registry."""
    wanted = docs_tool.generated()
    for path in (docs_tool.SCHEMA, docs_tool.CELL_SCHEMA, docs_tool.CONFIG_PAGE):
        assert path.read_text() == wanted[path], (
            f"{path.relative_to(REPO)} is stale (the registry changed): run {docs_tool.COMMAND}"
        )


def test_an_algorithm_added_to_the_registry_reaches_every_list(monkeypatch):
    """A new entry is all a new algorithm needs: the generated lists take it, with its parameters' defaults keys as
    methods[] takes one value of each (less "uncapped", which is DDTree's), its drafter and its SGLang name."""
    medusa = replace(algorithms.EAGLE3, name="medusa", title="Medusa", sglang="MEDUSA", drafter_doc="Medusa heads")
    monkeypatch.setitem(algorithms.REGISTRY, "medusa", medusa)
    schema = yaml.safe_load(docs_tool.with_registry(docs_tool.SCHEMA.read_text()))
    method = schema["properties"]["methods"]["items"]["properties"]
    assert method["algorithm"]["enum"][-1] == "medusa" and "medusa (MEDUSA)" in method["algorithm"]["description"]
    assert "medusa (Medusa heads)" in method["drafter"]["description"]
    assert schema["properties"]["algorithms"]["properties"]["medusa"] == {"$ref": "#/$defs/spelling"}
    defaults = schema["properties"]["defaults"]["properties"]["medusa"]["properties"]
    assert list(defaults) == ["num_steps", "topk", "num_draft_tokens", "accept_length"]
    assert defaults["topk"] == {"type": "integer", "minimum": 1, "maximum": 32, "description": "As methods[].topk."}
    ddtree_topk = schema["properties"]["defaults"]["properties"]["ddtree"]["properties"]["topk"]
    assert {"const": "uncapped"} in ddtree_topk["oneOf"]
    cell = json.loads(docs_tool.with_cell_enum(docs_tool.CELL_SCHEMA.read_text()))
    assert cell["properties"]["method"]["properties"]["algorithm"]["enum"] == list(algorithms.REGISTRY)
    row = docs_tool.algorithm_table().splitlines()[-3]
    assert row.startswith("| `medusa` | `MEDUSA` | `num_steps` (3), `topk` (1), ") and "(Medusa heads)" in row


def test_the_metric_definitions_are_the_docstrings_the_report_prints():
    page = (REPO / "docs" / "metrics.md").read_text()
    assert page == docs_tool.with_definitions(page), (
        f"docs/metrics.md's definitions are stale (specsweep/metrics.py changed): run {docs_tool.COMMAND}"
    )
    listed = re.findall(r"^- `(\w+)`: ", page, re.M)
    assert listed == [name for name, _ in metrics.definitions() + metrics.statistics()]
    assert "- `tpot`: TPOT = (t_last - t_first) / (N - N_first)" in page


def test_every_configuration_key_is_described_and_listed():
    assert not docs_tool.undescribed(SCHEMA)
    text = (REPO / "config" / "README.md").read_text()
    listed = set(re.findall(r"^\| `([^`]+)` \|", text, re.M)) | set(re.findall(r"^## `([^`]+)`$", text, re.M))
    assert {k.path for k in docs_tool.keys(SCHEMA)} <= listed


def test_a_key_without_a_description_is_named():
    schema = docs_tool.load_schema()
    del schema["properties"]["server"]["properties"]["host"]["description"]
    del schema["$defs"]["spelling"]["properties"]["flags"]["description"]
    with pytest.raises(ValueError, match=r"no description for server\.host, <spelling>\.flags; describe each key"):
        docs_tool.render(schema)


# ---------------------------------------------------------------------------------------------------------------
# what the pages count


def test_the_readme_fits_in_a_few_screens():
    lines = len((REPO / "README.md").read_text().splitlines())
    assert lines <= README_LINES, f"README.md has {lines} lines; keep it to {README_LINES}, the rest goes in docs/"


def test_the_trace_text_table_gives_each_kinds_blocks_and_licences():
    """docs/workloads.md's table of the text trace prompts are filled with: each kind's blocks with the Qwen tokenizer
    (code's depend on the Python version's standard library: at least MIN_BLOCKS), and a licence for each source."""
    rows = {
        row.split(" | ")[0].strip("| "): row.split(" | ")
        for row in (REPO / "docs" / "workloads.md").read_text().splitlines()
        if row.startswith(("| chat |", "| math |", "| code |", "| JSON |"))
    }
    assert set(rows) == {"chat", "math", "code", "JSON"}
    for name, cells in rows.items():
        kind = name.lower()
        blocks = int(re.match(r"(\d+) \(", cells[3]).group(1))
        real = len(workloads._trace_corpus(kind, None).starts)
        assert blocks == real if kind != "code" else blocks >= traces.MIN_BLOCKS, (kind, blocks, real)
        assert len(cells[2].split("; ")) == len(cells[1].split("; ")), kind  # a licence for each source


def test_the_workload_tables_short_row_gives_the_size_of_each_prompt_pool():
    row = next(
        line for line in (REPO / "docs" / "workloads.md").read_text().splitlines() if line.startswith("| `short` |")
    )
    sizes = [int(n) for n in re.search(r"\| ([\d + ]+) prompts \|", row).group(1).split("+")]
    pools = [
        workloads.chat_prompts(),
        workloads.gsm8k_problems(),
        workloads.humaneval_problems(),
        workloads._bfcl_simple(),
    ]
    assert sizes == [len(pool) for pool in pools]
