"""The algorithm registry: every decoding algorithm specsweep runs, each declared once.

An algorithm declares
- its parameters: type, default, whether a list sweeps it (and the tag a swept method's name gets);
- its drafter (``drafter``): none (AR, NGRAM), the shared DFlash drafter (DFlash, DDTree: the method's ``drafter``,
  else ``model.drafter``), its own (EAGLE, EAGLE-3, standalone: the method's ``drafter``, required) or the target's
  own multi-token-prediction head (NEXTN: no drafter to name); a draft model's size (``draft_model``: a head sized
  from the target, with the target's layers it fuses, or a model of its own profile);
- how SGLang spells it: flags and environment with ``{placeholders}`` and the attention backend it needs
  (``spelling``; ``algorithms.<name>`` in config overrides each of the three, since forks spell DDTree
  differently). A flag written ``--a|--b`` is the first of the two the running build offers;
- what one round verifies per request (``verify_width``) and in which shape (``shape``: a chain, or a tree of
  some width), which the plan, the simulator's cost model and the report read, and how deep it drafts
  (``draft_depth``: the most drafts a round can accept, the depths of the report's acceptance per depth);
- how the simulator drafts (``drafting``, a mechanism of specsweep.modelling.acceptance: none, block, block-tree,
  draft-model, lookup) and verifies (``custom_mask``: a tree verified with a per-request attention mask);
- how the report groups it: ``title`` and ``size``, the parameter its sweep charts vary, and whether its methods
  are the reference line of the others' (``reference``: DFlash); AR, the one algorithm that does not draft, is the
  baseline every speedup is over (``BASELINE``);
- what the docs' table says of it (``verifies``, ``drafter_doc``, each parameter's ``doc``).

``get`` refuses an unknown algorithm: no algorithm ever falls through to another's behaviour. Everything else that
lists the algorithms is made from ``REGISTRY`` (the simulated server's choices) or written from it by
``tools/docs.py`` and checked by the tests: the configuration schema's algorithm enum and its ``algorithms.<name>``
and ``defaults.<name>`` keys, the cell schema's enum, the table of docs/configuration.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping

from . import ddtree


class AlgorithmError(ValueError):
    """A method's parameters or settings that its algorithm (or SGLang) refuses; the message says what to do, and
    ``key`` names the method's key at fault where it is one key."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class Parameter:
    """One parameter of an algorithm as a method sets it in config (its type and range: config/schema.yaml)."""

    name: str
    kind: type  # int, float or str
    default: object = None  # when neither the method nor ``defaults`` sets it; None: unset (required ones: an error)
    required: bool = False
    sweep_tag: str | None = None  # a list value sweeps it: one method per value, named <name>-<tag><value>
    spelled: bool = True  # the server learns it from the spelling (tree_build: only specsweep's model of the build)
    uncapped: bool = False  # a cap that "uncapped" leaves to the server's build (DDTree's topk)
    flat_default: bool = False  # ``defaults.<name>`` (a flat key of old) sets it for every algorithm that has it
    doc: str = ""  # what docs/configuration.md's table adds to its name and default


# what the sweep tags and placeholders may name
BLOCK_SIZE = Parameter("block_size", int, 16, flat_default=True)
TOPK_CAP = Parameter(
    "topk", int, 8, sweep_tag="t", uncapped=True, flat_default=True, doc="the width cap; `uncapped`: the build's own"
)
# SGLang's forced acceptance (SGLANG_SIMULATE_ACC_LEN, 0.5.16 speculative/spec_utils.py): each verify round of an
# EAGLE-family server commits floor(a) or floor(a) + 1 tokens (weighted so that the mean is a; at most num_steps +
# 1), whatever the drafter proposed. It measures a real engine's cost at a chosen acceptance (dummy weights
# included); never a model's acceptance. Unset: the drafter's own.
FORCED_ACCEPTANCE = Parameter(
    "accept_length", float, None, sweep_tag="a", doc="acceptance forced on the server; unset: the drafter's own"
)


