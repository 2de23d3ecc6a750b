"""backend external in a real Snakemake run: servers the test starts itself (simulated SGLang servers on 127.0.0.1)
measured at their URLs; specsweep starts and stops none of them, records what each says it is and keys its cells by
that; a server that is not what its method says stops the run before any cell, naming it."""

from __future__ import annotations

import json

from conftest import Journal, fast_config, pdf_text, snakemake, start_sim, write_config

DFLASH_B16 = [
    "--speculative-algorithm",
    "DFLASH",
    "--speculative-draft-model-path",
    "z-lab/Qwen3-8B-DFlash-b16",
    "--speculative-dflash-block-size",
    "16",
]
KEY = "ext-s3cret-0417"  # the servers' API key: sent as a bearer token, written into no file
FAST = ["--sim-time-scale", "10", "--sim-tokenizer", "approximate", "--api-key", KEY]
AUTH = {"Authorization": f"Bearer {KEY}"}


def config_for(urls: dict) -> dict:
    config = fast_config(requests=4, max_new_tokens=32)
    config["backend"] = "external"
    config["concurrency"] = [1]
    config.pop("sim")  # nothing simulated is started: the servers are the test's
    config["methods"] = [{"name": m, "algorithm": m, "url": url, "api_key_env": "EXT_KEY"} for m, url in urls.items()]
    return config


def files_holding(folder, text: str) -> list[str]:
    """Every file under ``folder`` whose bytes hold ``text``."""
    return [str(p) for p in folder.rglob("*") if p.is_file() and text.encode() in p.read_bytes()]


def test_external_servers_are_measured_as_they_are_and_left_running(workflow, tmp_path, monkeypatch):
    monkeypatch.setenv("EXT_KEY", KEY)
    servers = {
        "ar": start_sim(tmp_path, *FAST, headers=AUTH),
        "dflash": start_sim(tmp_path, *FAST, *DFLASH_B16, headers=AUTH),
    }
    try:
        write_config(workflow, config_for({m: s.url for m, s in servers.items()}))
        plan = snakemake(workflow, "plan", timeout=60)
        assert "does not price start-ups" in (workflow / "results/plan/plan.md").read_text(), plan.stdout[-2000:]
        journal = Journal(workflow)
        snakemake(workflow, "results/report/report.pdf", timeout=240)
        report = pdf_text(workflow / "results/report/report.pdf")
        assert "SIMULATED" in report  # the servers measured are simulated ones: the report says so
        words = " ".join(report.split())
        # the provenance names the servers' engine and says their GPUs are not reported (never the client's)
        at = words.find("not reported by the external servers")
        assert at >= 0 and "specsweep-sim" in words[at - 300 : at + 300], words[words.find("Software and hardware") :][
            :1500
        ]
        assert "a host whose GPUs" not in words and "Server external" not in words
        for method, server in servers.items():
            assert server.alive(), f"the {method} server was stopped by the run"
            cell = json.loads((workflow / f"results/cells/tp1/{method}/short/c1.json").read_text())
            described = cell["provenance"]["server"]
            assert described["external"] is True and described["description"]["port"] == server.port
            assert cell["simulated"] is True  # the servers are simulated ones and say so: so do their cells
            assert cell["provenance"]["startup_seconds"] is None
            assert cell["provenance"]["gpus"] == []  # the client's GPUs ran nothing of it
            assert len(cell["requests"]) == 4 and all(r["error"] is None for r in cell["requests"])
        assert not files_holding(workflow, KEY)  # the key is in no cell, journal, log, table or report
        record = json.loads((workflow / "results/env/external.json").read_text())
        assert record["servers"]["tp1/dflash"]["description"]["speculative_algorithm"] == "DFLASH"
        starts = [e for e in journal.new_events() if e["event"] == "server_start"]
        assert len(starts) == 2 and all(e["external"] for e in starts)
        # the DFlash server relaunched on another port with the same build and settings: its cells stay cached
        servers["dflash"].stop()
        servers["dflash"] = start_sim(tmp_path, *FAST, *DFLASH_B16, headers=AUTH)
        write_config(workflow, config_for({m: s.url for m, s in servers.items()}))
        snakemake(workflow, "results/summary.csv", timeout=120)
        events = [e["event"] for e in journal.new_events()]
        assert events.count("cache_hit") == 2 and "measured" not in events, events
        # a server that is not what its method says stops the run, naming the method and the field
        write_config(workflow, config_for({"ar": servers["dflash"].url, "dflash": servers["dflash"].url}))
        proc = snakemake(workflow, "results/summary.csv", timeout=120, check=False)
        assert proc.returncode != 0
        assert "method 'ar'" in proc.stdout and "speculative_algorithm: declared None, served 'DFLASH'" in proc.stdout
    finally:
        for server in servers.values():
            server.stop()
