"""The simulated SGLang-compatible server: ``python -m specsweep.sim`` with SGLang's launch flags (``args``), a
continuous-batching engine that waits out the model's steps (``engine``) and SGLang's HTTP API over it (``api``).
Every response says ``simulated``."""

from __future__ import annotations

import signal
import sys
import time

from aiohttp import web

from .api import build_app
from .args import decoding_from_args, parse_args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print(
        f"specsweep simulated SGLang server (SIMULATED, no GPU): {args.sim_model_profile} on "
        f"{args.sim_gpu} x{args.tp_size}, {decoding_from_args(args).describe()}"
        + (f", clock {args.sim_time_scale:g}x fast" if args.sim_time_scale != 1 else ""),
        flush=True,
    )
    if args.sim_unmodelled_flags:
        print(f"declared build flags, accepted and not modelled: {', '.join(args.sim_unmodelled_flags)}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    time.sleep(args.sim_startup_seconds / args.sim_time_scale)  # model load
    if args.sim_crash_at_start:
        raise SystemExit("fault: ImportError while loading the model (--sim-crash-at-start)")
    web.run_app(
        build_app(args),
        host=args.host,
        port=args.port,
        print=None,
        access_log=None,
        handle_signals=True,
        shutdown_timeout=1.0,
    )
