"""A calibration under results/calibration/ through real Snakemake runs on the simulated backend: the plan, every
cell and the report's setup table say which cost model they used, per TP; changing it remeasures only its TP."""

from __future__ import annotations

import json

from calibrations import HOST, LABEL, environment_of, write_calibration
from conftest import fast_config, report_text, snakemake, write_config

# a TP size without a calibration: the default sim.runtime auto, on the H200 with Qwen3-8B the measured runtime
UNCALIBRATED = "not calibrated: measured runtime sglang-0.5.16-h200 (fitted to SGLang 0.5.16 measured on an H200)"


def test_plan_cells_and_report_say_which_cost_model_they_used(workflow):
    config = fast_config(requests=4, max_new_tokens=32)
    config["methods"] = [{"name": "ar", "algorithm": "ar"}]
    config["tp"] = [1, 2]
    write_config(workflow, config)
    folder = workflow / "results" / "calibration"
    write_calibration(folder, "tp1.yaml")  # the simulated H200, the model, TP 1
    write_calibration(folder, "tp2.yaml", tp=2, model="someone/other-model")  # another model: ignored
    snakemake(workflow, "plan", "results/report/report.pdf")

    md = (workflow / "results" / "plan" / "plan.md").read_text()
    assert f"- cost model, TP 1: {LABEL} (results/calibration/tp1.yaml; qwen3-8b on H200, calibrated-tp1 runtime)" in md
    assert f"- cost model, TP 2: {UNCALIBRATED} (qwen3-8b on H200, sglang-0.5.16-h200 runtime)" in md
    assert "results/calibration/tp2.yaml: model someone/other-model, not Qwen/Qwen3-8B or Qwen3-8B" in md
    for tp, label, runtime in ((1, LABEL, "calibrated-tp1"), (2, UNCALIBRATED, "sglang-0.5.16-h200")):
        for c in (1, 2):
            cell = json.loads((workflow / f"results/cells/tp{tp}/ar/short/c{c}.json").read_text())
            assert cell["simulated"] and cell["provenance"]["cost_model"] == label
            assert cell["provenance"]["sim_profile"]["runtime"] == runtime
    provenance = json.loads((workflow / "results" / "report" / "data.json").read_text())["csv"]["provenance.csv"]
    row = next(line for line in provenance.splitlines() if line.startswith("Cost model"))
    # as LaTeX typesets it: places to break, the per cent escaped, commas made semicolons (pgfplotstable's CSV)
    assert row.replace("\\allowbreak{}", "") == (
        f"Cost model,TP 1: measured on NVIDIA H200 on 2026-12-01; largest deviation 4.2\\%; TP 2: {UNCALIBRATED}"
    )
    assert "measured on NVIDIA H200 on 2026-12-01; largest deviation 4.2%" in report_text(workflow)

    # the roofline forced: TP 1's cells are other cells now, TP 2's are the same
    config["sim"]["calibration"] = "none"
    write_config(workflow, config)
    dry = snakemake(workflow, "-n", "results/summary.csv").stdout
    assert "wildcards: tp=1, method=ar" in dry and "tp=2" not in dry


def test_the_plan_on_sglang_matches_this_hosts_environment_record(workflow):
    """`snakemake plan` on SGLang: the calibration whose fingerprint is the recorded host's prices the servers, the
    first server on each of the two one-GPU hosts starts cold and the third warm; a record of another driver makes
    it the roofline again, the plan saying why."""
    config = fast_config(requests=4, max_new_tokens=32)
    config["backend"] = "sglang"
    config["methods"] = [{"name": m, "algorithm": "ar"} for m in ("a", "b", "c")]
    config["gpu_pool"] = {"devices": 2}
    write_config(workflow, config)
    write_calibration(workflow / "results" / "calibration", "tp1.yaml")
    record = workflow / "results" / "env" / "sglang.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({**environment_of(HOST), "identity_digest": "not-in-the-cache"}))
    snakemake(workflow, "plan", cores=1)
    md = (workflow / "results" / "plan" / "plan.md").read_text()
    assert f"- cost model, TP 1: {LABEL} (results/calibration/tp1.yaml" in md
    assert "GPUs: 2, on hosts of 1 (from gpu_pool.devices)" in md
    assert md.count("| cold 153 s |") == 2 and md.count("| warm 63 s |") == 1

    record.write_text(json.dumps({**environment_of({**HOST, "driver": "550.1"}), "identity_digest": "x"}))
    snakemake(workflow, "plan", cores=1)
    md = (workflow / "results" / "plan" / "plan.md").read_text()
    assert f"- cost model, TP 1: {UNCALIBRATED} (qwen3-8b on H200, sglang-0.5.16-h200 runtime)" in md
    assert "results/calibration/tp1.yaml: driver 570.86.15, not this host's 550.1" in md
    assert "start-up, TP 1: not measured:" in md and "| cold" not in md
