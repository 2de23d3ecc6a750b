"""Servers specsweep did not start (``backend: external``): one per method at its URL, checked, described, measured.

Someone else runs each server (Kubernetes, a gateway, a colleague's node); the configuration names one base URL per
method (``methods[].url``) and, where the server wants one, the environment variable holding its API key
(``methods[].api_key_env``, else ``server.api_key_env``). specsweep starts and stops nothing. Before it measures a
server it reads the server's own description (``/server_info``, or ``/get_server_info`` on older builds: the
launch settings as SGLang's argparse stored them, its version, and on the simulated server ``simulated: true``) and
refuses a server that is not what its method says: its speculative algorithm, every flag the method's spelling
sets (draft model, block size, budget, steps, top-k, attention backend, ...), its TP size and its model. The
description is the environment record of the cells measured on it; all of it that stays put across relaunches
(``stable_description``: every launch setting it reports, its version and commit, less its host, port, seed drawn
at launch, counters, clocks, folders and secrets) is part of their keys, so a server relaunched elsewhere with the
same build and settings keeps its cells, and one relaunched with other settings it reports measures them again. A
build that reports no commit is known by its version string alone: two builds of one version with the same settings
share cells.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

import requests

from .canon import digest
from .counters import read_server_info
from .layout import server_name
from .server_job import ServerJob
from .sglang_options import destinations

# what a description's key leaves out (stable_description): what differs between launches of one build with one set
# of settings (where it listens, its seed drawn at launch, its counters and clocks), never what changes a number
VOLATILE_KEYS = frozenset(
    {
        "host",
        "port",
        "nccl_port",
        "dist_init_addr",
        "node_rank",
        "base_gpu_id",
        "random_seed",
        "internal_states",
        "sim_clock",
        "sim_startup_seconds",
        "pid",
        "status",
        "uptime",
        "start_time",
        "launched_at",
        "last_gen_throughput",
    }
)
VOLATILE_SUFFIXES = ("_port", "_host", "_addr", "_dir", "_folder", "_timestamp")  # where, not how, it serves
# a flag SGLang stores under another name where the flag itself is left unset (its alias)
ALIASES = {"speculative_dflash_block_size": "speculative_num_draft_tokens"}
# algorithms SGLang stores under another name: server_args rewrites NEXTN (a target's own MTP head) to EAGLE
SAME_ALGORITHM = {"NEXTN": "EAGLE"}
# names whose values a description never keeps (a server may report its own API key)
SECRET_SUFFIXES = ("api_key", "password", "secret", "access_token", "auth_token")


class ExternalServerError(RuntimeError):
    """An external server cannot be reached, does not describe itself, or is not what its method says; the message
    names the method, the field, what was declared and what is served, and what to do."""


def endpoint(config: Mapping, method_name: str) -> dict:
    """{url, api_key_env} of a method's external server, from the configured method of that name."""
    entry = next(m for m in config["methods"] if m["name"] == method_name)
    return {
        "url": entry["url"].rstrip("/"),
        "api_key_env": entry.get("api_key_env") or config["server"].get("api_key_env"),
    }


def api_headers(method_name: str, api_key_env: str | None, environ: Mapping[str, str] | None = None) -> dict:
    """The bearer header for a method's server, its key read from the variable ``api_key_env`` names ({} without
    one); refused, naming the variable, where it is unset or empty."""
    if not api_key_env:
        return {}
    key = (os.environ if environ is None else environ).get(api_key_env)
    if not key:
        raise ExternalServerError(
            f"method '{method_name}': its server's API key is read from ${api_key_env} (methods[].api_key_env or "
            f"server.api_key_env), which is unset or empty; export it before running"
        )
    return {"Authorization": f"Bearer {key}"}


def describe(method_name: str, url: str, headers: Mapping[str, str]) -> tuple[dict, str]:
    """(the server's own description, the path that gave it): /server_info, else /get_server_info; refused, naming
    the method and URL, when neither answers with a JSON object."""
    info, path, tried = read_server_info(url, dict(headers), timeout=15)
    if info is not None:
        return info, path
    raise ExternalServerError(
        f"method '{method_name}': the server at {url} (methods[].url) does not describe itself ({'; '.join(tried)}); "
        "give the base URL of an SGLang server (not a path under it), check it runs and, behind a gateway, that the "
        "gateway passes /server_info through, and set api_key_env where the server wants a key"
    )


