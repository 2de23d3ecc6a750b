"""The repository's own text: the documents it cites are in it, and the README counts what the data holds."""

from __future__ import annotations

import re

from conftest import REPO
from specsweep import workloads

TEXT = ["README.md", "Snakefile", "benchmarks", "config", "rules", "scripts", "specsweep", "tests", "tools"]
SUFFIXES = {".md", ".py", ".smk", ".yaml", ".rst", ".j2", ".sh", ".toml", ""}


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


def test_the_readmes_workload_table_gives_the_size_of_each_prompt_pool():
    row = next(line for line in (REPO / "README.md").read_text().splitlines() if line.startswith("| `short` |"))
    sizes = [int(n) for n in re.search(r"\| ([\d + ]+) prompts \|", row).group(1).split("+")]
    pools = [
        workloads.chat_prompts(),
        workloads.gsm8k_problems(),
        workloads.humaneval_problems(),
        workloads._bfcl_simple(),
    ]
    assert sizes == [len(pool) for pool in pools]
