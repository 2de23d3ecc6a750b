#!/usr/bin/env bash
# The tests: set up if needed, then run the whole test suite (real servers on
# 127.0.0.1, real Snakemake runs, real LaTeX). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
# A one-node SLURM cluster for tests/workflow/test_slurm.py (Debian packages; skipped, and said so, without root and apt)
SLURM_PACKAGES="slurmctld slurmd slurm-client munge"
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null \
   && { ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null \
        || ! command -v sbatch >/dev/null; }; then
    echo "specsweep tests: installing SLURM ($SLURM_PACKAGES)" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $SLURM_PACKAGES >/dev/null
fi
# pdftotext and pdftoppm (Debian's poppler-utils): the tests read the report PDF's text with them
if ! command -v pdftotext >/dev/null; then
    echo "specsweep tests: installing poppler-utils (pdftotext, which the report tests read the PDF with)" >&2
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends poppler-utils >/dev/null
fi
# Static types first (mypy over specsweep/, configured in pyproject.toml): a type error stops the run here, its
# file and line printed above, before the tests start.
if ! .venv/bin/python -m mypy; then
    echo "specsweep tests: mypy found type errors in specsweep/ (listed above); fix them before the tests run" >&2
    exit 1
fi
# The formatter (ruff format, 120 columns, configured in pyproject.toml): code it would change stops the run here,
# the files named above; `.venv/bin/ruff format` rewrites them. Then ruff check: no line over 120 columns.
if ! .venv/bin/ruff format --check --quiet; then
    echo "specsweep tests: the files above are not formatted; run .venv/bin/ruff format, then run the tests" >&2
    exit 1
fi
if ! .venv/bin/ruff check --quiet; then
    echo "specsweep tests: the lines above are longer than 120 columns; shorten them, then run the tests" >&2
    exit 1
fi
# Four test processes (pytest-xdist) on two cores: the suite is bound by CPU (about 730 CPU-seconds: Snakemake
# runs, server jobs, simulated servers, LaTeX) and a test's processes wait in turn, so more processes fill the
# waits (with one core busy: 552 s with two, 499-518 s with three, 477 s with four; benchmarks/README.md).
# SPECSWEEP_TEST_WORKERS sets the number (0: the tests in this process). --dist loadgroup hands the tests out one
# at a time as a process frees, in the order tests/conftest.py sets: the tests that take minutes first.
exec .venv/bin/python -m pytest -ra -n "${SPECSWEEP_TEST_WORKERS:-4}" --dist loadgroup "$@"
