"""How a server decodes: an algorithm of the registry (specsweep.algorithms) and its parameters, as the acceptance
model draws its rounds and the cost model prices its steps."""

from __future__ import annotations

from dataclasses import dataclass

from .. import algorithms, ddtree


@dataclass(frozen=True, repr=False)
class Decoding:
    """How the simulated server decodes: an algorithm of the registry and its parameters.

    Its repr seeds the acceptance draws; the parameters an algorithm does not have stay out of it (and the rank
    probe, the depth bonus and the overlap scheduler, which change nothing that is drawn). ``overlap`` is the
    scheduler as the server runs it: off where the algorithm forces it off (DDTree), whatever the flags say.
    """

    algorithm: str = algorithms.BASELINE  # a name of specsweep.algorithms.REGISTRY
    block_size: int = 16
    budget: int = 0
    topk: int | None = None  # DDTree width cap (SGLANG_DDTREE_MAX_TOPK; None: the build's default); draft models' topk
    overlap: bool = True
    tree_build: str = ddtree.DEFAULT_BUILD  # DDTree: which build's tree (specsweep/data/ddtree_builds.yaml)
    # DDTree: PR 29907's rank probe (SGLANG_DDTREE_RANK_PROBE), a diagnostic that does not change what is drafted
    # or accepted
    rank_probe: bool = False
    # DDTree: the build's depth bonus as the server's environment sets it (None: the build's default)
    depth_bonus: float | None = None
    num_steps: int = 0  # draft models: drafter forwards per round
    num_draft_tokens: int = 0  # NGRAM, draft models: tokens verified per request
    max_bfs_breadth: int = 0  # NGRAM
    match_type: str = ""  # NGRAM: BFS or PROB
    accept_length: float | None = None  # draft models: acceptance forced (SGLANG_SIMULATE_ACC_LEN); None: drawn

    _SEEDED = ("algorithm", "block_size", "budget", "topk", "tree_build")
    _OPTIONAL = ("num_steps", "num_draft_tokens", "max_bfs_breadth", "match_type", "accept_length")

    def __post_init__(self):
        algorithms.get(self.algorithm)  # an unknown algorithm is refused, never decoded as another

    def __repr__(self) -> str:
        return f"Decoding({', '.join(self._fields(self._SEEDED))})"

    def _fields(self, names: tuple) -> list[str]:
        fields_ = [f"{k}={getattr(self, k)!r}" for k in names]
        return fields_ + [f"{k}={getattr(self, k)!r}" for k in self._OPTIONAL if getattr(self, k)]

    def describe(self) -> str:
        """What a server runs, as its log says it: the seeded fields and the overlap scheduler as charged."""
        return f"Decoding({', '.join(self._fields(self._SEEDED + ('overlap',)))})"

    @property
    def spec(self) -> algorithms.Algorithm:
        return algorithms.get(self.algorithm)

    @classmethod
    def of_build(
        cls, algorithm: str, block_size: int, budget: int, topk: int | None, overlap: bool, tree_build: str, env
    ) -> "Decoding":
        """A decoding as a server with this environment runs it (rank probe, the build's depth-bonus variable)."""
        default = ddtree.build(tree_build)
        tuned = ddtree.with_environment(default, env)
        return cls(
            algorithm,
            block_size,
            budget,
            topk,
            overlap,
            tree_build,
            ddtree.rank_probe_on(env),
            None if tuned is default else tuned.depth_bonus,
        )

    @classmethod
    def of_params(cls, algorithm: str, params: dict, overlap: bool, env) -> "Decoding":
        """A decoding from an algorithm's parameters (a method's, or what a server's flags say), as a server with
        this environment runs it; ``overlap``: the scheduler is not switched off (the cost model knows which
        algorithms run without it anyway)."""
        spec = algorithms.get(algorithm)
        overlap = overlap and spec.overlapped(params)
        if spec.drafting in ("block", "block-tree", "none"):
            return cls.of_build(
                algorithm,
                params.get("block_size", 16),
                params.get("budget", 0),
                params.get("topk"),
                overlap,
                params.get("tree_build") or ddtree.DEFAULT_BUILD,
                env,
            )
        return cls(
            algorithm,
            topk=params.get("topk"),
            overlap=overlap,
            num_steps=params.get("num_steps", 0),
            num_draft_tokens=params.get("num_draft_tokens", 0),
            max_bfs_breadth=params.get("max_bfs_breadth", 0),
            match_type=params.get("match_type", ""),
            accept_length=params.get("accept_length"),
        )

    def params(self) -> dict:
        """The algorithm's parameters (the registry's names) as this decoding has them; an optional one left unset
        (None, with no default: forced acceptance) is left out, as a method leaves it out."""
        values = {p.name: getattr(self, p.name) for p in self.spec.parameters}  # every one is a field here
        return {k: v for k, v in values.items() if v is not None or self.spec.parameter(k).default is not None}

    def verify_width(self) -> int:
        """Tokens verified per request per step: 1 (AR), block (DFlash), budget + 1 (DDTree), num_draft_tokens
        (NGRAM and draft models; num_steps + 1 for a draft model's chain)."""
        return self.spec.verify_width(self.params())

    def shape(self) -> tuple[str, int] | None:
        """("chain", 1) or ("tree", width) of what a round verifies (the registry's); None for AR."""
        return self.spec.shape(self.params())

    def verifies_tree(self) -> bool:
        """Whether a round verifies a tree (``shape``), not a chain or AR's one token."""
        shape = self.shape()
        return shape is not None and shape[0] == "tree"

    def depths(self) -> int:
        """Draft depths a round can accept: block_size - 1 (DFlash, DDTree), num_steps (draft models),
        num_draft_tokens - 1 (NGRAM: at most a chain of every node)."""
        kind = self.spec.drafting
        if kind in ("block", "block-tree"):
            return self.block_size - 1
        if kind == "draft-model":
            return self.num_steps
        return max(0, self.num_draft_tokens - 1) if kind == "lookup" else 0

    def probes_ranks(self) -> bool:
        """Whether its steps run the rank probe: DDTree in tree mode with the probe on."""
        return self.rank_probe and self.builds_tree()

    def tree_shape(self) -> tuple[str, int] | None:
        """DDTree (an algorithm that builds trees as a DDTree build does): ("chain", 1) or ("tree", width) as its build
        runs this budget; None otherwise."""
        if not self.spec.builds_trees:
            return None
        return ddtree.shape(ddtree.build(self.tree_build), self.block_size, self.budget, self.topk)

    def tree_build_of(self) -> ddtree.TreeBuild | None:
        """The DDTree build this decoding runs (None for an algorithm that builds no DDTree tree)."""
        return ddtree.build(self.tree_build) if self.spec.builds_trees else None

    def builds_tree(self) -> bool:
        """DDTree whose build grows a tree at this budget (``tree_shape``), not a chain."""
        shape = self.tree_shape()
        return shape is not None and shape[0] == "tree"
