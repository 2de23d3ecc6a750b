"""The software and hardware environment a backend runs in, and what it can do.

``prepare_python`` builds or verifies the interpreter that runs the server
(a virtual environment from a pip requirement or git URL, or a given
interpreter). A git requirement with a moving ref (a branch, or
``refs/pull/N/head``) is resolved to a commit first and built at that commit;
the commit is recorded and is part of the environment's identity, so two
hosts that resolved different heads never share cached cells. ``probe`` returns versions, the GPU inventory and the
backend's capabilities (the speculative algorithms and flags its launcher's
``--help`` lists). Its ``identity`` part (what changes results: server build,
versions, GPUs) is digested into every cell key, so a new server build makes
cached cells stale while timestamps do not.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from . import HARNESS_VERSION, __version__, ddtree
from .canon import atomic_write_text, digest
from .modelling.method import Method
from .sglang_options import choose_flags


class ServerEnvironmentError(RuntimeError):
    """The server environment cannot run the configured plan; the message says what to do."""


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def command_output(argv: list[str], timeout: float = 60) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def gpu_inventory() -> list[dict]:
    """GPUs reported by nvidia-smi (empty without NVIDIA GPUs)."""
    if not shutil.which("nvidia-smi"):
        return []
    out = command_output(["nvidia-smi", "--query-gpu=index,name,memory.total,driver_version", "--format=csv,noheader"])
    gpus = []
    for line in (out or "").strip().splitlines():
        index, name, memory, driver = [part.strip() for part in line.split(",")]
        gpus.append({"index": int(index), "name": name, "memory": memory, "driver": driver})
    return gpus


def capabilities_from_help(help_text: str) -> dict:
    """Speculative algorithms and flags a launcher's ``--help`` lists."""
    flags = sorted(set(re.findall(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)", help_text)))
    algorithms: list[str] = []
    braces = re.search(r"--speculative-algorithm\s+\{([^}]*)\}", help_text)
    builtins = re.search(r"Speculative algorithm\.\s+Builtins:\s*([A-Z0-9_,\s]+)\.", help_text)
    if braces:
        algorithms = [a.strip() for a in braces.group(1).split(",")]
    elif builtins:
        algorithms = [a.strip() for a in builtins.group(1).split(",") if a.strip()]
    return {"algorithms": algorithms, "flags": flags}


_GIT_REQUIREMENT = re.compile(r"git\+(?P<url>[^#\s]+)@(?P<ref>[^@#\s]+)")  # the ref follows the URL's last @
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def git_ls_remote(url: str, ref: str) -> str | None:
    """The commit a ref of a remote git repository points to now (``git ls-remote``), or None."""
    out = command_output(["git", "ls-remote", url, ref], timeout=120)
    candidates = {ref, f"refs/heads/{ref}", f"refs/tags/{ref}^{{}}", f"refs/tags/{ref}"}
    for line in (out or "").splitlines():
        sha, _, name = line.partition("\t")
        if name.strip() in candidates:
            return sha.strip()
    return None


def resolve_git_refs(requirements: list[str], ls_remote=git_ls_remote) -> tuple[list[str], list[dict]]:
    """Pin every git requirement to the commit its ref names now: (pinned requirements, [{requirement, url,
    ref, commit}]). A commit given in full is kept; a ref that does not resolve stops with a clear error."""
    pinned, pins = [], []
    for requirement in requirements:
        match = _GIT_REQUIREMENT.search(requirement)
        if not match or "/" not in match.group("url").split("://", 1)[-1]:  # git+ssh://git@host/x.git: no ref
            pinned.append(requirement)
            continue
        url, ref = match.group("url"), match.group("ref")
        commit = ref if _COMMIT.match(ref) else ls_remote(url, ref)
        if not commit:
            raise ServerEnvironmentError(
                f"sglang.install: cannot resolve {ref!r} of {url} to a commit (git "
                "ls-remote); check the URL and ref, or give a commit"
            )
        pinned.append(requirement[: match.start("ref")] + commit + requirement[match.end("ref") :])
        pins.append({"requirement": requirement, "url": url, "ref": ref, "commit": commit})
    return pinned, pins


def prepare_python(sglang: dict, log=sys.stderr, ls_remote=git_ls_remote) -> tuple[str, list[dict]]:
    """(interpreter that runs SGLang, git pins): given, or a virtual environment built from ``install`` at the
    resolved commits, or this one."""
    if sglang.get("python"):
        return sglang["python"], []
    install = sglang.get("install")
    if not install:
        return sys.executable, []
    requirements, pins = resolve_git_refs(install if isinstance(install, list) else [install], ls_remote)
    for pin in pins:
        print(f"{pin['ref']} of {pin['url']} is commit {pin['commit']}; building at that commit", file=log, flush=True)
    venv = Path(sglang["env_dir"]) / digest(requirements)[:16]
    python = venv / "bin" / "python"
    done = venv / ".specsweep-installed"
    if done.exists() and done.read_text() == "\n".join(requirements):
        return str(python), pins
    print(f"building the server environment {venv}: pip install {' '.join(requirements)}", file=log, flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    proc = subprocess.run([str(python), "-m", "pip", "install", *requirements], stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise ServerEnvironmentError(
            f"installing the server environment failed (sglang.install = {install!r}); see the environment log"
        )
    atomic_write_text(done, "\n".join(requirements))
    return str(python), pins


_VERSIONS_SCRIPT = """
import importlib.metadata as m, json, sys
out = {}
for p in ("sglang", "sglang-kernel", "sgl-kernel", "flashinfer-python", "torch", "triton", "transformers"):
    try: out[p] = m.version(p)
    except m.PackageNotFoundError: out[p] = None
try:
    d = m.distribution("sglang"); u = d.read_text("direct_url.json")
    out["sglang_source"] = json.loads(u) if u else None
except Exception: out["sglang_source"] = None
try:
    import torch; out["cuda"] = torch.version.cuda
except Exception: out["cuda"] = None
try:  # the DDTree variables the installed package's speculative sources name (a build's knobs), without importing it
    import glob, importlib.util, os, re
    root = os.path.dirname(importlib.util.find_spec("sglang").origin)
    names = set()
    for path in glob.glob(os.path.join(root, "srt", "speculative", "*.py")):
        names |= set(re.findall(r"SGLANG_DDTREE_[A-Z0-9_]+", open(path, encoding="utf-8", errors="replace").read()))
    out["ddtree_variables"] = sorted(names)
except Exception: out["ddtree_variables"] = None
out["python"] = sys.version.split()[0]
print(json.dumps(out))
"""


def probe(
    backend: str,
    python: str | None = None,
    help_text: str | None = None,
    pins: Sequence[dict] = (),
    build: str | None = None,
) -> dict:
    """Versions, hardware and capabilities of a backend on this host.

    ``help_text`` replaces running the launcher's ``--help`` (for tests with a recorded text). ``pins`` (the
    commits git requirements were built at) and ``build`` (the configured label) are recorded with the server;
    its identity holds the build's content (``build_identity``): the pins' commits, not the label.
    """
    python = python or sys.executable
    software = {
        "specsweep": __version__,
        "harness_version": HARNESS_VERSION,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "snakemake": _version("snakemake"),
        "aiohttp": _version("aiohttp"),
        "orjson": _version("orjson"),
    }
    gpus = gpu_inventory()
    if backend == "sim":
        if help_text is None:
            help_text = command_output([python, "-m", "specsweep.sim", "--help"]) or ""
        server = {"name": "specsweep-sim", "version": __version__, "simulated": True, "python": python}
    elif backend == "external":  # servers someone else runs: each describes itself to its job (external.environment)
        help_text, server = help_text or "", {"name": "external", "simulated": False}
        gpus = []  # the client's GPUs run none of them; the servers' own are theirs to report (they report none)
    else:
        server, help_text = _sglang_server(python, help_text, pins, build, software)
    caps = capabilities_from_help(help_text)
    identity = {
        "backend": backend,
        "server": build_identity(server),
        "gpus": [g["name"] for g in gpus],
        "python": software["python"],
        "torch": software.get("torch"),
        "cuda": software.get("cuda"),
    }
    return {
        "backend": backend,
        "simulated": backend == "sim",
        "python": python,
        "server": server,
        "software": software,
        "hardware": {
            "gpus": gpus,
            "driver": gpus[0]["driver"] if gpus else None,
            "cpu_count": os.cpu_count(),
            "machine": platform.machine(),
        },
        "capabilities": caps,
        "identity": identity,
        "identity_digest": digest(identity),
    }


def _sglang_server(
    python: str, help_text: str | None, pins: Sequence[dict], build: str | None, software: dict
) -> tuple[dict, str]:
    """(the SGLang server's record, its launcher's ``--help``) for the interpreter ``python``: its versions (added to
    ``software``, the interpreter's as server_python), source and commit; refused (ServerEnvironmentError) where
    SGLang is not installed and no recorded help text stands in."""
    versions = command_output([python, "-c", _VERSIONS_SCRIPT], timeout=300)
    server_versions = json.loads(versions) if versions else {}
    if help_text is None:
        if not server_versions.get("sglang"):
            raise ServerEnvironmentError(
                f"SGLang is not installed for {python}; set sglang.install (e.g. "
                "'sglang==0.5.23' or a git URL of a DDTree branch) or sglang.python"
            )
        help_text = command_output([python, "-m", "sglang.launch_server", "--help"], timeout=600) or ""
    software["server_python"] = server_versions.pop("python", None)
    ddtree_variables = server_versions.pop("ddtree_variables", None)
    software.update({k: v for k, v in server_versions.items()})
    server = {
        "name": "sglang",
        "version": server_versions.get("sglang"),
        "source": server_versions.get("sglang_source"),
        "commit": _source_commit(server_versions, pins),
        "pins": list(pins),
        "build": build,
        "simulated": False,
        "python": python,
    }
    if ddtree_variables is not None:
        server["ddtree_variables"] = ddtree_variables  # checked against the DDTree builds' rules (check_methods)
    return server, help_text


def build_identity(server: dict) -> dict:
    """A server build by its content, as its environment record gives it: its name, version and whether it is
    simulated; the commit it was built from (pip's record of a VCS install, else the resolved git pins), the hash of
    the wheel or archive it was installed from, and only where pip records neither (a local folder) where it came
    from. Never its interpreter's path or its configured label (sglang.build): a build moved to another folder, or
    named otherwise, is the same build."""
    identity = {k: v for k, v in server.items() if k not in ("python", "build", "pins", "source", "ddtree_variables")}
    if "pins" in server:
        identity["pins"] = [pin["commit"] for pin in server["pins"]]
    if "source" in server:
        source = server["source"] or {}
        vcs, archive = source.get("vcs_info") or {}, source.get("archive_info") or {}
        if vcs.get("commit_id"):
            identity["source"] = {"commit": vcs["commit_id"], "subdirectory": source.get("subdirectory")}
        elif archive.get("hash") or archive.get("hashes"):
            identity["source"] = {"archive": archive.get("hashes") or archive.get("hash")}
        else:
            identity["source"] = server["source"]
    return identity


def _source_commit(versions: dict, pins: Sequence[dict]) -> str | None:
    """The commit SGLang was built from: pip's record of a VCS install, else the resolved pin."""
    vcs = (versions.get("sglang_source") or {}).get("vcs_info") or {}
    return vcs.get("commit_id") or next((p["commit"] for p in pins), None)


def offered_flags(environment: dict, extra_flags: Sequence[dict] = ()) -> set[str] | None:
    """The flags the installed server accepts: those its --help listed (the capability probe; None: no probe),
    and on the simulated backend every flag the configuration declares (``sglang.extra_flags``: the simulator
    accepts a declared build flag, modelled where it means something, recorded otherwise)."""
    offered = set(environment.get("capabilities", {}).get("flags") or ())
    if not offered:
        return None
    if environment["backend"] == "sim":
        offered |= {extra["flag"] for extra in extra_flags}
    return offered


def check_methods(methods: list[Method], environment: dict, extra_flags: Sequence[dict] = ()) -> None:
    """Fail before any server starts if the installed server cannot run a configured method.

    The check uses the capability probe (algorithms and flags listed by the launcher's --help; ``offered_flags``).
    """
    caps = environment["capabilities"]
    backend = environment["backend"]
    offered = offered_flags(environment, extra_flags)
    for method in methods:
        _check_ddtree_variables(method, environment)
        flags = choose_flags(list(method.flags), offered) if offered else list(method.flags)
        if "--speculative-algorithm" in flags:
            wanted = flags[flags.index("--speculative-algorithm") + 1]
            if caps["algorithms"] and wanted not in caps["algorithms"]:
                raise ServerEnvironmentError(
                    f"method '{method.name}': the installed {backend} server does not offer "
                    f"--speculative-algorithm {wanted} (it offers {', '.join(caps['algorithms'])}); install a "
                    "build that has it (sglang.install) or remove the method"
                )
        for flag in flags:
            if flag.startswith("--") and offered and flag.split("=")[0] not in offered:
                raise ServerEnvironmentError(
                    f"method '{method.name}': the installed {backend} server does not accept {flag}; "
                    "install a build that has it (sglang.install) or fix the method's flags"
                )


def _check_ddtree_variables(method: Method, environment: dict) -> None:
    """A DDTree method's build rules against the installed package (where its sources were searched: the environment
    record's server ``ddtree_variables``): every variable the build declares it reads must be named there, and every
    SGLANG_DDTREE_ variable named there must be declared (else the rules describe another build)."""
    found = (environment.get("server") or {}).get("ddtree_variables")
    if found is None or not method.spec.builds_trees:
        return
    rules = ddtree.build(method.params.get("tree_build"))
    if rules.variables is None:
        return
    declared = set(rules.variables)
    missing, undeclared = sorted(declared - set(found)), sorted(set(found) - declared)
    if missing or undeclared:
        said = "; ".join(
            text
            for text in (
                f"it reads no {', '.join(missing)}" if missing else "",
                f"it reads {', '.join(undeclared)}, which the rules do not declare" if undeclared else "",
            )
            if text
        )
        raise ServerEnvironmentError(
            f"method '{method.name}': the installed server is not the DDTree build '{rules.name}' its rules describe "
            f"({said}; searched its speculative sources); install that build, or name the build it is (tree_build, "
            "ddtree_builds.<name>.variables)"
        )
