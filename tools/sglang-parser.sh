#!/usr/bin/env bash
# The live-parser check, on demand (heavy: SGLang 0.5.23 with a CPU build of torch, ~2.5 GB):
# builds .venv-sglang, then parses every launch command of config/plan-full.yaml with
# SGLang's own parser and compares its option table with the recorded one.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
if [ ! -x .venv-sglang/bin/python ]; then
    python3.11 -m venv .venv-sglang
fi
if ! .venv-sglang/bin/python -c "import sglang.srt.server_args" 2>/dev/null; then
    .venv-sglang/bin/pip install -q torch==2.13.0
    .venv-sglang/bin/pip install -q --no-deps sglang==0.5.23
    # what importing sglang.srt.server_args and launch_server --help needs
    .venv-sglang/bin/pip install -q numpy orjson psutil pybase64 requests triton packaging pillow starlette \
        msgspec pydantic pyzmq tqdm ipython aiohttp huggingface_hub
fi
SPECSWEEP_SGLANG_PYTHON="$PWD/.venv-sglang/bin/python" exec .venv/bin/python -m pytest -m live tests/unit/test_sglang_live.py "$@"