@dataclass(frozen=True)
class Algorithm:
    """AR: one token per forward pass, no drafter. Subclasses are the speculative algorithms."""

    name: str
    title: str
    sglang: str | None = None  # the --speculative-algorithm value (None: no speculative flags)
    parameters: tuple[Parameter, ...] = ()
    # None, "shared" (method's drafter, else model.drafter), "own" (method's, required) or "target" (the target's own
    # multi-token-prediction head: none to name)
    drafter: str | None = None
    drafting: str = "none"  # the simulator's mechanism (specsweep.modelling.acceptance.DRAFTING)
    size: str | None = None  # the parameter the report's sweep charts vary
    overlap: bool = True  # runs under SGLang's overlap scheduler (DDTree: forced off, unless its build runs it)
    custom_mask: bool = False  # verified with a per-request tree mask in attention (any shape)
    spelling: dict = field(default_factory=lambda: {"flags": [], "env": {}, "attention_backend": None})
    reference: bool = False  # the report's sweep charts draw its methods as the reference line of the others'
    verifies: str = "1 token"  # what one round verifies, as docs/configuration.md's table says it
    drafter_doc: str = ""  # what its drafter is, for the docs' table (drafter "own" or "target")

    @property
    def speculative(self) -> bool:
        """Whether it drafts (SGLang's speculative flags); the one algorithm that does not is the BASELINE."""
        return self.sglang is not None

    @property
    def drafter_path(self) -> bool:
        """Whether a drafter's path reaches its server (the method's own, or model.drafter): drafter own or shared."""
        return self.drafter in ("own", "shared")

    @property
    def builds_trees(self) -> bool:
        """Whether it drafts a tree as a DDTree build does (it has a ``tree_build``): the simulator's build, its
        corrupted-tree fault and the report's tree build are its."""
        return any(p.name == "tree_build" for p in self.parameters)

    def parameter(self, name: str) -> Parameter:
        """The parameter of this name (KeyError where the algorithm has none)."""
        found = next((p for p in self.parameters if p.name == name), None)
        if found is None:
            raise KeyError(f"algorithm {self.name} has no parameter {name}")
        return found

    def resolve(self, params: dict) -> dict:
        """The parameters as the server runs them (derived ones filled); AlgorithmError for a combination SGLang
        would refuse or silently change."""
        return dict(params)

    def verify_width(self, params: Mapping) -> int:
        """Tokens verified per request in one round (the target's forward pass)."""
        return 1

    def shape(self, params: Mapping) -> tuple[str, int] | None:
        """("chain", 1) or ("tree", candidates per depth) of what one round verifies; None without drafting."""
        return None

    def draft_depth(self, params: Mapping) -> int:
        """The most drafts one round can accept: its deepest draft position (0 without drafting)."""
        return 0

    def tree(self, params: Mapping) -> tuple[str | None, str | None, int | None]:
        """(tree build, mode, width) of these parameters: the build where it builds trees as a DDTree build does,
        the shape (chain or tree of some width) where it drafts; Nones without drafting."""
        shape = self.shape(params)
        if shape is None:
            return None, None, None
        build = ddtree.build(params.get("tree_build")).name if self.builds_trees else None
        return build, shape[0], shape[1]

    def overlapped(self, params: Mapping) -> bool:
        """Whether it runs under SGLang's overlap scheduler with these parameters (DDTree: as its build runs it)."""
        return self.overlap

    def check(self, params: Mapping, flags: list[str], attention_backend: str | None, spelling: dict) -> None:
        """Settings the server refuses for this algorithm (AlgorithmError)."""

    def check_environment(self, params: Mapping, env: Mapping) -> None:
        """A method's environment that its algorithm cannot read (AlgorithmError, its key ``env``)."""

    def server_flags(self, params: Mapping, drafter: str = "") -> list[str]:
        """The speculative flags of the registry's own spelling for these parameters (resolved) and drafter: what a
        server is started with outside a configuration (the replayed engine, the step-cost benchmark)."""
        values = {"drafter": drafter, **{k: v for k, v in params.items() if v is not None}}
        return [str(flag).format(**values) for flag in self.spelling["flags"]]

    def from_server(self, values: Mapping, env: Mapping) -> dict:
        """The parameters a server started with these flag values (by dest) and environment runs, read by
        inverting the default spelling (each ``FLAG {param}`` pair, each ``VAR: {param}``), then SGLang's own
        defaults where a flag is absent. What the simulated server runs."""
        params: dict = {}
        flags = self.spelling["flags"]
        for flag, value in zip(flags, flags[1:]):
            name = _placeholder(value)
            if name in {p.name for p in self.parameters} and flag.startswith("--"):
                given = values.get(dest(flag.split("|")[0]))
                if given is not None:
                    params[name] = given
        for variable, value in self.spelling["env"].items():
            name = _placeholder(value)
            if name and str(env.get(variable, "")).strip():
                params[name] = env[variable]
        for p in self.parameters:
            if p.name in params:
                params[p.name] = p.kind(params[p.name])
            elif self.server_default(p) is not None:
                params[p.name] = self.server_default(p)
        missing = [p.name for p in self.parameters if p.required and p.name not in params]
        if missing:
            raise AlgorithmError(f"{self.sglang} needs {', '.join(self._flag_of(m) for m in missing)}")
        return self.resolve(params)

    def server_default(self, parameter: Parameter):
        """What the server runs when its spelling does not set the parameter (SGLang 0.5.16's own choice where it
        differs from the registry's default; None: the server decides and specsweep does not know)."""
        return parameter.default

    def spelled(self, spelling: dict) -> set[str]:
        """The parameters a spelling passes to the server (its {placeholders} in flags and env)."""
        values = list(spelling["flags"]) + list(spelling["env"].values())
        return {name for v in values for name in _placeholders(str(v))}

    def flags_set(self, spelling: dict) -> set[str]:
        """The flags a spelling sets (each spelling of a --a|--b alternative)."""
        return {f for flag in spelling["flags"] if str(flag).startswith("--") for f in str(flag).split("|")}

    def _flag_of(self, name: str) -> str:
        flags = self.spelling["flags"]
        return next((f for f, v in zip(flags, flags[1:]) if _placeholder(v) == name), name)


