#!/usr/bin/env bash
# The main job: set up if needed, then run the workflow (default: config/config.yaml,
# simulated backend, ending with results/report/report.pdf). Extra arguments go to snakemake.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
exec .venv/bin/snakemake --cores "${CORES:-2}" "$@"
