"""Shared helpers: a copy of the workflow in a temporary folder, real Snakemake runs, process checks, validated
configurations, simulated servers and the timing stub on loopback.

Time limits. A test waits for events (a process's exit, a journal event, a job's state), never for a duration, and
each wait has a ceiling only so that a hang fails instead of blocking the suite: ``patience(s)``, where ``s`` is what
the step takes on an idle machine with some margin, times PATIENCE. The suite runs beside other work on two cores
(load averages of 4-6 seen), where a step takes several times as long; a limit that such a machine reaches tests the
machine. SPECSWEEP_TEST_PATIENCE sets the factor for a slower host. A timeout that is the behaviour under test (a
server never ready, a request that must time out) is not a ceiling and is not scaled; nor is the timeout of a single
HTTP call to a local server (requests': the longest silence between bytes, 10-60 s), which bounds a silence of
milliseconds, not a step.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import yaml

from specsweep import __version__
from specsweep import config as cfg
from specsweep.coerce import coerce_to_schema
from specsweep.launcher import Server, free_port
from specsweep.workloads import Session

REPO = Path(__file__).resolve().parents[1]
WORKFLOW_PARTS = ["Snakefile", "rules", "config", "scripts"]
PATIENCE = float(os.environ.get("SPECSWEEP_TEST_PATIENCE", "5"))


def patience(seconds: float) -> float:
    """The ceiling of a wait for a step that takes up to ``seconds`` on an idle machine: ``seconds`` x PATIENCE."""
    return seconds * PATIENCE


def copy_workflow(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for part in WORKFLOW_PARTS:
        src = REPO / part
        if src.is_dir():
            shutil.copytree(src, dest / part)
        else:
            shutil.copy2(src, dest / part)
    return dest


def write_config(workdir: Path, config: dict, name: str = "config/config.yaml") -> Path:
    path = workdir / name
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def load_default_config() -> dict:
    """config/config.yaml, its simulated servers counting prompt tokens with the word splitter (sim.tokenizer
    approximate: no tokenizer loaded in each server, for the tests of plumbing that start many)."""
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config.setdefault("sim", {})["tokenizer"] = "approximate"
    return config


# How many times fast the simulated servers' clock runs in tests of plumbing (cache, reruns, faults, reports, bad
# input, processes): their cells' figures are not read. Tests of timing, statistics and the client keep 1.
PLUMBING_CLOCK = 10.0


def fast_config(
    requests: int = 4, max_new_tokens: int = 48, startup: float = 0.1, time_scale: float = PLUMBING_CLOCK, **sim_faults
) -> dict:
    """A quick plan on the simulated backend: AR and DFlash, one short workload, concurrency 1 and 2, no warm-up, on
    a clock ``time_scale`` times fast (1 where a test races the servers' own pace)."""
    config = load_default_config()
    config["methods"] = [{"name": "ar", "algorithm": "ar"}, {"name": "dflash", "algorithm": "dflash"}]
    config["workloads"] = [{"name": "short", "family": "short", "requests": requests, "max_new_tokens": max_new_tokens}]
    config["concurrency"] = [1, 2]
    config["warmup"] = 0
    config["sim"] = {"startup_seconds": startup, "time_scale": time_scale, "faults": sim_faults}
    return config


def eight_gpu_host_config(workdir: Path) -> dict:
    """Twelve TP-1 servers (4 AR, 4 DFlash, 4 DDTree budgets) on a simulated 8-GPU host, one short cell each."""
    config = load_default_config()
    config["methods"] = (
        [{"name": f"ar-{x}", "algorithm": "ar"} for x in "abcd"]
        + [{"name": f"dflash-{x}", "algorithm": "dflash"} for x in "abcd"]
        + [{"name": "ddtree", "algorithm": "ddtree", "budget": [8, 16, 32, 64]}]
    )
    config["workloads"] = [{"name": "short", "family": "short", "requests": 12, "max_new_tokens": 256}]
    config["concurrency"] = [1]
    config["warmup"] = 0
    # a slower GPU profile: fewer, longer steps keep eight simulated servers light on two CPU cores
    config["sim"] = {"startup_seconds": 0.5, "gpu": "RTX-PRO-6000"}
    config["gpu_pool"] = {"devices": 8, "lock_dir": str(workdir / "locks")}
    return config


def snakemake(
    workdir: Path, *args: str, timeout: float = 180, check: bool = True, cores: int = 2
) -> subprocess.CompletedProcess:
    """Run real Snakemake in ``workdir``, stopped after ``patience(timeout)`` (``timeout``: what the run takes on an
    idle machine, with margin); its whole output is in ``.stdout``. A simulated server mostly waits out its modelled
    steps, so a run of several servers may ask for more cores than the machine has."""
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", str(cores), *args],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=patience(timeout),
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-8000:]}")
    return proc


