"""A committed GPU record rendered by today's report (python -m specsweep.archive, real LaTeX): its methods, the
renderer's stamp, and nothing past the text block."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO, assert_stamped, patience, pdf_text
from workflow.test_report import everything_fits_the_text_block

RECORD = REPO / "benchmarks" / "gpu" / "forced-moe-2026-12-02"  # 9 cells of three methods on one H200


def test_a_committed_record_renders_with_todays_report_and_the_renderers_stamp(tmp_path):
    pdf, work = tmp_path / "report.pdf", tmp_path / "work"
    subprocess.run(
        [sys.executable, "-m", "specsweep.archive", str(RECORD), "--out", str(pdf), "--keep", str(work)],
        check=True,
        timeout=patience(60),
    )
    text = pdf_text(pdf)
    assert "methods: ar, eagle3-chain-a2, eagle3-chain-a3." in text  # the cells' methods, AR first
    assert "EAGLE-3 at acceptance forced to 2 and 3 on one H200" in text  # the title record.yaml gives
    assert "cells measured 2026-12-02" in text and "NVIDIA H200" in text and "Qwen3-30B-A3B" in text
    assert_stamped(text)
    everything_fits_the_text_block(work / "report" / "report.log")
    assert not (RECORD / "report.tex").exists() and not (RECORD / "data").exists()  # the record gets a PDF alone
