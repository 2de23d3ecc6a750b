"""The GPU pool: which GPUs a server job gets.

Snakemake's ``resources: gpu=<tp>`` limits how many GPUs are in use at once
but does not say which. Each job takes free devices from a pool of lock
files, one per GPU, locked with flock(2) under a global mutex so that two
jobs never pick the same device; the kernel releases a flock when its holder
dies, even after SIGKILL, so a crashed job never keeps a GPU. Under a
cluster scheduler the pool chooses only among the devices the scheduler
granted (CUDA_VISIBLE_DEVICES at job start).

The lock files live in one folder per host that every run on the host sees, whatever its working directory or
cache (``lock_folder``), so that two workflows on one host (two results folders, one cache or two) never
double-book a GPU.
"""

from __future__ import annotations

import fcntl
import os
import socket
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from .environment import command_output, gpu_inventory


class GpuPoolError(RuntimeError):
    pass


def visible_devices(configured: int | None = None) -> list[str]:
    """Devices this job may use: those granted by a scheduler, else the configured count, else nvidia-smi's."""
    granted = os.environ.get("CUDA_VISIBLE_DEVICES")
    if granted is not None and granted.strip():
        return [d.strip() for d in granted.split(",") if d.strip()]
    if configured is not None:
        return [str(i) for i in range(configured)]
    return [str(g["index"]) for g in gpu_inventory()]


ASSUMED_GPUS = 8  # what a plan packs onto where no GPU count is configured or visible: an 8-GPU node


def plan_gpus(configured: int | None) -> tuple[int, str]:
    """(how many GPUs a plan packs servers onto, where that number comes from, as plan.md says it): gpu_pool.devices
    (``configured``), else the devices visible here (CUDA_VISIBLE_DEVICES, else nvidia-smi's), else ASSUMED_GPUS,
    said to be assumed and how to set it."""
    if configured:
        return configured, "from gpu_pool.devices"
    granted = (os.environ.get("CUDA_VISIBLE_DEVICES") or "").strip()
    visible = visible_devices()
    if visible:
        return len(visible), "from CUDA_VISIBLE_DEVICES" if granted else "from nvidia-smi (this host's GPUs)"
    return ASSUMED_GPUS, (
        "assumed: no GPU is visible here (neither CUDA_VISIBLE_DEVICES nor nvidia-smi names one) and "
        "gpu_pool.devices is not set; set gpu_pool.devices to the GPUs of the host the plan will run on"
    )


HOST_LOCKS = "specsweep-gpu-locks"  # the host-wide folder of the pool's locks, in the host's temporary folder


def lock_folder(lock_dir: str | None = None) -> Path:
    """Where this host's GPU locks live: ``<lock_dir>/<hostname>`` (gpu_pool.lock_dir: a folder that several hosts
    may share), by default ``<temporary folder>/specsweep-gpu-locks/<hostname>``, one folder for every run and user
    on the host (created sticky and writable by all, as /tmp is)."""
    if lock_dir:
        return Path(lock_dir) / socket.gethostname()
    folder = Path(tempfile.gettempdir()) / HOST_LOCKS / socket.gethostname()
    for level in (folder.parent, folder):
        try:
            level.mkdir(mode=0o1777)
            os.chmod(level, 0o1777)  # mkdir's mode is cut by the umask
        except FileExistsError:
            pass
    return folder


class GpuPool:
    """One lock file per device in ``lock_dir``; ``acquire(n)`` waits for n free devices."""

    def __init__(self, lock_dir: str | Path, devices: list[str]):
        self.lock_dir = Path(lock_dir)
        self.devices = list(devices)
        self.lock_dir.mkdir(parents=True, exist_ok=True)

    def _open(self, name: str) -> int:
        """A lock file, shared by every user of the folder (a lock another user created is locked read-only)."""
        path = self.lock_dir / name
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
            os.fchmod(fd, 0o666)  # open's mode is cut by the umask
            return fd
        except FileExistsError:
            pass
        try:
            return os.open(path, os.O_RDWR)
        except PermissionError:
            return os.open(path, os.O_RDONLY)  # flock needs no write access

    def _try_lock(self, name: str):
        fd = self._open(name)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd

    @contextmanager
    def acquire(self, count: int, timeout: float = 7 * 24 * 3600, poll: float = 0.5, holder: str = ""):
        """Hold ``count`` free devices for the duration of the block; yields their ids."""
        if count > len(self.devices):
            raise GpuPoolError(
                f"{holder or 'a server'} needs {count} GPUs but this host offers "
                f"{len(self.devices)} ({', '.join(self.devices) or 'none'}); lower tp or use a larger host"
            )
        deadline = time.monotonic() + timeout
        held: list[tuple[str, int]] = []
        while True:
            mutex = self._open("pool.mutex")
            try:
                fcntl.flock(mutex, fcntl.LOCK_EX)
                for device in self.devices:
                    fd = self._try_lock(f"gpu{device}.lock")
                    if fd is not None:
                        held.append((device, fd))
                        if len(held) == count:
                            break
                if len(held) < count:  # not enough: give back, wait, retry
                    for _, fd in held:
                        os.close(fd)
                    held = []
            finally:
                os.close(mutex)
            if held:
                break
            if time.monotonic() > deadline:
                raise GpuPoolError(f"{holder or 'a server'}: {count} GPUs not free within {timeout:g} s")
            time.sleep(poll)
        try:
            for device, fd in held:
                try:
                    os.ftruncate(fd, 0)
                    os.write(fd, f"{os.getpid()} {holder}\n".encode())
                except OSError:  # a lock file of another user's, opened read-only: held all the same
                    pass
            yield [device for device, _ in held]
        finally:
            for _, fd in held:
                os.close(fd)


def wait_until_released(devices: list[str], timeout: float = 60.0) -> bool:
    """Wait until no process of a stopped server still holds memory on its GPUs (nvidia-smi); True when free."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = command_output(
            ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader", "-i", ",".join(devices)]
        )
        if out is None or not out.strip():
            return True
        time.sleep(1.0)
    return False


def gpu_memory_used(devices: list[str] | None) -> float | None:
    """Memory in use on these GPUs now, MiB summed (nvidia-smi); None without NVIDIA GPUs."""
    if not devices:
        return None
    out = command_output(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", ",".join(devices)]
    )
    if not out:
        return None
    return float(sum(float(v) for v in out.split()))
