"""Launch commands against SGLang's own parser (on demand: bash tools/sglang-parser.sh).

Deselected in the default run (marker ``live``): it needs an SGLang installation,
given as SPECSWEEP_SGLANG_PYTHON. CI checks the same commands against the recorded
option table (test_sglang_backend.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

from conftest import REPO, validated
from specsweep.jobs import server_job, servers
from specsweep.launcher import launch_command
from specsweep.sglang_options import load_table


pytestmark = pytest.mark.live


@pytest.fixture(scope="module")
def sglang_python():
    python = os.environ.get("SPECSWEEP_SGLANG_PYTHON")
    if not python:
        pytest.fail("set SPECSWEEP_SGLANG_PYTHON to a Python with SGLang installed (bash tools/sglang-parser.sh does)")
    return python


def _parse(python, argvs, extra_flags):
    proc = subprocess.run(
        [python, str(REPO / "tools" / "sglang_parse.py")],
        input=json.dumps({"argv": argvs, "extra_flags": extra_flags}),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(proc.stdout)


def test_full_plan_commands_parse_with_sglangs_own_parser(sglang_python):
    config = validated(yaml.safe_load((REPO / "config" / "plan-full.yaml").read_text()))
    argvs = []
    for server in servers(config):
        argv, _ = launch_command(server_job(config, server["tp"], server["method"]), 30000, 40000)
        argvs.append(argv[3:])
    results = _parse(
        sglang_python,
        argvs + [["--model-path", "m", "--speculative-dflash-blocksize", "16"]],
        config["sglang"]["extra_flags"],
    )
    assert all(r["ok"] for r in results[:-1]), [r for r in results if not r["ok"]]
    assert not results[-1]["ok"]  # and the parser does reject a mistyped flag


def test_recorded_option_table_matches_the_installed_release(sglang_python):
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "table.json"
        subprocess.run([sglang_python, str(REPO / "tools" / "record_sglang_options.py"), str(out)], check=True)
        live = json.loads(out.read_text())
    recorded = load_table(live["sglang"])
    assert live == recorded
