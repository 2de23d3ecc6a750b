#!/usr/bin/env bash
# The tests: set up if needed, then run the whole test suite (real servers on
# 127.0.0.1, real Snakemake runs, real LaTeX). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
exec .venv/bin/python -m pytest -ra "$@"
