"""The software and hardware environment a backend runs in, and what it can do.

``probe(backend)`` returns a JSON-able dict with versions, the hardware
inventory and the backend's capabilities (speculative algorithms and flags its
launcher accepts). Its ``identity`` part (what changes results: backend build,
versions, GPUs) is digested into every cell key, so a new server build makes
cached cells stale while timestamps do not.
"""

from __future__ import annotations

import importlib.metadata
import platform
import re
import shutil
import subprocess
import sys

from . import HARNESS_VERSION, __version__
from .canon import digest


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _run(argv: list[str], timeout: float = 60) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def gpu_inventory() -> list[dict]:
    """GPUs reported by nvidia-smi (empty without NVIDIA GPUs)."""
    if not shutil.which("nvidia-smi"):
        return []
    out = _run(["nvidia-smi", "--query-gpu=index,name,memory.total,driver_version", "--format=csv,noheader"])
    gpus = []
    for line in (out or "").strip().splitlines():
        index, name, memory, driver = [part.strip() for part in line.split(",")]
        gpus.append({"index": int(index), "name": name, "memory": memory, "driver": driver})
    return gpus


def capabilities_from_help(help_text: str) -> dict:
    """Speculative algorithms and flags a launcher's ``--help`` lists."""
    flags = sorted(set(re.findall(r"(--[a-z0-9][a-z0-9-]*)", help_text)))
    algorithms = []
    match = re.search(r"--speculative-algorithm\s+\{([^}]*)\}", help_text)
    if match:
        algorithms = [a.strip() for a in match.group(1).split(",")]
    else:
        algorithms = sorted(set(re.findall(r"\b(EAGLE3?|DFLASH|DDTREE|NEXTN|STANDALONE|NGRAM)\b", help_text)))
    return {"algorithms": algorithms, "flags": flags}


def probe(backend: str) -> dict:
    """Versions, hardware and capabilities of a backend on this host."""
    software = {
        "specsweep": __version__,
        "harness_version": HARNESS_VERSION,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "snakemake": _version("snakemake"),
        "aiohttp": _version("aiohttp"),
    }
    gpus = gpu_inventory()
    if backend == "sim":
        from .sim.server import parse_args  # noqa: F401  (the simulator's launcher is importable)
        help_text = _run([sys.executable, "-m", "specsweep.sim", "--help"]) or ""
        server = {"name": "specsweep-sim", "version": __version__, "simulated": True}
    else:
        for pkg in ("sglang", "torch", "flashinfer-python", "sgl-kernel"):
            software[pkg] = _version(pkg)
        help_text = _run([sys.executable, "-m", "sglang.launch_server", "--help"], timeout=300) or ""
        server = {"name": "sglang", "version": software.get("sglang"), "simulated": False}
    caps = capabilities_from_help(help_text)
    identity = {"backend": backend, "server": server, "gpus": [g["name"] for g in gpus],
                "python": software["python"]}
    return {
        "backend": backend,
        "simulated": backend == "sim",
        "server": server,
        "software": software,
        "hardware": {"gpus": gpus, "cpu_count": __import__("os").cpu_count(), "machine": platform.machine()},
        "capabilities": caps,
        "identity": identity,
        "identity_digest": digest(identity),
    }