class Journal:
    """Reads the servers' journals ({cache_dir}/journal/<server>/<run>.jsonl), new events only, in time order."""

    def __init__(self, workdir: Path, cache_dir: str | Path = "results/cache"):
        self.folder = workdir / cache_dir / "journal"
        self.offsets: dict[Path, int] = {}

    def new_events(self) -> list[dict]:
        events = []
        for path in sorted(self.folder.rglob("*.jsonl")) if self.folder.is_dir() else []:
            lines = path.read_text().splitlines()
            if lines and not path.read_text().endswith("\n"):
                lines = lines[:-1]  # a line still being written
            events += [json.loads(line) for line in lines[self.offsets.get(path, 0) :] if line.strip()]
            self.offsets[path] = len(lines)
        return sorted(events, key=lambda e: e["time"])


def server_processes_under(path: Path) -> list[psutil.Process]:
    """Simulated-server processes whose working folder is inside ``path``."""
    return [p for p in processes_started_in(path) if "specsweep.sim" in " ".join(p.info["cmdline"] or [])]


def processes_started_in(folder: Path) -> list[psutil.Process]:
    """Live processes (not zombies) working inside ``folder`` or naming a path in it on their command line: what a
    test started there (Snakemake, its jobs, SLURM batch scripts and job steps, scripts, servers). SLURM's daemons
    and job step managers work in the test process's folder and name none there."""
    inside = str(folder).rstrip(os.sep) + os.sep
    found = []
    for proc in psutil.process_iter(["cmdline", "cwd", "status"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            cwd = (proc.info["cwd"] or "") + os.sep
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if proc.info["status"] != psutil.STATUS_ZOMBIE and (cwd.startswith(inside) or inside in cmd):
            found.append(proc)
    return found


def assert_no_process_left(folder: Path, grace: float = 3.0) -> None:
    """Fail, naming them, if processes started in ``folder`` are still alive ``patience(grace)`` seconds from now
    (processes that are ending get that long); kill them first."""
    deadline = time.monotonic() + patience(grace)
    while (left := processes_started_in(folder)) and time.monotonic() < deadline:
        time.sleep(0.2)
    if not left:
        return
    described = []
    for proc in left:
        try:
            described.append(f"{proc.pid} (parent {proc.ppid()}): {' '.join(proc.cmdline())[:300]}")
            left += [child for child in proc.children(recursive=True) if child not in left]  # whatever they run
        except psutil.NoSuchProcess:
            pass
    for proc in left:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(left, timeout=patience(2))
    if described:
        pytest.fail("processes this test started outlived it (killed now):\n" + "\n".join(described))


@pytest.fixture(autouse=True)
def no_process_left(request):
    """Every workflow test (a test in tests/workflow or using the ``workflow`` fixture) fails if a process it
    started outlives it: Snakemake, its jobs, SLURM job steps, servers (``assert_no_process_left``)."""
    if request.node.path.parent.name != "workflow" and "workflow" not in request.fixturenames:
        yield
        return
    folder = request.getfixturevalue("tmp_path")
    yield
    assert_no_process_left(folder)


@pytest.fixture(autouse=True)
def host_temporary_folder(monkeypatch, tmp_path_factory):
    """A temporary folder of each test's own for what specsweep keeps host-wide (the GPU pool's locks, API-key
    files): tests running at once on one host (two test processes, two checkouts) never wait for each other's
    simulated GPUs. The processes a test starts inherit it (TMPDIR); a short path, as Unix sockets need. pytest's
    own temporary folders stay where they were (their base is fixed before TMPDIR changes)."""
    base = tmp_path_factory.getbasetemp()
    folder = tempfile.mkdtemp(prefix="specsweep-test-")
    monkeypatch.setenv("TMPDIR", folder)
    # token counts made by one test's processes serve the others of this run (never the user's own folder)
    monkeypatch.setenv("SPECSWEEP_TOKEN_COUNTS", str(base.parent / "token-counts"))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again in this process too
    yield Path(folder)
    monkeypatch.setattr(tempfile, "tempdir", None)
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(name="workflow")  # a global named workflow would make snakemake.utils.validate take it for its own
def workflow_copy(tmp_path):
    """A fresh copy of the workflow (``no_process_left`` fails the test if a process it started there lives on)."""
    return copy_workflow(tmp_path / "wf")


FIXTURES = REPO / "tests" / "fixtures"
SCHEMA = yaml.safe_load((REPO / "config" / "schema.yaml").read_text())


def validated(config: dict) -> dict:
    """Validate like the workflow does (snakemake.utils.validate fills defaults), then normalise."""
    from snakemake.utils import validate

    config = cfg.with_engine_sims(coerce_to_schema(copy.deepcopy(config), SCHEMA))
    validate(config, str(REPO / "config" / "schema.yaml"))
    return cfg.normalise(config)


def report_text(workflow: Path) -> str:
    """The workflow's report PDF as text (pdftotext), its whitespace runs made single spaces."""
    return pdf_text(workflow / "results" / "report" / "report.pdf")


def pdf_text(pdf: Path) -> str:
    """A PDF's text (pdftotext), its whitespace runs made single spaces."""
    text = subprocess.run(
        ["pdftotext", "-layout", str(pdf), "-"], capture_output=True, text=True, check=True, timeout=patience(12)
    ).stdout
    return " ".join(text.split())


def assert_stamped(text: str) -> None:
    """A report's text names the code that rendered it: specsweep's version and this checkout's commit, with
    "uncommitted changes" exactly where the package's files differ from it (as git says here)."""
    match = re.search(
        rf"Rendered by specsweep {re.escape(__version__)}, commit (\S+)( with uncommitted changes)?", text
    )
    assert match, "no renderer stamp in the report"
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert head.startswith(match.group(1).rsplit("-g", 1)[-1]), (match.group(1), head)
    status = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "specsweep"], capture_output=True)
    assert bool(match.group(2)) == bool(status.stdout.strip()), match.group(0)


