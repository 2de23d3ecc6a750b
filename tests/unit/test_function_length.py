"""No function of the package is longer than LIMIT lines (from its ``def`` to its last line, docstring included)
unless its docstring says why, with LONG_BECAUSE and the reason: a long function is split where a part has a name."""

from __future__ import annotations

import ast

from conftest import REPO

PACKAGE = REPO / "specsweep"
LIMIT = 60
LONG_BECAUSE = "Long because"


def unexplained_long_functions(package=PACKAGE, limit: int = LIMIT) -> list[str]:
    """Every function (methods and nested functions too) over ``limit`` lines whose docstring does not give a reason
    after LONG_BECAUSE, as "path:line name (n lines)"."""
    out = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            lines = node.end_lineno - node.lineno + 1
            docstring = " ".join((ast.get_docstring(node) or "").split())
            reason = docstring.partition(LONG_BECAUSE)[2].strip(" .")
            if lines > limit and not reason:
                out.append(f"{path.relative_to(package.parent)}:{node.lineno} {node.name} ({lines} lines)")
    return out


def test_the_check_finds_a_long_function_without_its_reason(tmp_path):
    package = tmp_path / "specsweep"
    package.mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(5))
    (package / "a.py").write_text(
        f'def long():\n    """Counts."""\n{body}'
        f'def explained():\n    """Counts. Long because each count is one line."""\n{body}'
        f'def short():\n    """Counts. Long because"""\n    return 1\n'
        f'async def bare():\n    """Long because."""\n{body}'
    )
    assert unexplained_long_functions(package, limit=6) == [
        "specsweep/a.py:1 long (7 lines)",
        "specsweep/a.py:18 bare (7 lines)",
    ]


def test_no_function_over_the_limit_without_its_reason():
    found = unexplained_long_functions()
    assert not found, (
        f"functions over {LIMIT} lines whose docstring gives no reason: split each where a part has a name, or say "
        f"'{LONG_BECAUSE} <reason>' in its docstring:\n" + "\n".join(found)
    )
