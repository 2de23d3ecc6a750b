"""Servers: launch command per backend and method, and the process lifecycle.

The launch command is an argument list built from configuration, never a
shell string. The simulated backend takes SGLang's flags, so one builder
serves both: only the module differs (``sglang.launch_server`` or
``specsweep.sim``) plus the ``--sim-*`` profile flags.

Lifecycle: start in a new process group with output to a log file; wait for
``/health_generate`` while checking the process is alive; stop with SIGTERM to
the group, then SIGKILL, always. ``start_server`` starts a server job's server
(server_job.ServerJob) on a free port, as the bench jobs and a calibration do.
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil
import requests

from . import algorithms
from .environment import offered_flags
from .server_job import ServerJob
from .sglang_options import DECODING_PREFIX, choose_flags, decoding_variable, known_flags
from .text import approximate_tokens, chat_prompt

SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD")

# What a server is given from the host it starts on, whatever the configuration says: what the platform needs to run
# it (a name ending in * stands for every name it begins). Nothing else of the host's environment reaches a server:
# the configuration sets what decides its numbers (server.env, a method's env, which the cells' keys hold) and names
# anything more the host must pass (server.pass_env).
PLATFORM_ENV = (
    "PATH",
    "PYTHONPATH",  # selects the server's build where it is installed beside another (a GPU host's site folder)
    "PYTHONUNBUFFERED",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LANGUAGE",
    "LC_*",
    "TZ",
    "TMPDIR",
    "TMP",
    "TEMP",
    "XDG_CACHE_HOME",
    "SPECSWEEP_TOKEN_COUNTS",  # specsweep's token counts (the simulated server counts prompts with them)
    "LD_LIBRARY_PATH",
    "CUDA_*",
    "NVIDIA_*",
    "NCCL_*",
    # NVLink multicast switched off where a host requires it (a program that uses it can take shared GPUs out of
    # service): NCCL's (NCCL_* holds it too; named for what it is), PyTorch's symmetric memory's and NVSHMEM's
    "NCCL_NVLS_ENABLE",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST",
    "NVSHMEM_DISABLE_NVLS",
    "TORCH_CUDA_ARCH_LIST",
    "TRITON_CACHE_DIR",
    "TORCHINDUCTOR_CACHE_DIR",
    "HF_*",
    "TRANSFORMERS_CACHE",
    "TRANSFORMERS_OFFLINE",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "CONDA_PREFIX",
    "VIRTUAL_ENV",
)


def platform_variable(name: str) -> bool:
    """Whether a variable is one of the platform's (PLATFORM_ENV), passed from the host to every server."""
    return any(name.startswith(entry[:-1]) if entry.endswith("*") else name == entry for entry in PLATFORM_ENV)


def check_host_environment(host: Mapping[str, str] | None = None) -> None:
    """Refuse a variable that changes decoding (decoding_variable) set in the environment specsweep runs in.

    A server never sees it (servers start from ``host_environment``), and a measurement must never depend on what
    a shell exported, which no cell key holds: the configuration sets such a variable, under server.env or a
    method's env, where its value enters the cells' keys."""
    host = os.environ if host is None else host
    found = sorted(name for name in host if decoding_variable(name))
    if found:
        them = "them" if len(found) > 1 else "it"
        raise ServerError(
            "the environment specsweep runs in sets "
            + ", ".join(f"{name}={host[name]!r}" for name in found)
            + f", which SGLang or a DDTree build reads to change how it decodes. Servers start without the shell's "
            f"{DECODING_PREFIX}* variables and a cell's key holds only what the configuration sets, so set {them} "
            f"in the configuration instead: server.env (every server) or a method's env (methods[].env). Then unset "
            f"{them} here: unset {' '.join(found)}"
        )


def host_environment(pass_env: Sequence[str] = (), host: Mapping[str, str] | None = None) -> dict:
    """What a server is given from the host: the platform's variables (PLATFORM_ENV) and those the configuration
    names (server.pass_env), as the host sets them; refused (check_host_environment) where the host sets a
    variable that changes decoding."""
    host = os.environ if host is None else host
    check_host_environment(host)
    named = set(pass_env)
    return {name: value for name, value in host.items() if name in named or platform_variable(name)}


class ServerError(RuntimeError):
    """A server failed to start, to become ready, or died; the message quotes its log."""


# SGLang 0.5.14 opens its gRPC server at the HTTP port + 10000 unless SGLANG_GRPC_PORT says otherwise, and refuses
# to start past 65535: a server's port is kept at or below this
HIGHEST_PORT = 65535 - 10000


