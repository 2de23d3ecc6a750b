"""SGLang's launch_server option table, recorded from a pinned release, and checks against it; a flag's spellings
across releases (``--new|--old``, choose_flags) and the environment variables that change decoding.

The table (specsweep/data/sglang-<version>-options.json) is recorded with
tools/record_sglang_options.py from an installed SGLang. Builds that add
flags (a DDTree branch, for instance) declare them in config under
``sglang.extra_flags``; every launch command is parsed with the table plus
those flags before any job runs.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from functools import lru_cache
from importlib import resources

from .errors import did_you_mean

TYPES = {"int": int, "float": float, "str": str}

# SGLang reads environment variables of this prefix to change what it runs (SGLANG_DDTREE_MAX_TOPK,
# SGLANG_DDTREE_DEPTH_BONUS, SGLANG_ENABLE_JIT_DEEPGEMM, ...), and a DDTree build's own variable (its
# depth_bonus_env) must have it too (ddtree.tree_build): this one prefix names every variable that changes decoding
DECODING_PREFIX = "SGLANG_"


def decoding_variable(name: str) -> bool:
    """Whether SGLang or a DDTree build reads this environment variable to change how it decodes: every variable
    of DECODING_PREFIX. Only the configuration sets one (server.env, a method's env), so that its value is part of
    the cells' keys; one the shell sets is refused (launcher.check_host_environment)."""
    return name.startswith(DECODING_PREFIX)


class FlagError(ValueError):
    """A launch flag the server would reject."""


def available_tables() -> list[str]:
    names = [p.name for p in resources.files("specsweep").joinpath("data").iterdir()]
    return sorted(
        n[len("sglang-") : -len("-options.json")]
        for n in names
        if n.startswith("sglang-") and n.endswith("-options.json")
    )


@lru_cache(maxsize=8)
def load_table(version: str) -> dict:
    path = resources.files("specsweep").joinpath(f"data/sglang-{version}-options.json")
    if not path.is_file():
        raise FlagError(
            f"no recorded SGLang option table for version {version!r} "
            f"(recorded: {', '.join(available_tables())}); record one with tools/record_sglang_options.py"
        )
    return json.loads(path.read_text())


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise FlagError(message)


def build_parser(version: str, extra_flags: Sequence[dict] = ()) -> argparse.ArgumentParser:
    """An argparse parser equivalent to SGLang's for the recorded version, plus declared extra flags (built once per
    version and flags: parsing leaves a parser as it was)."""
    return _parser(version, json.dumps(list(extra_flags), sort_keys=True))


@lru_cache(maxsize=8)
def _parser(version: str, extra_json: str) -> argparse.ArgumentParser:
    parser = _Parser(prog="sglang.launch_server", add_help=False, allow_abbrev=False)
    for option in load_table(version)["options"]:
        add_option(parser, option["flags"], option["nargs"], option["type"], option["choices"])
    for extra in json.loads(extra_json):
        kind = extra.get("type", "str")
        add_option(parser, [extra["flag"]], 0 if kind == "bool" else None, None if kind == "bool" else kind, None)
    return parser


def add_option(parser, flags, nargs, kind, choices):
    try:
        if nargs == 0:
            parser.add_argument(*flags, action="store_true")
        else:
            parser.add_argument(*flags, nargs=nargs, type=TYPES.get(kind or "str", str), choices=choices)
    except argparse.ArgumentError:
        pass  # a declared extra flag that the release already has


def known_flags(version: str, extra_flags: Sequence[dict] = ()) -> set[str]:
    flags = {f for option in load_table(version)["options"] for f in option["flags"]}
    return flags | {e["flag"] for e in extra_flags}


@lru_cache(maxsize=1)
def destinations() -> dict[str, tuple[str, bool]]:
    """{flag: (the name SGLang stores it under, the value a flag alone stores)} over every recorded table: each
    spelling of an option (``--tp|--tp-size|--tensor-parallel-size``) under its option's ``dest``, the ``--no-``
    spelling of a switch storing False."""
    out: dict[str, tuple[str, bool]] = {}
    for version in available_tables():
        for option in load_table(version)["options"]:
            first = option["flags"][0]
            for flag in option["flags"]:
                negated = flag.startswith("--no-") and not first.startswith("--no-")
                out.setdefault(flag, (option["dest"], not negated))
    return out


def choose_flags(flags: list[str], offered: set[str]) -> list[str]:
    """Flags with each ``--a|--b`` replaced by the first of its spellings the build offers (the first written
    where it offers none, so that the check against the build names it)."""
    return [
        next((f for f in flag.split("|") if f in offered), flag.split("|")[0])
        if flag.startswith("--") and "|" in flag
        else flag
        for flag in flags
    ]


def check_argv(argv: list[str], version: str, extra_flags: Sequence[dict] = ()) -> None:
    """Parse launch arguments (without the interpreter and module) as SGLang would; raise FlagError naming the flag."""
    known = known_flags(version, extra_flags)
    for arg in argv:
        if arg.startswith("--") and arg.split("=")[0] not in known:
            flag = arg.split("=")[0]
            hint = did_you_mean(flag, known)
            raise FlagError(f"{flag} is not an option of SGLang {version} nor declared in sglang.extra_flags{hint}")
    build_parser(version, extra_flags).parse_args(argv)