def start_sim(tmp_path, *flags, startup=0.0, timeout=patience(12), model="Qwen/Qwen3-8B", env=None, headers=None):
    """The simulated server with SGLang's flags ``flags`` on a free loopback port, ready within ``timeout`` s
    (``headers``: what its readiness check sends, an API key's bearer header where ``--api-key`` is among the
    flags)."""
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "specsweep.sim",
        "--model-path",
        model,
        "--port",
        str(port),
        "--enable-metrics",
        "--sim-startup-seconds",
        str(startup),
        *flags,
    ]
    server = Server(argv, env or {}, "127.0.0.1", port, tmp_path / f"server-{port}.log", headers=headers)
    try:
        server.start(timeout)
    except BaseException:
        server.stop()
        raise
    return server


def pytest_collection_modifyitems(config, items):
    """Tests marked ``long(minutes)`` start first, the longest first, so that parallel test processes end together
    (a long test started last would run on alone); the others keep their order."""

    def minutes(item):
        mark = item.get_closest_marker("long")
        return mark.args[0] if mark else 0

    items.sort(key=minutes, reverse=True)


DFLASH = [
    "--speculative-algorithm",
    "DFLASH",
    "--speculative-draft-model-path",
    "d",
    "--speculative-dflash-block-size",
    "16",
]
DDTREE = [
    "--speculative-algorithm",
    "DDTREE",
    "--speculative-draft-model-path",
    "d",
    "--speculative-ddtree-budget",
    "32",
]


def start_stub(tmp_path, *flags):
    """The timing stub (tests/fixtures/timing_stub.py) on a free loopback port."""
    port = free_port()
    server = Server(
        [sys.executable, str(FIXTURES / "timing_stub.py"), "--port", str(port), *flags],
        {},
        "127.0.0.1",
        port,
        tmp_path / "stub.log",
    )
    server.start(patience(6))
    return server


def one(prompt="hello", max_new=64, followups=()):
    """One chat session."""
    return Session("s0", "chat", [{"role": "user", "content": prompt}], list(followups), max_new)