def flag_value(argv: list[str], flag: str) -> str | None:
    """The value a command line gives a flag (``--flag value`` or ``--flag=value``; the last one given wins, as
    with SGLang's parser), or None."""
    value = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1 :]
    return value


def _page_size(flags: list[str]) -> int:
    """The --page-size a command line sets (SGLang's default: 1)."""
    return int(flag_value(flags, "--page-size") or 1)


def _placeholders(text: str) -> list[str]:
    return re.findall(r"\{([a-z_]+)\}", text)


def _placeholder(value) -> str | None:
    text = str(value)
    return text[1:-1] if text.startswith("{") and text.endswith("}") and text.count("{") == 1 else None


def dest(flag: str) -> str:
    """A flag's name as SGLang's argparse stores it and /server_info reports it: --foo-bar is foo_bar."""
    return flag.lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class DFlash(Algorithm):
    """A block-diffusion drafter proposes block_size - 1 tokens in one pass; the target verifies them as a chain."""

    def verify_width(self, params: Mapping) -> int:
        return params["block_size"]

    def shape(self, params: Mapping) -> tuple[str, int]:
        return "chain", 1

    def draft_depth(self, params: Mapping) -> int:
        return params["block_size"] - 1  # the block's first token is the target's own

    def from_server(self, values: Mapping, env: Mapping) -> dict:
        # --speculative-dflash-block-size is SGLang's alias of --speculative-num-draft-tokens for DFLASH
        block = values.get("speculative_dflash_block_size") or values.get("speculative_num_draft_tokens") or 16
        return {"block_size": int(block)}


