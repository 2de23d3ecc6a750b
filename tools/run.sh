#!/usr/bin/env bash
# The main job: set up if needed, then run the workflow (default: config/config.yaml,
# simulated backend, ending with results/report/report.pdf). Extra arguments go to snakemake.
# On a host with NVIDIA GPUs, Snakemake's `gpu` resource is set to their number.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
resources=()
if command -v nvidia-smi >/dev/null 2>&1; then
    resources=(--resources "gpu=$(nvidia-smi -L | grep -c '^GPU')")
fi
exec .venv/bin/snakemake --cores "${CORES:-2}" "${resources[@]}" "$@"