def declared_settings(job: ServerJob) -> dict:
    """{server_info key: declared value} of what a method's server must report: its speculative algorithm (None for
    a method without one), every setting its flags set (a flag followed by a value: that value; a flag alone: True,
    or False for a switch's ``--no-`` spelling), each under the name SGLang stores it (its option's ``dest`` in the
    recorded option tables: ``--speculative-draft-model`` is ``speculative_draft_model_path``; a flag no table has,
    its own spelling), its TP size."""
    known = destinations()
    flags = list(job.method.flags)
    declared: dict = {"speculative_algorithm": None}
    i = 0
    while i < len(flags):
        flag = flags[i]
        if not flag.startswith("--"):
            i += 1
            continue
        name, equals, value = flag.partition("=")
        spelling = next((f for f in name.split("|") if f in known), name.split("|")[0])  # --new|--old: either
        key, alone = known.get(spelling, (spelling.lstrip("-").replace("-", "_"), True))
        if equals:
            declared[key], i = value, i + 1
        elif i + 1 < len(flags) and not flags[i + 1].startswith("--"):
            declared[key], i = flags[i + 1], i + 2
        else:
            declared[key], i = alone, i + 1
    declared["tp_size"] = job.tp
    return declared


def _same(declared, served) -> bool:
    """Whether a served value is the declared one: equal as numbers where both are, else as text (case aside)."""
    if isinstance(declared, bool) or isinstance(served, bool):
        return bool(declared) == bool(served) and served is not None
    try:
        return float(declared) == float(served)
    except (TypeError, ValueError):
        return str(declared).strip().lower() == str(served).strip().lower()


def _algorithm(value) -> str | None:
    """An algorithm's name as a server reports it once running (NEXTN as EAGLE), upper case; None stays None."""
    if value is None:
        return None
    name = str(value).strip().upper()
    return SAME_ALGORITHM.get(name, name)


def mismatches(job: ServerJob, info: Mapping) -> tuple[list[tuple[str, object, object]], list[str]]:
    """([(field, declared, served)] where the server is not what its method says, [fields it leaves unsaid]).

    The algorithm, the TP size and the model must be reported; a setting of the method's flags the server reports
    as unset (None) is read under its alias (ALIASES) and otherwise left unsaid (the build's default, which the
    description does not give), one it does not report at all likewise."""
    wrong: list[tuple[str, object, object]] = []
    unsaid: list[str] = []
    for key, declared in declared_settings(job).items():
        if key not in info:
            if key in ("speculative_algorithm", "tp_size"):
                wrong.append((key, declared, "(not reported)"))
            else:
                unsaid.append(key)
            continue
        served = info[key]
        if served is None and key in ALIASES and info.get(ALIASES[key]) is not None:
            served = info[ALIASES[key]]
        if key == "speculative_algorithm":
            if _algorithm(declared) != _algorithm(served):
                wrong.append((key, declared, served))
        elif served is None:
            unsaid.append(key)
        elif not _same(declared, served):
            wrong.append((key, declared, served))
    names = [n for n in (job.model.get("path"), job.model.get("name")) if n]
    served_names = [info[k] for k in ("model_path", "served_model_name") if info.get(k)]
    if not served_names:
        wrong.append(("model_path", names[0], "(not reported)"))
    elif not set(names) & set(served_names):
        wrong.append(("model_path", names[0], served_names[0]))
    return wrong, unsaid


def check(job: ServerJob, info: Mapping, url: str) -> list[str]:
    """Refuse (ExternalServerError) a server that is not what its method says, naming the method, each field, the
    declared and the served value, and what to do; returns the fields the server leaves unsaid."""
    wrong, unsaid = mismatches(job, info)
    if wrong:
        lines = [f"{field}: declared {declared!r}, served {served!r}" for field, declared, served in wrong]
        raise ExternalServerError(
            f"method '{job.method.name}': the server at {url} is not what the method declares (backend external "
            "measures servers as they are, and keys their cells by what they report):\n  "
            + "\n  ".join(lines)
            + "\nPoint methods[].url at the server that runs this method, or change the method (its algorithm and "
            "parameters, model.path or model.name, tp) to what the server runs"
        )
    return unsaid


def redacted(info: Mapping) -> dict:
    """A description without secrets: a value whose name ends like an API key, password or token is replaced."""
    return {
        k: ("<redacted>" if v and any(k.lower().endswith(s) for s in SECRET_SUFFIXES) else v) for k, v in info.items()
    }


def stable(key: str) -> bool:
    """Whether a description's field may decide a cell's numbers and stays put across relaunches of one build with
    one set of settings: every field but those of VOLATILE_KEYS, the addresses, ports and folders (VOLATILE_SUFFIXES)
    and secrets (SECRET_SUFFIXES)."""
    name = key.lower()
    return name not in VOLATILE_KEYS and not name.endswith(VOLATILE_SUFFIXES) and not name.endswith(SECRET_SUFFIXES)


def stable_description(info: Mapping) -> dict:
    """What of a description keys its cells: the whole description (version and commit, model, TP, every
    speculative setting, and every other launch setting it reports: dtype, quantization, KV cache dtype, page size,
    attention backend, batch and memory limits, chunked prefill, CUDA graphs, DP, radix cache, ...), less what
    differs between launches (stable: its host, port, seed, counters, clocks, folders) and secrets."""
    return {k: info[k] for k in sorted(info) if stable(k)}