@dataclass(frozen=True)
class DDTree(Algorithm):
    """A draft tree from the DFlash drafter's per-depth distributions under a node budget, verified in one pass."""

    def resolve(self, params: dict) -> dict:
        try:
            params = dict(params, tree_build=ddtree.build(params.get("tree_build")).name)
        except ValueError as exc:
            raise AlgorithmError(str(exc), key="tree_build") from None
        return params

    def verify_width(self, params: Mapping) -> int:
        return params["budget"] + 1

    def shape(self, params: Mapping) -> tuple[str, int]:
        return ddtree.shape(
            ddtree.build(params.get("tree_build")), params.get("block_size", 16), params["budget"], params.get("topk")
        )

    def draft_depth(self, params: Mapping) -> int:
        # a path of the tree takes one node a depth, from the drafter's block_size - 1 per-depth distributions
        return min(params["budget"], params.get("block_size", 16) - 1)

    def overlapped(self, params: Mapping) -> bool:
        return ddtree.build(params.get("tree_build")).overlap

    def check(self, params: Mapping, flags: list[str], attention_backend: str | None, spelling: dict) -> None:
        refused = ddtree.refusals(
            ddtree.build(params.get("tree_build")),
            params["budget"],
            params.get("block_size", 16),
            params.get("topk"),
            _page_size(flags),
            attention_backend,
        )
        if refused:
            raise AlgorithmError(
                refused, key=refused.split(" ", 1)[0] if refused.startswith(("topk", "budget")) else None
            )
        required = spelling.get("attention_backend")
        if required and attention_backend != required and params["budget"] > params.get("block_size", 16) - 1:
            raise AlgorithmError(
                f"DDTree budget {params['budget']} builds a tree (budget > block_size - 1 = "
                f"{params['block_size'] - 1}), which this build verifies only with {required} attention "
                f"(algorithms.ddtree.attention_backend); remove attention_backend '{attention_backend}' from the method"
            )

    def check_environment(self, params: Mapping, env: Mapping) -> None:
        """The build's tuning read from the environment (its depth bonus) must be a number, and every SGLANG_DDTREE_
        variable one the build reads (where it declares its ``variables``)."""
        tree_build = ddtree.build(params["tree_build"])
        try:
            ddtree.with_environment(tree_build, env)
        except ValueError as exc:
            raise AlgorithmError(str(exc), key="env") from None
        unread = ddtree.unread_variables(tree_build, env)
        if unread:
            raise AlgorithmError(
                f"{', '.join(unread)}: the DDTree build {tree_build.name!r} reads none of these (it reads "
                f"{', '.join(tree_build.variables or ()) or 'no SGLANG_DDTREE_ variable'}); remove them from the "
                "method's env (or the spelling's, algorithms.ddtree.env)",
                key="env",
            )

    def server_default(self, parameter: Parameter):
        return None if parameter.name == "topk" else parameter.default  # no SGLANG_DDTREE_MAX_TOPK: the build's cap

    def from_server(self, values: Mapping, env: Mapping) -> dict:
        params = super().from_server(values, env)
        # the v2-runtime fork spells the block --speculative-ddtree-block-size; PR 29907 as DFlash does
        params["block_size"] = int(
            values.get("speculative_ddtree_block_size") or DFLASH.from_server(values, env)["block_size"]
        )
        params["topk"] = (
            int(env["SGLANG_DDTREE_MAX_TOPK"]) if str(env.get("SGLANG_DDTREE_MAX_TOPK", "")).strip() else None
        )  # unset: the build's own cap
        return params


@dataclass(frozen=True)
class Ngram(Algorithm):
    """N-gram lookup (SGLang's NGRAM): drafts continue the latest earlier occurrences of the context's last tokens,
    num_draft_tokens - 1 nodes grown breadth first (at most max_bfs_breadth children per node) under the last
    token, verified as one tree with a custom mask. No drafter model."""

    def resolve(self, params: dict) -> dict:
        if params["num_draft_tokens"] < 2:
            raise AlgorithmError("num_draft_tokens must be at least 2 (the last token and one draft)")
        return dict(params)

    def verify_width(self, params: Mapping) -> int:
        return params["num_draft_tokens"]  # SGLang pads a short match's tree to every node

    def check(self, params: Mapping, flags: list[str], attention_backend: str | None, spelling: dict) -> None:
        page = _page_size(flags)
        if page > 1 and params["max_bfs_breadth"] > 1 and attention_backend != "flashinfer":
            raise AlgorithmError(
                f"--page-size {page} with max_bfs_breadth {params['max_bfs_breadth']}: SGLang runs "
                "NGRAM trees on pages of more than one token only with flashinfer attention; use "
                "--page-size 1 or attention_backend flashinfer"
            )

    def draft_depth(self, params: Mapping) -> int:
        return params["num_draft_tokens"] - 1  # a single match fills the tree as one chain under the last token

    def shape(self, params: Mapping) -> tuple[str, int]:
        # a tree even at breadth 1: anchors of different lengths may draft different children of the root
        return "tree", params["max_bfs_breadth"]


