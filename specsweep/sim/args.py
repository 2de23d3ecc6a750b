"""The simulated SGLang-compatible server's command line, and the decoding it asks for.

Run as ``python -m specsweep.sim`` with SGLang's launch flags (the subset
specsweep uses) plus ``--sim-*`` flags for the emulated hardware. It waits
out each modelled engine step instead of computing, on an absolute schedule
(specsweep.sim.clock: a step ends at its modelled deadline, its own Python work
done inside it); steps whose work ran past their deadline are counted in
/server_info's ``sim_clock`` and /metrics' ``specsweep_sim:*`` counters. Every
response says ``simulated``.

``--sim-time-scale S`` runs its clock S times fast: every modelled duration (start-up, each engine step) lasts
1/S of its modelled seconds (the hang fault still never ends), while the durations it reports itself
(``e2e_latency`` and ``queue_time`` in meta_info) stay in modelled seconds. What a client measures then lasts
about 1/S of what it would at S = 1 (host overheads do not scale), so only checks of the workflow's plumbing use
it; ``/get_server_info`` gives ``sim_time_scale`` for the cell's provenance.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import yaml

from .. import algorithms
from ..ddtree import DEFAULT_BUILD
from ..ddtree import builds as ddtree_builds
from ..ddtree import define as define_ddtree_builds
from ..modelling.decoding import Decoding
from ..sglang_options import add_option, available_tables, load_table


def _merge_config_file(argv: list[str]) -> list[str]:
    """SGLang's --config FILE: launch options from a YAML file (key: value), given before the command line's."""
    if "--config" not in argv:
        return argv
    i = argv.index("--config")
    with open(argv[i + 1]) as handle:
        options = yaml.safe_load(handle) or {}
    extra = []
    for key, value in options.items():
        flag = "--" + str(key).replace("_", "-")
        if value is True:
            extra.append(flag)
        elif value not in (False, None):
            extra += [flag, str(value)]
    return extra + argv[:i] + argv[i + 2 :]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The server's arguments: SGLang's flags it models, its own ``--sim-*`` flags, and every other flag of the
    recorded SGLang releases and the declared build flags (``--sim-accept-flag``), accepted and not modelled (those
    given are listed in ``sim_unmodelled_flags``); SGLang's --config file read first. Refuses (argparse's error) a
    speculative decoding SGLang would refuse at start-up."""
    argv = _merge_config_file(list(sys.argv[1:] if argv is None else argv))
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--sim-accept-flag", action="append", default=[])
    pre.add_argument("--sim-ddtree-builds", type=json.loads, default={})
    known = pre.parse_known_args(argv)[0]
    accepted = known.sim_accept_flag
    if known.sim_ddtree_builds:  # the configuration's own builds, before --sim-ddtree-build's choices
        define_ddtree_builds(known.sim_ddtree_builds)
    p = argparse.ArgumentParser(prog="python -m specsweep.sim", description=__doc__)
    _add_sglang_flags(p)
    _add_sim_flags(p)
    _add_fault_flags(p)
    modelled = set(p._option_string_actions)  # the flags the simulator models (every later one it accepts only)
    _accept_sglang_flags(p, accepted)
    args = p.parse_args(argv)
    declared = {item.partition(":")[0] for item in accepted} - modelled
    # the declared build flags given, accepted and not modelled: logged, and in /server_info
    args.sim_unmodelled_flags = sorted(
        f for f in declared if getattr(args, algorithms.dest(f), None) not in (None, False)
    )
    if args.speculative_algorithm:
        _check_speculative(p, args)
    return args


def _add_sglang_flags(p: argparse.ArgumentParser) -> None:
    """The SGLang launch flags the simulator models."""
    p.add_argument("--api-key", help="require this key as a bearer token on every endpoint but /health")
    p.add_argument("--model-path", required=True)
    p.add_argument("--served-model-name")
    p.add_argument("--tp-size", "--tp", type=int, default=1)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--speculative-algorithm", choices=[a.sglang for a in algorithms.REGISTRY.values() if a.sglang])
    p.add_argument("--speculative-draft-model-path", "--speculative-draft-model")
    p.add_argument("--speculative-dflash-block-size", type=int)
    p.add_argument("--speculative-num-draft-tokens", type=int)
    p.add_argument("--speculative-num-steps", type=int)
    p.add_argument("--speculative-eagle-topk", type=int)
    p.add_argument("--speculative-ngram-max-bfs-breadth", type=int)
    p.add_argument("--speculative-ngram-match-type", choices=["BFS", "PROB"])
    p.add_argument("--speculative-ddtree-budget", type=int)
    p.add_argument("--speculative-ddtree-block-size", type=int)  # the v2-runtime fork's own block-size flag
    # a DDTree build's stage profiler (the v2-runtime fork's): records of the cost model's split of each round
    p.add_argument("--speculative-ddtree-profile", action="store_true")
    p.add_argument("--speculative-ddtree-profile-interval", type=int, default=50)
    p.add_argument("--speculative-ddtree-profile-output")
    p.add_argument("--page-size", type=int, default=1)
    p.add_argument("--max-running-requests", type=int, default=256)
    p.add_argument("--cuda-graph-max-bs", type=int)
    p.add_argument("--context-length", type=int, default=131072)
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--disable-overlap-schedule", action="store_true")
    p.add_argument("--random-seed", type=int, default=0)


