#!/usr/bin/env bash
# Time the whole test suite (the CI command) while other processes keep cores busy: BUSY_CORES of them (default 2,
# both cores of the reference machine: the tests' time limits must hold there). Set-up is done first and not timed.
# Extra arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
bash tools/setup.sh
busy=()
trap 'kill "${busy[@]}" 2>/dev/null' EXIT
for _ in $(seq "${BUSY_CORES:-2}"); do
    python3 -c "while True: pass" &
    busy+=($!)
done
start=$(date +%s)
rc=0
bash tools/test.sh "$@" || rc=$?
echo "test suite with ${#busy[@]} core(s) busy: $(( $(date +%s) - start )) s wall, exit $rc"
exit $rc