# attention backends that verify an EAGLE tree (topk > 1) on pages of more than one token (SGLang 0.5.16,
# arg_groups/speculative_hook.py: _PAGE_TREE_SPEC_BACKENDS); trtllm_mha takes topk 1 only
PAGED_TREE_BACKENDS = ("flashinfer", "fa3", "triton")


@dataclass(frozen=True)
class DraftModel(Algorithm):
    """A small autoregressive drafter (EAGLE's one-layer head on the target's hidden states, EAGLE-3's over low,
    middle and high layers, or a standalone small model) drafts num_steps tokens, one forward each; with topk 1
    the target verifies a chain of num_steps + 1 tokens, with topk > 1 a tree of num_draft_tokens nodes (the root
    included): SGLang keeps the topk best paths a step (topk^2 candidates after the first) and verifies the
    num_draft_tokens - 1 most probable candidates. ``draft_model``: "head" (sized from the target) or "model" (its
    own profile); a head fuses the hidden states of ``fused_layers`` of the target's layers (EAGLE-3: low, middle
    and high, each hidden x hidden of its input projection; 0: the last layer's alone, as EAGLE's and an MTP head's)."""

    draft_model: str = "head"
    fused_layers: int = 0

    def resolve(self, params: dict) -> dict:
        steps, topk, tokens = params["num_steps"], params["topk"], params.get("num_draft_tokens")
        forced = params.get("accept_length")
        if forced is not None and not 1 <= forced <= steps + 1:
            raise AlgorithmError(
                f"accept_length {forced:g} is outside 1 .. num_steps + 1 = {steps + 1}: a round commits at most its "
                "drafts and the target's own token (SGLang would clamp it silently)",
                key="accept_length",
            )
        if topk == 1:
            if tokens is not None and tokens != steps + 1:
                raise AlgorithmError(
                    f"num_draft_tokens {tokens} with topk 1: SGLang verifies a chain of num_steps + 1 = {steps + 1} "
                    f"tokens and silently replaces it; set num_draft_tokens to {steps + 1} or leave it out"
                )
            return dict(params, num_draft_tokens=steps + 1)
        most = topk + (steps - 1) * topk * topk + 1  # the root and every candidate of the beams
        if tokens is None:
            raise AlgorithmError(
                f"topk {topk} drafts a tree: set num_draft_tokens, the tree's nodes with the root "
                f"(at most topk + (num_steps - 1) x topk^2 + 1 = {most})"
            )
        if not 2 <= tokens <= most:
            raise AlgorithmError(
                f"num_draft_tokens {tokens} is outside 2 .. {most}: a tree of num_steps {steps} and "
                f"topk {topk} has topk + (num_steps - 1) x topk^2 = {most - 1} candidates to choose from"
            )
        return dict(params)

    def verify_width(self, params: Mapping) -> int:
        return params["num_draft_tokens"]

    def shape(self, params: Mapping) -> tuple[str, int]:
        return ("chain", 1) if params["topk"] == 1 else ("tree", params["topk"])

    def draft_depth(self, params: Mapping) -> int:
        # one draft a step; a tree of fewer nodes than steps cannot reach the last step's
        return min(params["num_steps"], (params.get("num_draft_tokens") or params["num_steps"] + 1) - 1)

    def check(self, params: Mapping, flags: list[str], attention_backend: str | None, spelling: dict) -> None:
        if params["topk"] <= 1:
            return
        page = _page_size(flags)
        if attention_backend == "trtllm_mha":
            raise AlgorithmError(
                f"topk {params['topk']} on trtllm_mha attention: SGLang takes topk 1 only there; "
                "use topk 1 or another attention_backend"
            )
        if page > 1 and attention_backend and attention_backend not in PAGED_TREE_BACKENDS:
            raise AlgorithmError(
                f"topk {params['topk']} with --page-size {page} on {attention_backend} attention: "
                f"SGLang verifies such trees only on {', '.join(PAGED_TREE_BACKENDS)}; use "
                "--page-size 1, topk 1 or one of those backends"
            )

    def server_default(self, parameter: Parameter):
        return None if parameter.name == "num_draft_tokens" else parameter.default


