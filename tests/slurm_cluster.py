"""A real one-node SLURM cluster for the tests: munge, slurmctld and slurmd from Debian's packages.

The node offers ``gpus`` generic GPU resources backed by character devices
(/dev/null, /dev/zero, ...), so jobs asking ``--gpus=N`` get
``CUDA_VISIBLE_DEVICES`` on a machine without GPUs. SLURM reads its
configuration from /etc/slurm only (each job step drops ``SLURM_CONF``), so
the cluster writes /etc/slurm/slurm.conf and gres.conf, refuses to touch
files there that it did not write, and removes its own when it stops. Every
daemon is started here, in the foreground mode, and stopped by its PID, also
when the test fails. No accounting database: ``sacct`` fails, so clients must
ask ``squeue`` for job states (and ``MinJobAge`` keeps finished jobs listed
for 10 minutes).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from conftest import patience

ETC = Path("/etc/slurm")
MARK = "# written by specsweep's test cluster (tests/slurm_cluster.py); removed when it stops\n"
DAEMONS = ("munged", "slurmctld", "slurmd")
FAKE_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/urandom", "/dev/random", "/dev/tty")


def missing() -> str | None:
    """Why a cluster cannot start here, or None."""
    if os.geteuid() != 0:
        return "the SLURM cluster test needs root (daemons and /etc/slurm)"
    absent = [d for d in DAEMONS + ("sbatch", "squeue", "scancel") if shutil.which(d) is None]
    if absent:
        return f"SLURM is not installed ({', '.join(absent)} missing): run tools/test.sh, which installs it with apt"
    for name in ("slurm.conf", "gres.conf"):
        path = ETC / name
        if path.exists() and not path.read_text().startswith(MARK):
            return f"{path} exists and was not written by this test: not touching a real cluster's configuration"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """start() brings the daemons up and waits for the node to be idle; stop() ends every daemon it started."""

    def __init__(self, workdir: Path, gpus: int = 4, cpus: int = 32, memory_mb: int = 262144, partition: str = "gpu"):
        self.dir = Path(workdir)
        self.gpus, self.cpus, self.memory_mb, self.partition = gpus, cpus, memory_mb, partition
        self.node = socket.gethostname()
        self.processes: dict[str, subprocess.Popen] = {}
        # munged checks every directory above its socket: one of its own under /run, not the test's private tmp
        self.munge_dir = Path(
            tempfile.mkdtemp(prefix="specsweep-munge-", dir="/run" if Path("/run").is_dir() else None)
        )
        self.munge_socket = self.munge_dir / "munge.socket.2"

    def _write_config(self) -> None:
        for sub in ("state", "spool"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        ETC.mkdir(parents=True, exist_ok=True)
        d = self.dir
        conf = f"""{MARK}ClusterName=specsweep-test
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SlurmdParameters=config_overrides
ReturnToService=2
MailProg=/bin/true
GresTypes=gpu
MinJobAge=600
KillWait=5
DefMemPerCPU=1000
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
SchedulerParameters=sched_interval=1
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={self.memory_mb} Gres=gpu:{self.gpus} State=UNKNOWN
PartitionName={self.partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
        (ETC / "slurm.conf").write_text(conf)
        files = ",".join(FAKE_DEVICES[: self.gpus])
        (ETC / "gres.conf").write_text(f"{MARK}AutoDetect=off\nNodeName={self.node} Name=gpu File={files}\n")

    def _spawn(self, name: str, argv: list[str], user: str | None = None) -> None:
        def demote():
            os.setsid()
            if user:
                entry = pwd.getpwnam(user)
                os.setgid(entry.pw_gid)
                os.setuid(entry.pw_uid)

        with open(self.dir / f"{name}.out", "ab") as log:  # the daemon keeps its own copy of the descriptor
            self.processes[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, preexec_fn=demote)

    def start(self, timeout: float = patience(12)) -> "Cluster":
        if len(FAKE_DEVICES) < self.gpus:
            raise ValueError(f"at most {len(FAKE_DEVICES)} GPUs")
        try:
            self._write_config()
            self.munge_dir.chmod(0o755)
            shutil.chown(self.munge_dir, "munge", "munge")
            self._spawn(
                "munged",
                [
                    "munged",
                    "-F",
                    "--socket",
                    str(self.munge_socket),
                    "--pid-file",
                    str(self.munge_dir / "munged.pid"),
                    "--log-file",
                    str(self.munge_dir / "munged.log"),
                    "--seed-file",
                    str(self.munge_dir / "munged.seed"),
                ],
                user="munge",
            )
            self._wait(self.munge_socket.exists, timeout, "munged did not create its socket")
            self._spawn("slurmctld", ["slurmctld", "-D", "-i"])
            self._spawn("slurmd", ["slurmd", "-D", "-N", self.node])
            self._wait(self.idle, timeout, "the node did not become idle")
        except BaseException:
            self.stop()
            raise
        return self

    def _wait(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            for name, process in self.processes.items():
                if process.poll() is not None:
                    raise RuntimeError(f"{name} exited with {process.returncode}: {self.logs()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} within {timeout:g} s: {self.logs()}")
            time.sleep(0.2)

    def idle(self) -> bool:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True, timeout=patience(4))
        return out.returncode == 0 and out.stdout.strip().rstrip("*") in ("idle", "mixed", "allocated")

    def jobs(self) -> list[dict]:
        """Every job the controller knows (also those that ended within MinJobAge), as ``scontrol show job``'s
        fields (JobId, JobName, JobState, TresPerJob, Command, ...)."""
        out = subprocess.run(
            ["scontrol", "-o", "show", "job"], capture_output=True, text=True, timeout=patience(4), check=True
        ).stdout
        jobs = []
        for line in out.splitlines():
            if line.startswith("JobId="):
                jobs.append(dict(item.split("=", 1) for item in line.split() if "=" in item))
        return jobs

    def cancel_all(self, timeout: float = patience(6)) -> None:
        """Cancel every job and wait until none is left running (their processes gone with them)."""
        subprocess.run(["scancel", "--user", "root"], capture_output=True, timeout=patience(4))
        deadline = time.monotonic() + timeout
        while any(j["JobState"] in ("RUNNING", "COMPLETING", "PENDING", "CONFIGURING") for j in self.jobs()):
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)

    def logs(self) -> str:
        parts = []
        for name in (
            "slurmctld.log",
            "slurmd.log",
            str(self.munge_dir / "munged.log"),
            "munged.out",
            "slurmctld.out",
            "slurmd.out",
        ):
            path = self.dir / name
            if path.exists():
                parts.append(f"--- {name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-15:]))
        return "\n".join(parts)

    def stop(self) -> None:
        """Cancel every job, then SIGTERM every daemon started here (by PID), SIGKILL after patience(2) s; remove
        this cluster's /etc/slurm files."""
        if self.processes.get("slurmctld") is not None and self.processes["slurmctld"].poll() is None:
            try:
                self.cancel_all()
            except (subprocess.SubprocessError, OSError):
                pass
        for name in reversed(list(self.processes)):
            process = self.processes[name]
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(timeout=patience(2))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=patience(2))
        for name in ("slurm.conf", "gres.conf"):
            path = ETC / name
            if path.exists() and path.read_text().startswith(MARK):
                path.unlink()
        shutil.rmtree(self.munge_dir, ignore_errors=True)