def free_port(host: str = "127.0.0.1") -> int:
    """A port no one listens on now, at most HIGHEST_PORT: one the system offers (its ephemeral range), else one
    drawn at random from 20000 up."""
    for attempt in range(64):
        with socket.socket() as s:
            s.bind((host, 0 if attempt < 32 else random.randint(20000, HIGHEST_PORT)))
            port = s.getsockname()[1]
        if port <= HIGHEST_PORT:
            return port
    raise OSError(f"no free port at or below {HIGHEST_PORT} on {host}")


def _offered(flags: set[str], *names: str) -> str | None:
    """The first of ``names`` (newest spelling first) that the build offers, or None."""
    return next((name for name in names if name in flags), None)


def server_arguments(job: ServerJob, port: int, max_context: int, offered: set[str] | None = None) -> list[str]:
    """SGLang launch arguments for one server (both backends take them), sized for its cells.

    Flag names are chosen from ``offered``, the flags of the build that will run (its probed ``--help``),
    or from the recorded option table when no build is at hand. --max-running-requests and the CUDA-graph
    batch limit are at least the highest concurrency of the server's cells, --context-length at least the
    longest prompt plus output; metrics are on; the native stream is incremental where the build offers it;
    OpenAI protocols get --enable-cache-report (else SGLang reports no cached tokens); dummy weights load for
    target and drafter; the min-free-slots delay follows server.min_free_slots_delay; then the method's and
    the global flags.
    """
    method, server, model = job.method, job.server, job.model
    if offered is None:
        offered = known_flags(job.sglang["options_table"], job.sglang["extra_flags"])
    concurrency = max(job.concurrency)
    argv = [
        "--model-path",
        model.get("path") or model["name"],
        "--tp-size",
        str(job.tp),
        "--host",
        server["host"],
        "--port",
        str(port),
        "--max-running-requests",
        str(concurrency),
    ]
    graph_bs = _offered(offered, "--cuda-graph-max-bs-decode", "--cuda-graph-max-bs")
    if graph_bs:
        argv += [graph_bs, str(concurrency)]
    argv += ["--context-length", str(max_context), "--enable-metrics", "--random-seed", str(job.seed)]
    if model.get("load_format") == "dummy":
        argv += ["--load-format", "dummy"]
        if algorithms.get(method["algorithm"]).drafter:
            argv += [_required(offered, "--speculative-draft-load-format", "model.load_format: dummy"), "dummy"]
    protocol = job.load["protocol"]
    if protocol == "native":
        incremental = _offered(offered, "--incremental-streaming-output", "--stream-output")
        if incremental:
            argv.append(incremental)
    elif "--enable-cache-report" in offered:
        argv.append("--enable-cache-report")
    delay = min_free_slots_delay(job)
    if delay != "sglang":
        if "--min-free-slots-delay" in offered:
            argv += ["--min-free-slots-delay", "0" if delay == "disabled" else str(delay)]
        elif delay != "disabled":  # a build without the delay has nothing to disable
            _required(offered, "--min-free-slots-delay", "server.min_free_slots_delay")
    return argv + choose_flags(list(method["flags"]) + list(server["flags"]), offered)


def min_free_slots_delay(job: ServerJob) -> str | int:
    """The method's min-free-slots delay setting, else the server's (disabled, sglang or a slot count)."""
    return job.method.get("min_free_slots_delay") or job.server.get("min_free_slots_delay", "disabled")


def _required(offered: set[str], flag: str, key: str) -> str:
    if flag not in offered:
        raise ServerError(f"{key} needs {flag}, which this SGLang build does not offer; change {key} or the build")
    return flag


def stream_mode(argv: list[str], protocol: str) -> str:
    """How the stream carries text: OpenAI deltas, SGLang's incremental segments, or the cumulative text."""
    if protocol != "native":
        return "deltas"
    return "incremental" if {"--incremental-streaming-output", "--stream-output"} & set(argv) else "cumulative"