def _draft_model(
    name: str, title: str, sglang: str, draft_model: str, drafter_doc: str, drafter: str = "own", fused_layers: int = 0
) -> DraftModel:
    """A draft-model algorithm of SGLang's EAGLE worker (EAGLE's parameters, spelling and forced acceptance); its
    drafter's path is passed where the method names one (``drafter`` "own"), else the server finds the target's own
    head (``drafter`` "target")."""
    path = ["--speculative-draft-model-path", "{drafter}"] if drafter == "own" else []
    return DraftModel(
        name,
        title,
        sglang,
        drafter=drafter,
        drafting="draft-model",
        size="num_draft_tokens",
        draft_model=draft_model,
        fused_layers=fused_layers,
        parameters=(
            Parameter("num_steps", int, 3, sweep_tag="s"),
            Parameter("topk", int, 1, sweep_tag="t"),
            Parameter(
                "num_draft_tokens", int, None, sweep_tag="d", doc="`num_steps` + 1 for a chain; required for a tree"
            ),
            FORCED_ACCEPTANCE,
        ),
        custom_mask=True,
        verifies="topk 1: a chain of `num_steps` + 1; topk > 1: a tree of `num_draft_tokens`",
        drafter_doc=drafter_doc,
        spelling={
            "flags": [
                "--speculative-algorithm",
                sglang,
                *path,
                "--speculative-num-steps",
                "{num_steps}",
                "--speculative-eagle-topk",
                "{topk}",
                "--speculative-num-draft-tokens",
                "{num_draft_tokens}",
            ],
            "env": {"SGLANG_SIMULATE_ACC_LEN": "{accept_length}"},
            "attention_backend": None,
        },
    )


