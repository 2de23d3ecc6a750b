#!/usr/bin/env bash
# Time the default workflow run in a fresh temporary copy of the workflow.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/tools/setup.sh"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cp -r "$root/Snakefile" "$root/rules" "$root/config" "$root/scripts" "$work/"
cd "$work"
start=$(date +%s.%N)
"$root/.venv/bin/snakemake" --cores 2 --quiet >/dev/null
end=$(date +%s.%N)
echo "default workflow: $(echo "$end - $start" | bc) s wall"