def launch_command(
    job: ServerJob, port: int, max_context: int, python: str | None = None, offered: set[str] | None = None
) -> tuple[list[str], dict]:
    """(argv, extra environment) for one server from its job (jobs.server_job)."""
    python = python or sys.executable
    args = server_arguments(job, port, max_context, offered)
    if job.backend == "sglang":
        argv = [python, "-m", "sglang.launch_server", *args]
    else:
        sim = job.sim
        if sim is None:
            raise ServerError(f"server {job.name}: the simulated backend needs the job's simulator profile (sim)")
        argv = [
            python,
            "-m",
            "specsweep.sim",
            *args,
            "--sim-gpu",
            sim["gpu"],
            "--sim-model-profile",
            sim["model_profile"],
            "--sim-runtime",
            sim["runtime"],
            "--sim-startup-seconds",
            str(sim["startup_seconds"]),
            "--sim-time-scale",
            str(sim["time_scale"]),
            "--sim-tokenizer",
            sim.get("tokenizer", "model"),
        ]
        if algorithms.get(job.method["algorithm"]).drafting == "draft-model":
            argv += ["--sim-draft-model-profile", sim.get("draft_model_profile", "qwen3-0.6b")]
        if sim.get("profiles"):
            argv += ["--sim-profiles", json.dumps(sim["profiles"], sort_keys=True)]
        if sim.get("acceptance"):
            argv += ["--sim-acceptance", json.dumps(sim["acceptance"], sort_keys=True)]
        for extra in job.sglang["extra_flags"]:
            argv.append(f"--sim-accept-flag={extra['flag']}:{extra.get('type', 'str')}")
        if sim.get("ddtree_builds"):
            argv += ["--sim-ddtree-builds", json.dumps(sim["ddtree_builds"], sort_keys=True)]
        if job.method["params"].get("tree_build"):
            argv += ["--sim-ddtree-build", job.method["params"]["tree_build"]]
        for fault, value in sorted((sim.get("faults") or {}).items()):
            flag = f"--sim-{fault.replace('_', '-')}"
            if value is True:
                argv.append(flag)
            elif value is not False:
                argv += [flag, str(value)]
    env = {**job.server["env"], **job.method["env"]}
    return argv, env


def _max_context(job: ServerJob, sessions_by_workload: dict) -> int:
    """--context-length: the model's (every workload was checked to fit); the simulator, whose tokenizer is
    approximate, gets room for its own count of the longest session."""
    if job.backend == "sglang":
        return job.model["context_length"]
    longest = 0
    for name, sessions in sessions_by_workload.items():
        for s in sessions:
            text = chat_prompt(s.messages + s.followups)
            longest = max(longest, approximate_tokens(text) + s.max_new_tokens * (1 + len(s.followups)))
    return max(job.model["context_length"], int(longest * 1.25))


def start_server(
    job: ServerJob,
    sessions: dict,
    environment: dict,
    log_path: Path,
    gpus,
    extra_args: list[str],
    headers: dict,
    attempts: int = 3,
    first_port: int | None = None,
):
    """Start the server on a free port; if the port was taken meanwhile, try another (up to ``attempts``)."""
    host = job.server["host"]
    context = _max_context(job, sessions)
    # the probed build's flags, else (no probe) the recorded table
    offered = offered_flags(environment, job.sglang["extra_flags"])
    for attempt in range(attempts):
        port = first_port if (first_port and attempt == 0) else free_port(host)
        argv, env = launch_command(job, port, context, environment.get("python"), offered)
        if offered:
            unknown = [a for a in argv if a.startswith("--") and a.split("=")[0] not in offered]
            if unknown:
                raise ServerError(
                    f"the installed {environment['backend']} build does not offer {', '.join(unknown)} "
                    f"(checked against its --help); fix the flags (server.flags, the method's flags or "
                    "the algorithms spelling) or install a build that has them"
                )
        argv += extra_args
        server = Server(argv, env, host, port, log_path, gpus, headers, job.server.get("pass_env", ()))
        try:
            server.start(job.server["startup_timeout"])
            return server, argv, env
        except ServerError as exc:
            server.stop()
            taken = "address already in use" in str(exc).lower() or "errno 98" in str(exc).lower()
            if not taken or attempt == attempts - 1:
                raise
            print(f"port {port} was taken; retrying on another port", file=sys.stderr, flush=True)
    raise AssertionError("unreachable")


class ApiKeyFile:
    """The server's API key, read from the environment variable ``env_name``, for the server and the client.

    The key goes to the server in a private YAML file passed with --config (SGLang reads launch options from it
    at start), never on the command line where `ps` shows it; the client sends it as a bearer token (``headers``).
    The file lives in a folder of this process's own (``secrets_folder``), is removed as soon as the server is
    ready (``remove``) and on every way out of the block this process runs code on (an error, SIGTERM, Ctrl-C);
    what a SIGKILL leaves behind is removed when this user next starts a server on this host (``sweep_secrets``).
    """

    def __init__(self, env_name: str | None):
        self.env_name = env_name
        self.args: list[str] = []
        self.headers: dict = {}
        self.folder: Path | None = None

    def __enter__(self) -> "ApiKeyFile":
        sweep_secrets()
        if not self.env_name:
            return self
        key = os.environ.get(self.env_name)
        if not key:
            raise ServerError(
                f"server.api_key_env names {self.env_name}, but that environment variable is empty or "
                "unset; export it before running"
            )
        me, folder = psutil.Process(), secrets_folder()
        if folder is None:
            raise ServerError(
                f"{tempfile.gettempdir()}: the temporary folder, which holds the server's API key, does "
                "not exist; create it or point TMPDIR to one"
            )
        self.folder = folder / f"{me.pid}-{me.create_time():.3f}"
        self.folder.mkdir(mode=0o700)
        path = self.folder / "server-secrets.yaml"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(f"api-key: {json.dumps(key)}\n")
        except BaseException:  # a full disk: no partial file left
            self.remove()
            raise
        self.args, self.headers = ["--config", str(path)], {"Authorization": f"Bearer {key}"}
        return self

    def remove(self) -> None:
        """Remove the key's file (the server has read it); the client keeps its header."""
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    def __exit__(self, *exc) -> None:
        self.remove()