AR = Algorithm("ar", "AR")
DFLASH = DFlash(
    "dflash",
    "DFlash",
    "DFLASH",
    (BLOCK_SIZE,),
    drafter="shared",
    drafting="block",
    size="block_size",
    reference=True,
    verifies="a chain of `block_size`",
    spelling={
        "flags": [
            "--speculative-algorithm",
            "DFLASH",
            "--speculative-draft-model-path",
            "{drafter}",
            "--speculative-dflash-block-size",
            "{block_size}",
        ],
        "env": {},
        "attention_backend": None,
    },
)
DDTREE = DDTree(
    "ddtree",
    "DDTree",
    "DDTREE",
    (
        BLOCK_SIZE,
        Parameter("budget", int, required=True, sweep_tag="b"),
        TOPK_CAP,
        Parameter("tree_build", str, ddtree.DEFAULT_BUILD, spelled=False, doc="the build whose tree it runs"),
    ),
    drafter="shared",
    drafting="block-tree",
    size="budget",
    overlap=False,
    custom_mask=True,
    verifies="`budget` + 1 nodes: a chain in spine mode, else a tree of the build's width",
    # sgl-project/sglang pull request 29907: page size 1, triton attention for tree budgets
    spelling={
        "flags": [
            "--speculative-algorithm",
            "DDTREE",
            "--speculative-draft-model-path",
            "{drafter}",
            "--speculative-dflash-block-size",
            "{block_size}",
            "--speculative-ddtree-budget",
            "{budget}",
            "--page-size",
            "1",
        ],
        "env": {"SGLANG_DDTREE_MAX_TOPK": "{topk}"},
        "attention_backend": "triton",
    },
)
NGRAM = Ngram(
    "ngram",
    "NGRAM",
    "NGRAM",
    (
        Parameter("num_draft_tokens", int, 12, sweep_tag="d"),
        Parameter("max_bfs_breadth", int, 10, sweep_tag="w"),
        Parameter("match_type", str, "BFS", sweep_tag="m", doc="or `PROB`: the most frequent first"),
    ),
    drafting="lookup",
    size="num_draft_tokens",
    custom_mask=True,
    verifies="a tree of `num_draft_tokens` nodes",
    # SGLang 0.5.16's defaults: 12 draft tokens, breadth 1..10, BFS (recency) matching, trie depth 18
    spelling={
        "flags": [
            "--speculative-algorithm",
            "NGRAM",
            "--speculative-num-draft-tokens",
            "{num_draft_tokens}",
            "--speculative-ngram-max-bfs-breadth",
            "{max_bfs_breadth}",
            "--speculative-ngram-match-type",
            "{match_type}",
        ],
        "env": {},
        "attention_backend": None,
    },
)
EAGLE = _draft_model("eagle", "EAGLE", "EAGLE", "head", "an EAGLE head")
EAGLE3 = _draft_model("eagle3", "EAGLE-3", "EAGLE3", "head", "an EAGLE-3 head", fused_layers=3)
STANDALONE = _draft_model(
    "standalone", "standalone drafter", "STANDALONE", "model", "a small model of the target's family"
)
# SGLang's multi-token-prediction heads: NEXTN is EAGLE run with the head the target ships (DeepSeek-V3's MTP module,
# and its kin): server_args rewrites it to EAGLE and reads the draft model from the target's own checkpoint
NEXTN = _draft_model("nextn", "NEXTN", "NEXTN", "head", "the target's own multi-token-prediction head", "target")

REGISTRY: dict[str, Algorithm] = {a.name: a for a in (AR, DFLASH, DDTREE, NGRAM, EAGLE, EAGLE3, STANDALONE, NEXTN)}
# every parameter any algorithm has: a key that means nothing for a method's algorithm is refused by name
PARAMETER_NAMES = tuple(dict.fromkeys(p.name for a in REGISTRY.values() for p in a.parameters))


def _baseline() -> str:
    """The one algorithm that does not draft (AR): every speedup is over it, a calibration starts its server first."""
    plain = [a.name for a in REGISTRY.values() if not a.speculative]
    if len(plain) != 1:
        raise AlgorithmError(f"the registry needs one algorithm without drafting, the baseline; it has {plain}")
    return plain[0]


BASELINE = _baseline()


def get(name: str) -> Algorithm:
    """The registered algorithm, or AlgorithmError naming the known ones (never another's behaviour)."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise AlgorithmError(
            f"unknown algorithm {name!r}; known: {', '.join(REGISTRY)} (specsweep/algorithms.py)"
        ) from None


def by_sglang_name(value: str) -> Algorithm:
    """The algorithm a --speculative-algorithm value names (AlgorithmError for one specsweep does not know)."""
    for algorithm in REGISTRY.values():
        if algorithm.sglang == value:
            return algorithm
    raise AlgorithmError(
        f"--speculative-algorithm {value!r} is not one specsweep knows "
        f"({', '.join(a.sglang for a in REGISTRY.values() if a.sglang)})"
    )


def spelling(name: str, overrides: Mapping | None) -> dict:
    """An algorithm's spelling: the registry's, with config's ``algorithms.<name>`` keys replacing its own."""
    own = get(name).spelling
    given = (overrides or {}).get(name) or {}
    return {key: given[key] if key in given else own[key] for key in ("flags", "env", "attention_backend")}


def with_parameter(name: str) -> list[str]:
    """The algorithms that have a parameter of this name, in the registry's order."""
    return [a.name for a in REGISTRY.values() if any(p.name == name for p in a.parameters)]
