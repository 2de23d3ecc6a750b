#!/usr/bin/env bash
# The GPU record's steps, run on the lent GPU machine from the repository root (see README.md here):
#   bash benchmarks/gpu/device.sh install-a|install-b|install-c|install-0514|install-d|calibrate|check|cells|fault|compare|tp2|spec|spec-verdict|trees|engines|steps|stage|stage-c|forced|forced-moe|ddtree-options|ddtree
# install-a/-b/check install SGLang 0.5.16 from the staged payload (.gpu-payload, .gpu-tools: the GPU recipe)
# and specsweep's own wheels (.whl); `check` then records SGLang's option table and runs the workflow on
# config/gpu-check.yaml (AR and DFlash side by side through the GPU pool); `fault` kills a server mid-cell
# (SIGKILL) and reruns; `compare [ARGS]` runs SGLang's own client beside specsweep's (ARGS go to
# compare_bench_serving.py); `tp2` one TP-2 server; `spec METHOD...` runs config/gpu-spec.yaml's cells of those
# methods (every speculative algorithm; call it again with the others, the cache keeps what is done; an argument
# results/... is a target as it is, e.g. results/summary.csv once every cell is there); `trees SPEC...`
# times NGRAM and EAGLE-3 tree rounds with step_costs.py. `calibrate` (after install-a, -b) runs `snakemake calibrate`
# at TP 1 (calibrate.yaml over gpu-check.yaml; a results/cache/calibration carried in is reused shape by shape); `cells [--cold] METHOD...` runs check's cells of those methods
# (--cold: the kernel caches cleared first, a fresh host again), a call each: the cache keeps what is done.
# COLD=1 before `ddtree` or `forced`: the compile caches cleared first, their sizes before and after to $OUT; `forced
# METHOD...` measures those methods' cells only. Everything each step produces goes to $OUT (results as tarballs). On a fresh machine `install-c` stands in
# for `check` when only `compare` or `tp2` is to run.
set -u
step=$1
here=$(pwd)
export PYTHONPATH=/tmp/site:$here/.gpu-tools/stubs:$here PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
# targets first: --configfile takes every word after it
# (the greedy scheduler: Snakemake's ILP scheduler needs PuLP, which does not travel)
# ($LIMIT: a command put before it, such as `timeout 540`)
snake() { $LIMIT python3 -m snakemake "$@" --cores 8 --resources gpu="$GPUS" --scheduler greedy --configfile $CONFIG $OVERLAY; }
LIMIT=""
# part c of the recipe, then specsweep's own wheels, into the same site folder
# (with the tracked tree at about 31 MiB, c and .whl no longer fit one carry: `install-c` then `wheels`, a call each,
# where install_c finds no .whl)
install_c() {
  [ -d /tmp/site/sglang ] && [ ! -d .gpu-payload/c ] || bash .gpu-tools/install.sh c .gpu-payload || exit 3
  wheels
}
wheels() {
  ls .whl/*.whl >/dev/null 2>&1 || return 0
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 4
}
CONFIG=config/gpu-check.yaml
OVERLAY=""
TABLE=specsweep/data/sglang-0.5.16-options.json
restore_table() { [ -f $TABLE ] || cp .specsweep/sglang-0.5.16-options.json $TABLE; }
LEVELS="1 4 16"
cells() { for w in short long; do for c in $LEVELS; do echo "results/cells/tp1/$1/$w/c$c.json"; done; done; }
pack() { tar czf "$OUT/$1.tgz" results/env results/cells results/failed results/runs results/cache/journal results/summary.csv \
           logs .snakemake/log 2>/dev/null; ls -la "$OUT"; }
# the kernel and compilation caches a first server fills (triton's JIT kernels, torch's inductor, FlashInfer's JIT)
CACHES="$HOME/.triton /tmp/torchinductor_$(id -un) $HOME/.cache/flashinfer $HOME/.cache/torch_extensions"
caches() { du -sh $CACHES 2>&1; }
# COLD=1 before a step: those caches cleared first, as on a fresh host (their sizes before and after the step to $OUT)
cold_start() { [ "${COLD:-}" = 1 ] || return 0; caches > "$OUT/compile-caches-before.txt"; rm -rf $CACHES; }
cold_end() { [ "${COLD:-}" = 1 ] || return 0; caches > "$OUT/compile-caches-after.txt"; }
gpu_apps() { nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader; }
# join every file cut into parts (NAME.part<i>-of-<n>, stage_pieces.sh) in folder $1 whose n parts are all there
join_parts() {
  for first in "$1"/*.part1-of-*; do
    [ -e "$first" ] || continue
    name=${first%.part1-of-*}; n=${first##*-of-}
    [ "$(ls "$name".part*-of-"$n" | wc -l)" -eq "$n" ] || continue
    for i in $(seq 1 "$n"); do cat "$name.part$i-of-$n"; done > "$name.joining" && mv "$name.joining" "$name" \
      && rm "$name".part*-of-"$n" && echo "joined $(basename "$name")"
  done
}
case $step in
  install-a|install-b)
    bash .gpu-tools/install.sh "${step#install-}" .gpu-payload ;;
  wheels)  # specsweep's own wheels (.whl) into the recipe's site folder, a call of their own after install-c
    wheels ;;
  stage)  # `stage pN`: a piece of stage_pieces.sh into /tmp/stage, where install.sh b finds it (README.md, "Staging");
    # a file cut into parts (NAME.part<i>-of-<n>) is joined once its n parts are there
    mkdir -p /tmp/stage && cp .gpu-payload/"$2"/* /tmp/stage/ || exit 2
    join_parts /tmp/stage ;;
  stage-c)  # `stage-c cI`: a part of transformers (part c) into /tmp/payload-c/c, joined once all are there; then
    # `bash .gpu-tools/install.sh c /tmp/payload-c` installs it (nothing to carry)
    mkdir -p /tmp/payload-c/c && cp .gpu-payload/"$2"/* /tmp/payload-c/c/ || exit 2
    join_parts /tmp/payload-c/c ;;
  install-c)  # c and specsweep's wheels only (check does the same, then runs the workflow)
    install_c
    mkdir -p .specsweep && cp $TABLE .specsweep/ ;;
  calibrate)  # install c and the wheels, then `snakemake calibrate` at TP 1 (AR and DFlash: calibrate.yaml)
    install_c
    mkdir -p .specsweep && cp $TABLE .specsweep/
    nvidia-smi > "$OUT/nvidia-smi.txt"; date -u +%FT%TZ > "$OUT/started"
    OVERLAY=benchmarks/gpu/calibrate.yaml
    # a hard stop below the session's device time left (CAL_LIMIT s): the servers are stopped, what was measured packed
    LIMIT="timeout ${CAL_LIMIT:-540}"
    snake calibrate results/env/sglang.json > "$OUT/calibrate.log" 2>&1
    echo "snakemake exit $?" >> "$OUT/calibrate.log"; tail -8 "$OUT/calibrate.log"
    caches > "$OUT/compile-caches.txt"; gpu_apps > "$OUT/gpu-apps-after.txt"
    tar czf "$OUT/calibrate.tgz" results/env results/calibration results/cache/calibration logs .snakemake/log 2>/dev/null
    ls -la "$OUT" ;;
  cells)  # `cells [--cold] METHOD...`: check's cells of those methods (a call each: the cache keeps what is done);
    # --cold first clears the kernel caches the first server on a host fills, so that its server starts as on a fresh host
    restore_table
    shift; [ "${1:-}" = --cold ] && { COLD=1 cold_start; shift; }
    date -u +%FT%TZ >> "$OUT/started"
    targets=""; for m in "$@"; do targets="$targets $(cells $m)"; done
    snake $targets results/env/sglang.json > "$OUT/check-$1.log" 2>&1
    echo "snakemake exit $?" >> "$OUT/check-$1.log"; tail -5 "$OUT/check-$1.log"
    gpu_apps > "$OUT/gpu-apps-after.txt"; pack "check-$1" ;;
  check)
    install_c
    mkdir -p .specsweep
    python3 tools/record_sglang_options.py $TABLE "$OUT/sglang-0.5.16-help.txt" && cp $TABLE "$OUT/" && cp $TABLE .specsweep/
    nvidia-smi > "$OUT/nvidia-smi.txt"; date -u +%FT%TZ > "$OUT/started"
    snake $(cells ar) $(cells dflash) results/env/sglang.json > "$OUT/check.log" 2>&1
    echo "snakemake exit $?" >> "$OUT/check.log"; tail -5 "$OUT/check.log"
    gpu_apps > "$OUT/gpu-apps-after.txt"; pack check ;;
  fault)
    restore_table
    targets="$(cells dflash-sglang-delay)"
    snake $targets > "$OUT/fault-run.log" 2>&1 &
    sm=$!
    # SIGKILL the server once two of its cells are measured, mid-way through the third
    for i in $(seq 1 600); do
      n=$(cat results/cache/journal/*.jsonl 2>/dev/null | grep -c '"event":"measured".*dflash-sglang-delay' 2>/dev/null)
      [ "${n:-0}" -ge 2 ] && break; sleep 1
    done
    sleep 4
    pgrep -af "sglang.launch_server" > "$OUT/killed.txt"; pkill -KILL -f "sglang.launch_server"
    date -u +%FT%TZ >> "$OUT/killed.txt"
    wait $sm; echo "snakemake exit $?" >> "$OUT/fault-run.log"
    sleep 3
    { echo "compute apps on the GPUs after the failed job:"; gpu_apps; echo "sglang processes:";
      pgrep -af "sglang" || echo none; } > "$OUT/after-kill.txt"
    find results/failed -name '*.json' -exec cp {} "$OUT/failed-cell.json" \;
    snake $targets results/summary.csv > "$OUT/fault-rerun.log" 2>&1
    echo "snakemake exit $?" >> "$OUT/fault-rerun.log"; tail -3 "$OUT/fault-rerun.log"
    gpu_apps > "$OUT/gpu-apps-after.txt"; pack fault ;;
  compare)
    restore_table
    python3 benchmarks/gpu/compare_bench_serving.py "$OUT/compare" "${@:2}" > "$OUT/compare.log" 2>&1
    echo "exit $?" >> "$OUT/compare.log"; tail -8 "$OUT/compare.log"
    tar czf "$OUT/compare.tgz" -C "$OUT" compare && rm -rf "$OUT/compare" ;;
  spec)
    restore_table
    CONFIG=config/gpu-spec.yaml; LEVELS="1 4 16 64"
    targets=""; for m in "${@:2}"; do case $m in results/*) targets="$targets $m" ;; *) targets="$targets $(cells $m)" ;; esac; done
    date -u +%FT%TZ >> "$OUT/started"; nvidia-smi > "$OUT/nvidia-smi.txt"
    LIMIT="timeout ${SPEC_LIMIT:-540}"  # a hard stop below the call's limit: call again, the cache keeps what is done
    snake $targets results/env/sglang.json > "$OUT/spec.log" 2>&1
    echo "snakemake exit $?" >> "$OUT/spec.log"; tail -5 "$OUT/spec.log"
    gpu_apps > "$OUT/gpu-apps-after.txt"; pack spec ;;
  spec-verdict)  # config/gpu-spec.yaml under budget: verdict (verdict.yaml), every cell to results/summary.csv; call it
    # again after a time limit (SPEC_LIMIT s): the cache keeps what is done
    restore_table
    CONFIG=config/gpu-spec.yaml; OVERLAY=benchmarks/gpu/verdict.yaml
    date -u +%FT%TZ >> "$OUT/started"; nvidia-smi > "$OUT/nvidia-smi.txt"
    LIMIT="timeout ${SPEC_LIMIT:-540}"
    snake results/summary.csv results/env/sglang.json > "$OUT/spec-verdict.log" 2>&1
    echo "snakemake exit $?" >> "$OUT/spec-verdict.log"; tail -5 "$OUT/spec-verdict.log"
    gpu_apps > "$OUT/gpu-apps-after.txt"; pack spec-verdict ;;
  forced|forced-moe)  # `forced` / `forced-moe` (after install-c): acceptance forced on EAGLE-3 (forced.yaml over
    # gpu-spec.yaml; forced-moe.yaml over both: Qwen3-30B-A3B's shape), every cell of the overlay, AR beside; call it
    # again after a time limit (FORCED_LIMIT s): the cache keeps what is done
    restore_table
    CONFIG=config/gpu-spec.yaml; OVERLAY=benchmarks/gpu/forced.yaml
    if [ "$step" = forced-moe ]; then
      OVERLAY="$OVERLAY benchmarks/gpu/forced-moe.yaml"
      mkdir -p /tmp/qwen3-30b-a3b /tmp/eagle3-qwen3-30b-a3b
      cp benchmarks/gpu/models/qwen3-30b-a3b.config.json /tmp/qwen3-30b-a3b/config.json
      cp benchmarks/gpu/models/eagle3-qwen3-30b-a3b.config.json /tmp/eagle3-qwen3-30b-a3b/config.json
      for d in qwen3-30b-a3b eagle3-qwen3-30b-a3b; do cp /tmp/qwen3-8b/tokenizer* /tmp/$d/; done
    fi
    date -u +%FT%TZ >> "$OUT/started"; nvidia-smi > "$OUT/nvidia-smi.txt"
    LIMIT="timeout ${FORCED_LIMIT:-540}"
    # METHOD... after the step: those methods' cells only (e.g. eagle3-tree-a2), else every cell
    targets="results/summary.csv"
    levels="1 4 16 64"; [ "$step" = forced-moe ] && levels="1 4 16"  # forced-moe.yaml's concurrency
    [ $# -gt 1 ] && targets="$(for m in "${@:2}"; do for c in $levels; do echo "results/cells/tp1/$m/short/c$c.json"; done; done)"
    cold_start
    snake $targets results/env/sglang.json > "$OUT/$step.log" 2>&1
    echo "snakemake exit $?" >> "$OUT/$step.log"; tail -5 "$OUT/$step.log"; cold_end
    gpu_apps > "$OUT/gpu-apps-after.txt"; pack "$step" ;;
  trees)
    restore_table
    python3 benchmarks/gpu/step_costs.py trees "$OUT/trees" "${@:2}" --prompts 1024 8192 > "$OUT/trees.log" 2>&1
    echo "exit $?" >> "$OUT/trees.log"; tail -12 "$OUT/trees.log"
    tar czf "$OUT/trees.tgz" -C "$OUT" trees && rm -rf "$OUT/trees" ;;
  install-0514)  # `install-0514 d1|d2` (after install-c; carry .gpu-payload/d1, then optionally d2): SGLang 0.5.14
    # into its own site folder /tmp/site-0514 (sglang-kernel 0.4.4 slim, flashinfer 0.6.12, transformers 5.8.1; d2 the
    # pins 0.5.14 differs in: xgrammar 0.2.1 with apache-tvm-ffi 0.1.9, openai-harmony, soundfile, blobfile); the
    # interpreter wrapper /tmp/py-0514 puts it first on PYTHONPATH
    # a wheel too large for one carry travels as pieces (split -d: NAME.part-00 here, the others staged before by
    # `stage`): joined again before the install
    P=.gpu-payload/$2; mkdir -p /tmp/site-0514
    for f in "$P"/*.part-00; do [ -e "$f" ] || continue; w=$(basename "${f%.part-00}")
      cat "$f" /tmp/stage/"$w".part-0[1-9] > "$P/$w" || exit 5; rm "$f"; done
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site-0514 \
      "$P"/*.whl || exit 5
    [ -f "$P/kernel-slim.tgz" ] && tar xzf "$P/kernel-slim.tgz" -C /tmp/site-0514
    printf '#!/bin/sh\nPYTHONPATH=/tmp/site-0514:$PYTHONPATH exec python3 "$@"\n' > /tmp/py-0514; chmod +x /tmp/py-0514
    /tmp/py-0514 -c "import sglang, sgl_kernel, flashinfer, transformers; print('sglang', sglang.__version__, \
      'transformers', transformers.__version__)" ;;
  engines)  # `engines [TARGET...]` (after install-c and install-0514): the workflow on engines.yaml over gpu-check.yaml
    # (default targets: AR's short cells at concurrency 1 on both releases)
    restore_table
    OVERLAY=benchmarks/gpu/engines.yaml
    targets="${*:2}"
    [ -n "$targets" ] || targets="$(for e in sglang-0.5.16 sglang-0.5.14; do for c in 1; do
      echo "results/cells/tp1/ar@$e/short/c$c.json"; done; done)"
    date -u +%FT%TZ >> "$OUT/started"; nvidia-smi > "$OUT/nvidia-smi.txt"
    LIMIT="timeout ${ENGINES_LIMIT:-480}"
    snake $targets > "$OUT/engines.log" 2>&1
    echo "snakemake exit $?" >> "$OUT/engines.log"; tail -5 "$OUT/engines.log"
    gpu_apps > "$OUT/gpu-apps-after.txt"; pack engines ;;
  steps)  # `steps NAME STEP [ARGS...]` (after install-c): step_costs.py STEP into $OUT/NAME, e.g.
    # `steps moe-ar dflash 1 --model benchmarks/gpu/models/qwen3-30b-a3b.config.json`
    restore_table
    python3 benchmarks/gpu/step_costs.py "$3" "$OUT/$2" "${@:4}" > "$OUT/$2.log" 2>&1
    echo "exit $?" >> "$OUT/$2.log"; tail -12 "$OUT/$2.log"
    gpu_apps > "$OUT/gpu-apps-after.txt"
    tar czf "$OUT/$2.tgz" -C "$OUT" "$2" && rm -rf "${OUT:?}/$2" ;;
  install-d)  # (after install-c; carry .gpu-payload/d, staged by ../shared/gpu/stage-ddtree.sh): the DDTree build
    # (github.com/Rancy-Wang/sglang ddtree-v2) into /tmp/site-ddtree by the recipe's install.sh d, then its own
    # distribution record there, so that the environment record names it (its version label and the commit of
    # .gpu-payload/d/commit.txt, as pip records a git install) and not 0.5.16's wheel behind it; the interpreter
    # wrapper /tmp/py-ddtree puts it first on PYTHONPATH (config/gpu-ddtree.yaml's engine ddtree-v2)
    bash .gpu-tools/install.sh d .gpu-payload || exit 6
    commit=$(cat .gpu-payload/d/commit.txt); short=${commit:0:7}
    version="0.0.0.dev20260719+ddtree.v2.g$short"
    dist=/tmp/site-ddtree/sglang-$version.dist-info; mkdir -p "$dist"
    printf 'Metadata-Version: 2.1\nName: sglang\nVersion: %s\n' "$version" > "$dist/METADATA"
    printf '{"url": "https://github.com/Rancy-Wang/sglang", "subdirectory": "python", "vcs_info": {"vcs": "git", "requested_revision": "ddtree-v2", "commit_id": "%s"}}\n' "$commit" > "$dist/direct_url.json"
    printf 'sglang\n' > "$dist/top_level.txt"; : > "$dist/RECORD"
    printf '#!/bin/sh\nPYTHONPATH=/tmp/site-ddtree:$PYTHONPATH exec python3 "$@"\n' > /tmp/py-ddtree; chmod +x /tmp/py-ddtree
    SGLANG_ENABLE_JIT_DEEPGEMM=0 /tmp/py-ddtree -c "import importlib.metadata as m, sglang; \
      from sglang.srt.speculative import ddtree_worker_v2; print('sglang', m.version('sglang'), sglang.__file__)" ;;
  ddtree-options)  # (after install-d) the DDTree build's launch option table and --help, recorded as a release's
    # are (tools/record_sglang_options.py), to $OUT: commit them as specsweep/data/sglang-ddtree-v2-<commit>-options.json
    # and point config/gpu-ddtree.yaml's engine at it (options_table) in place of 0.5.16's table and extra_flags
    restore_table
    short=$(cut -c1-7 .gpu-payload/d/commit.txt 2>/dev/null || echo unknown)
    SGLANG_ENABLE_JIT_DEEPGEMM=0 /tmp/py-ddtree tools/record_sglang_options.py \
      "$OUT/sglang-ddtree-v2-$short-options.json" "$OUT/sglang-ddtree-v2-$short-help.txt" > "$OUT/ddtree-options.log" 2>&1
    echo "exit $?" >> "$OUT/ddtree-options.log"; tail -3 "$OUT/ddtree-options.log"
    /tmp/py-ddtree -c "import importlib.metadata as m; print(m.version('sglang'))" >> "$OUT/ddtree-options.log" ;;
  ddtree)  # `ddtree METHOD...` (after install-c and install-d): config/gpu-ddtree.yaml's cells of those methods
    # (e.g. ddtree-b15@ddtree-v2 dflash@sglang-0.5.16; an argument results/... is a target as it is), with a hard
    # stop below the call's limit (DDTREE_LIMIT s): call again, the cache keeps what is done; the stage profiler's
    # records (results/ddtree-profile/) travel with the cells
    restore_table
    CONFIG=config/gpu-ddtree.yaml; LEVELS="1 4 16 64"
    targets=""; for m in "${@:2}"; do case $m in results/*) targets="$targets $m" ;; *) targets="$targets $(cells $m)" ;; esac; done
    date -u +%FT%TZ >> "$OUT/started"; nvidia-smi > "$OUT/nvidia-smi.txt"
    LIMIT="timeout ${DDTREE_LIMIT:-540}"; cold_start
    snake $targets > "$OUT/ddtree.log" 2>&1  # each cell needs its engine's environment record (results/env/sglang@*)
    echo "snakemake exit $?" >> "$OUT/ddtree.log"; tail -5 "$OUT/ddtree.log"; cold_end
    gpu_apps > "$OUT/gpu-apps-after.txt"
    tar czf "$OUT/ddtree-profile.tgz" results/ddtree-profile 2>/dev/null; pack ddtree ;;
  tp2)
    restore_table
    OVERLAY=benchmarks/gpu/tp2.yaml
    snake results/cells/tp2/ar/short/c1.json results/cells/tp2/ar/short/c16.json > "$OUT/tp2.log" 2>&1
    echo "snakemake exit $?" >> "$OUT/tp2.log"; tail -5 "$OUT/tp2.log"
    gpu_apps > "$OUT/gpu-apps-after.txt"; pack tp2 ;;
esac