def secrets_folder(create: bool = True) -> Path | None:
    """This user's folder of server secrets on this host: specsweep-secrets-<uid> in the temporary folder, private
    to its owner (refused, naming it, when another user owns it or others may read it); None when it does not exist
    and ``create`` is false."""
    folder = Path(tempfile.gettempdir()) / f"specsweep-secrets-{os.getuid()}"
    try:
        if create:
            folder.mkdir(mode=0o700)
        info = folder.lstat()
    except FileExistsError:
        info = folder.lstat()
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise ServerError(f"{folder} is not a private folder of this user's (owner, mode or type); remove it and rerun")
    return folder


def sweep_secrets() -> list[Path]:
    """Remove the secrets of server jobs that are gone (a job killed with SIGKILL runs no code to remove them):
    each job's folder is named after its process id and start time. Returns what was removed."""
    removed: list[Path] = []
    try:
        folder = secrets_folder(create=False)
    except ServerError:  # not this user's to sweep; a server that needs its key refuses it, naming it
        return removed
    for entry in folder.iterdir() if folder else []:
        pid, _, started = entry.name.partition("-")
        try:
            alive = abs(psutil.Process(int(pid)).create_time() - float(started)) < 1.0
        except (ValueError, psutil.Error):
            alive = False
        if not alive:
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed


def redact(env: dict) -> dict:
    """Environment knobs with secret values replaced (names containing KEY, TOKEN, SECRET, PASSWORD)."""
    return {k: ("<redacted>" if any(m in k.upper() for m in SECRET_MARKERS) else v) for k, v in env.items()}


class Server:
    """One inference server process tree: start, wait until ready, check, stop."""

    def __init__(
        self,
        argv: list[str],
        env: dict,
        host: str,
        port: int,
        log_path: str | Path,
        devices: list[str] | None = None,
        headers: dict | None = None,
        pass_env: Sequence[str] = (),
    ):
        self.argv, self.env, self.port = argv, env, port
        self.pass_env = tuple(pass_env)
        self.host_env: dict = {}  # what the server was given from the host (host_environment), once started
        self.url = f"http://{host}:{port}"
        self.log_path = Path(log_path)
        self.process: subprocess.Popen | None = None
        self.startup_seconds: float | None = None
        self.devices = devices
        self.headers = headers or {}

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def start(self, timeout: float) -> None:
        """Start the server with the host's platform variables and those ``pass_env`` names (host_environment), then
        the configured ``env`` over them, and the pool's GPUs; wait until it answers /health_generate."""
        self.host_env = host_environment(self.pass_env)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        env = {**self.host_env, **{k: str(v) for k, v in self.env.items()}}
        if self.devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self.devices)
        started = time.monotonic()
        try:
            self.process = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                preexec_fn=_terminate_with_parent,
            )
        finally:
            log.close()
        deadline = started + timeout
        while True:
            if self.process.poll() is not None:
                raise ServerError(
                    f"server exited with code {self.process.returncode} before it was ready; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            try:
                if requests.get(self.url + "/health_generate", timeout=5, headers=self.headers).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise ServerError(
                    f"server not ready after {timeout:g} s (server.startup_timeout); "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(0.2)
        self.startup_seconds = time.monotonic() - started

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def check_alive(self, where: str) -> None:
        if not self.alive():
            code = self.process.returncode if self.process else None
            raise ServerError(f"server died ({where}, exit code {code}); log {self.log_path}:\n{self.log_tail()}")

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM to the process group, wait, then SIGKILL; returns when the group is gone."""
        if self.process is None:
            return
        pgid = self.process.pid
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                self.process.poll()
                if not _group_alive(pgid):
                    break
                time.sleep(0.05)
            if not _group_alive(pgid):
                break
        self.process.poll()


def _terminate_with_parent() -> None:
    """In the child: ask the kernel for SIGTERM when the job process that started the server dies."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