def _add_sim_flags(p: argparse.ArgumentParser) -> None:
    """The simulator's own flags: the emulated GPU, model and runtime profiles, its clock, DDTree builds, tokenizer,
    acceptance and the build flags it accepts."""
    p.add_argument("--sim-gpu", default="H200")
    p.add_argument("--sim-model-profile", default="qwen3-8b")
    p.add_argument("--sim-startup-seconds", type=float, default=0.5)
    p.add_argument(
        "--sim-time-scale",
        type=_positive_float,
        default=1.0,
        metavar="S",
        help="run the clock S times fast: each modelled duration lasts 1/S of its seconds (tests of "
        "plumbing; reported durations stay modelled)",
    )
    p.add_argument(
        "--sim-ddtree-build",
        default=DEFAULT_BUILD,
        choices=sorted(ddtree_builds()),
        help="which build's DDTree to emulate (specsweep/data/ddtree_builds.yaml)",
    )
    p.add_argument(
        "--sim-ddtree-builds",
        metavar="JSON",
        help="DDTree builds of the configuration's own (ddtree_builds): {name: fields}",
    )
    p.add_argument("--sim-runtime", default="sglang", help="runtime profile: sglang or hf-eager")
    p.add_argument(
        "--sim-tokenizer",
        choices=["model", "approximate"],
        default="approximate",
        help="count prompt tokens with the model's tokenizer (as a real server) or the word splitter (sim.tokenizer)",
    )
    p.add_argument(
        "--sim-draft-model-profile",
        default="qwen3-0.6b",
        help="model profile of a STANDALONE drafter (EAGLE heads are sized from the target's profile)",
    )
    p.add_argument("--sim-profiles", help="JSON: profile overrides {gpus: {...}, models: {...}, runtimes: {...}}")
    p.add_argument(
        "--sim-acceptance", help="JSON: acceptance-model parameters (see specsweep.modelling.acceptance.ACCEPTANCE)"
    )
    p.add_argument(
        "--sim-accept-flag",
        action="append",
        default=[],
        metavar="FLAG:TYPE",
        help="accept (and ignore) a flag of a server build, e.g. --speculative-ddtree-foo:int",
    )


def _add_fault_flags(p: argparse.ArgumentParser) -> None:
    """Faults a test can inject: crashes, a server never ready, hung, failed, cut or corrupted streams."""
    p.add_argument(
        "--sim-crash-after",
        type=int,
        default=int(os.environ.get("SPECSWEEP_SIM_CRASH_AFTER", "0")),
        metavar="N",
        help="fault: exit abruptly when request N arrives (0: never; default from "
        "SPECSWEEP_SIM_CRASH_AFTER, so a method's env can set it)",
    )
    p.add_argument("--sim-crash-at-start", action="store_true", help="fault: fail while loading, before listening")
    p.add_argument("--sim-never-ready", action="store_true", help="fault: /health_generate never succeeds")
    p.add_argument(
        "--sim-hang-after-tokens",
        type=int,
        default=0,
        metavar="N",
        help="fault: every stream stops sending (without closing) after N tokens",
    )
    p.add_argument(
        "--sim-error-rate",
        type=float,
        default=0.0,
        metavar="P",
        help="fault: answer a share P of generation requests with HTTP 500 (seeded)",
    )
    p.add_argument(
        "--sim-truncate-rate",
        type=float,
        default=0.0,
        metavar="P",
        help="fault: cut a share P of streams mid-way, without [DONE] (seeded)",
    )
    p.add_argument(
        "--sim-corrupt-tree-from",
        type=int,
        default=0,
        metavar="K",
        help="fault: DDTree outputs go wrong from tree depth K on, as when state leaks between branches",
    )


def _check_speculative(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse (``p.error``) a speculative decoding SGLang refuses at start-up: a drafter missing or given where the
    algorithm takes none, a block size and draft-token count that disagree, parameters the algorithm rejects."""
    spec = algorithms.by_sglang_name(args.speculative_algorithm)
    if spec.drafter_path and not args.speculative_draft_model_path:
        p.error(f"--speculative-draft-model-path is required with --speculative-algorithm {spec.sglang}")
    if spec.drafter is None and args.speculative_draft_model_path:
        p.error(f"--speculative-algorithm {spec.sglang} takes no draft model")
    block = args.speculative_dflash_block_size
    if block and args.speculative_num_draft_tokens and block != args.speculative_num_draft_tokens:
        p.error("--speculative-dflash-block-size and --speculative-num-draft-tokens disagree")
    try:
        decoding_from_args(args)
    except ValueError as exc:  # what SGLang refuses at start-up
        p.error(str(exc))


def _positive_float(text: str) -> float:
    value = float(text)
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive finite number, not {text}")
    return value


def _accept_sglang_flags(parser: argparse.ArgumentParser, extra: list[str]) -> None:
    """Accept every flag of the recorded SGLang releases (ignored when not modelled), and declared build flags."""
    group = parser.add_argument_group("SGLang flags accepted and not modelled")
    for version in available_tables():
        for option in load_table(version)["options"]:
            add_option(group, option["flags"], option["nargs"], option["type"], None)
    for item in extra:
        flag, _, kind = item.partition(":")
        add_option(group, [flag], 0 if kind == "bool" else None, None if kind == "bool" else (kind or "str"), None)


def decoding_from_args(args: argparse.Namespace, env=None) -> Decoding:
    """What the server decodes with, read from SGLang's flags and environment as SGLang resolves them
    (specsweep.algorithms: each algorithm's own flags, SGLang's defaults where one is absent)."""
    env = os.environ if env is None else env
    if not args.speculative_algorithm:
        return Decoding.of_params(algorithms.BASELINE, {}, not args.disable_overlap_schedule, env)
    spec = algorithms.by_sglang_name(args.speculative_algorithm)
    params = spec.from_server(vars(args), env)
    if spec.builds_trees:
        params = spec.resolve(dict(params, tree_build=args.sim_ddtree_build))
    return Decoding.of_params(spec.name, params, not args.disable_overlap_schedule, env)