def environment(host: Mapping, job: ServerJob, url: str) -> dict:
    """The environment record of an external server's cells: the host's record (``host``: environment.probe of the
    external backend: specsweep and the client's software) with the server's own description as its server, and an
    identity of the server's stable description alone (the cells' keys hold its digest, and specsweep's harness
    version besides).
    Refused (ExternalServerError) where the server is unreachable, does not describe itself or is not what its
    method says."""
    headers = api_headers(job.method.name, (job.endpoint or {}).get("api_key_env"))
    info, path = describe(job.method.name, url, headers)
    unsaid = check(job, info, url)
    if unsaid:
        print(
            f"method '{job.method.name}': the server at {url} does not report {', '.join(unsaid)}; taken as declared",
            file=sys.stderr,
            flush=True,
        )
    stable = stable_description(info)
    simulated = bool(info.get("simulated"))
    server = {
        "name": "specsweep-sim" if simulated else "sglang",
        "version": info.get("version"),
        "commit": next((info[k] for k in ("commit", "git_commit", "sglang_commit") if info.get(k)), None),
        "simulated": simulated,
        "external": True,
        "info_endpoint": path,
        "unreported": unsaid,
        "description": redacted(info),
    }
    identity = {"backend": "external", "server": stable}  # never the client's host: its GPUs run nothing here
    return {
        **host,
        "backend": "external",
        "simulated": simulated,
        "server": server,
        "identity": identity,
        "identity_digest": digest(identity),
    }


class ExternalServer:
    """A server someone else runs, as the cells measure it (the launcher's Server's reading side): its URL and
    headers, whether it answers; starting and stopping it are its operator's."""

    def __init__(self, url: str, headers: Mapping[str, str]):
        self.url = url
        self.headers = dict(headers)
        self.host_env: dict = {}
        self.startup_seconds = None  # not started here
        self.devices = None

    def alive(self) -> bool:
        """Always: no process of it is here to look at, and the client asks this while its streams run (an HTTP
        request would hold them up), so a failed request is categorised by what it showed (connect, timeout,
        truncated), never as a server that died; check_alive asks the server between cells."""
        return True

    def answers(self) -> bool:
        """Whether the server answers /health (any answer below 500)."""
        try:
            return requests.get(self.url + "/health", timeout=5, headers=self.headers).status_code < 500
        except requests.RequestException:
            return False

    def check_alive(self, where: str) -> None:
        if not self.answers():
            raise ExternalServerError(
                f"the external server at {self.url} does not answer /health ({where}); its operator's logs say why"
            )

    def log_tail(self, lines: int = 30) -> str:
        return f"(external server at {self.url}: its log is its operator's)"

    def stop(self) -> None:
        """Nothing: specsweep never stops a server it did not start."""


def stream_flags(info: Mapping) -> list[str]:
    """The launch flags the client's reading of the stream depends on, as the server reports them (launcher.stream_mode
    reads them): incremental streaming output where it is on."""
    return [
        flag
        for flag, key in (
            ("--incremental-streaming-output", "incremental_streaming_output"),
            ("--stream-output", "stream_output"),
        )
        if info.get(key)
    ]


def description_of(environment_record: Mapping) -> dict:
    """The server's description an external environment record holds ({} for another backend)."""
    return dict((environment_record.get("server") or {}).get("description") or {})


def server_key(job: ServerJob) -> str:
    """The name an external server's description is kept under: its TP size and method (tp{tp}/{method}), the same
    for every repetition (each repetition measures the same server again)."""
    return server_name(job.tp, job.method.name)


def describe_servers(host: Mapping, jobs: Sequence[ServerJob]) -> dict:
    """{server_key: its server's record (environment()'s ``server``) with the identity its cells are keyed by
    (``identity_digest``)} of every external server, each checked against its method once (repetitions share it):
    the environment rule's record (made again in every run that reaches a server job), which refuses a server that
    is not what its method says before any bench job runs, and against which the aggregation verifies the cells'
    keys."""
    out = {}
    for job in jobs:
        if server_key(job) in out:
            continue
        record = environment(host, job, (job.endpoint or {})["url"])
        out[server_key(job)] = {**record["server"], "identity_digest": record["identity_digest"]}
    return out


def identities(environment_records: Mapping) -> dict:
    """{engine: identity digest} of each environment record ({engine name or None: record}), and {server_key:
    identity digest} of each external server they describe: what a server job's cells are keyed by
    (identity_digest)."""
    out = {engine: record["identity_digest"] for engine, record in environment_records.items()}
    for record in environment_records.values():
        out.update({key: described["identity_digest"] for key, described in (record.get("servers") or {}).items()})
    return out


def identity_digest(environment_record: Mapping, job: ServerJob) -> str:
    """The identity digest a server job's cells are keyed by: its external server's (describe_servers), else the
    environment's own."""
    return identities({None: environment_record}).get(server_key(job)) or environment_record["identity_digest"]
