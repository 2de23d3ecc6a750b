"""What keys a cell, and what reaches its server: real Snakemake runs on the simulated backend (and on the sglang
backend through a stand-in interpreter whose SGLang is the simulated server).

A cell's key holds what changes its numbers and nothing else: what the configuration sets in a server's environment
(a variable the shell exports that would change decoding is refused), an engine's build by its content, not the
engine's name or where its interpreter lies.
"""

from __future__ import annotations

import json
import shutil
import sys

import pandas as pd

from conftest import FIXTURES, Journal, fast_config, server_processes_under, snakemake, write_config

CELL = "results/cells/tp1/{method}/short/c{c}.json"


def cell_json(workflow, method, c=1) -> dict:
    return json.loads((workflow / CELL.format(method=method, c=c)).read_text())


def events_of(journal: Journal) -> list[str]:
    return [e["event"] for e in journal.new_events()]


def test_a_decoding_variable_from_the_shell_is_refused_and_from_the_configuration_it_keys_the_cell(
    workflow, monkeypatch
):
    """SGLANG_DDTREE_DEPTH_BONUS=-3 and SGLANG_DDTREE_MAX_TOPK=1 exported moved a DDTree cell's acceptance under the
    same key: now the run stops before any job, naming them and where to set them; set in the configuration, each
    gives the cell another key and the acceptance the server runs with."""
    config = fast_config(requests=8, max_new_tokens=128)
    config["methods"] = [{"name": "tree", "algorithm": "ddtree", "budget": 32, "topk": "uncapped"}]
    config["concurrency"] = [1]
    write_config(workflow, config)
    monkeypatch.setenv("SGLANG_DDTREE_DEPTH_BONUS", "-3")
    monkeypatch.setenv("SGLANG_DDTREE_MAX_TOPK", "1")
    proc = snakemake(workflow, "results/summary.csv", check=False)
    assert proc.returncode != 0
    assert "Invalid environment: the environment specsweep runs in sets SGLANG_DDTREE_DEPTH_BONUS='-3', " in proc.stdout
    assert "SGLANG_DDTREE_MAX_TOPK='1'" in proc.stdout
    assert "server.env (every server) or a method's env (methods[].env)" in proc.stdout
    assert not (workflow / "results").exists()  # no job ran
    monkeypatch.delenv("SGLANG_DDTREE_DEPTH_BONUS")
    monkeypatch.delenv("SGLANG_DDTREE_MAX_TOPK")

    journal = Journal(workflow)
    acceptance, keys = {}, {}
    settings = {
        "configured": {},
        "depth bonus -3": {"env": {"SGLANG_DDTREE_DEPTH_BONUS": "-3"}},
        "top-k 1": {"topk": 1},
    }
    for label, change in settings.items():
        config["methods"] = [{"name": "tree", "algorithm": "ddtree", "budget": 32, "topk": "uncapped", **change}]
        write_config(workflow, config)
        snakemake(workflow, "results/summary.csv")
        assert events_of(journal).count("measured") == 1, label  # another key: measured, not copied
        cell = cell_json(workflow, "tree")
        keys[label] = cell["key"]
        row = pd.read_csv(workflow / "results" / "summary.csv").iloc[0]
        acceptance[label] = (row["acceptance_length"], row["tree_width"])
        assert cell["method"]["env"] == (
            {"SGLANG_DDTREE_MAX_TOPK": "1"} if label == "top-k 1" else change.get("env", {})
        )
    assert len(set(keys.values())) == 3
    # the variables act as the configuration sets them: the depth bonus reshapes the tree, the cap narrows it
    assert acceptance["depth bonus -3"][0] != acceptance["configured"][0]
    assert acceptance["depth bonus -3"][1] == acceptance["configured"][1] == 3  # budget 32: width 32 // 15 + 1
    assert acceptance["top-k 1"][1] == 1 and acceptance["top-k 1"][0] != acceptance["configured"][0]


def test_a_renamed_engine_or_a_one_engine_block_finds_its_cells_by_key_under_its_own_name(workflow):
    """A measured plan wrapped in a one-engine `engines` block, then that engine renamed: no cell is measured again
    and no server starts; each cell is presented under the new name (its file, identity, method and engine) and
    aggregates. A tampered entry is still refused by name, and only its cell is measured again."""
    config = fast_config()
    write_config(workflow, config)
    snakemake(workflow, "results/summary.csv")
    journal = Journal(workflow)
    assert events_of(journal).count("measured") == 4
    plain = {(m, c): cell_json(workflow, m, c)["key"] for m in ("ar", "dflash") for c in (1, 2)}

    for engine in ("h200", "h200-node7"):
        config["engines"] = [{"name": engine}]
        write_config(workflow, config)
        snakemake(workflow, "results/summary.csv")
        assert events_of(journal) == ["cache_hit"] * 4, engine  # no server_start, nothing measured
        for (method, c), key in plain.items():
            cell = cell_json(workflow, f"{method}@{engine}", c)
            assert cell["key"] == key and cell["cell"]["method"] == f"{method}@{engine}"
            assert cell["method"]["name"] == f"{method}@{engine}" and cell["method"]["engine"] == engine
        summary = pd.read_csv(workflow / "results" / "summary.csv")
        assert set(summary["engine"]) == {engine} and len(summary) == 4  # aggregation verified each as it is now

    # tampered: an ar entry's record edited (its digest no longer matches), then the engine renamed again
    entry = workflow / "results" / "cache" / plain[("ar", 1)][:2] / f"{plain[('ar', 1)]}.json"
    tampered = json.loads(entry.read_text())
    tampered["requests"][0]["output_tokens"] += 1
    entry.write_text(json.dumps(tampered))
    config["engines"] = [{"name": "renamed-again"}]
    write_config(workflow, config)
    snakemake(workflow, "results/summary.csv")
    events = journal.new_events()
    assert [e["cell"] for e in events if e["event"] == "measured"] == [CELL.format(method="ar@renamed-again", c=1)]
    assert sum(e["event"] == "cache_hit" for e in events) == 3
    refused = [e for e in events if e["event"] == "cache_refused"]
    assert len(refused) == 1 and refused[0]["reason"].startswith("its content does not match its digest")
    log = (workflow / "logs" / "bench" / "tp1-ar@renamed-again.log").read_text()
    assert f"cache entry results/cache/{plain[('ar', 1)][:2]}/{plain[('ar', 1)]}.json" in log
    assert server_processes_under(workflow) == []


def stand_in_build(folder, version="0.5.23"):
    """An interpreter with SGLang <version> (the fixtures' stand-in, whose SGLang server is the simulated one) in
    ``folder``: a copy of tests/fixtures, as a virtual environment of the build would be."""
    shutil.copytree(FIXTURES, folder)
    probe = folder / "fake_sglang_python.sh"
    probe.write_text(probe.read_text().replace('"sglang": "0.5.23"', f'"sglang": "{version}"'))
    return str(folder / "sglang_via_sim.sh")


def test_a_moved_environment_of_one_build_measures_nothing_and_another_build_measures_again(
    workflow, tmp_path, monkeypatch
):
    """backend sglang: the build's interpreter moved to another folder and its label changed (sglang.python,
    sglang.build): the environment is probed again and every cell comes from the cache under the same key, no
    server started; an interpreter of another SGLang version measures every cell again."""
    monkeypatch.setenv("SPECSWEEP_PYTHON", sys.executable)  # the stand-in's own interpreter, passed by pass_env
    config = fast_config(requests=4, max_new_tokens=16, time_scale=1)
    config["backend"] = "sglang"
    config["model"]["path"] = "Qwen/Qwen3-8B"
    config["methods"] = [{"name": "ar", "algorithm": "ar"}]
    config["server"] = {"pass_env": ["SPECSWEEP_PYTHON"]}
    journal = Journal(workflow)
    keys = {}
    builds = [
        ("first", stand_in_build(tmp_path / "envs" / "a"), "ours", 2),
        ("moved", stand_in_build(tmp_path / "elsewhere" / "b"), "ours, renamed", 0),
        ("another", stand_in_build(tmp_path / "envs" / "c", version="0.5.24"), "ours", 2),
    ]
    for label, python, build, measured in builds:
        config["sglang"] = {"python": python, "build": build}
        write_config(workflow, config)
        snakemake(workflow, "results/summary.csv")
        events = events_of(journal)
        assert events.count("measured") == measured and events.count("server_start") == min(measured, 1), label
        assert events.count("cache_hit") == 2 - measured, label
        record = json.loads((workflow / "results" / "env" / "sglang.json").read_text())
        assert record["server"]["python"] == python and record["server"]["build"] == build
        keys[label] = [cell_json(workflow, "ar", c)["key"] for c in (1, 2)]
    assert keys["moved"] == keys["first"] and not set(keys["another"]) & set(keys["first"])
    assert cell_json(workflow, "ar")["provenance"]["host_environment"]["SPECSWEEP_PYTHON"] == sys.executable
    assert server_processes_under(workflow) == []
