"""DDTree as each build constructs its draft tree.

Builds differ (specsweep/data/ddtree_builds.yaml): SGLang's pull request 29907
verifies a plain chain at budgets up to block_size - 1 (spine mode) and above
that a best-first tree whose width grows with the budget; the paper's tree is
the ``budget`` most probable prefixes at every budget. A method names its build
in config (``tree_build``); the simulated backend, the plan and the report use
the same description.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import yaml

DEFAULT_BUILD = "sglang-pr29907"


@dataclass(frozen=True)
class TreeBuild:
    """One build's tree rules (see the data file for what each field means)."""

    name: str
    source: str
    spine_mode: bool
    width: str  # "budget" | "topk"
    max_topk: int
    depth_bonus: float
    early_stop_margin: float | None


@lru_cache(maxsize=1)
def builds() -> dict[str, TreeBuild]:
    """The known builds, by name."""
    raw = yaml.safe_load(resources.files("specsweep").joinpath("data/ddtree_builds.yaml").read_text())
    return {name: TreeBuild(name=name, **fields) for name, fields in raw.items()}


def build(name: str | None) -> TreeBuild:
    """A build by name (None: the default); a clear error naming the known ones otherwise."""
    known = builds()
    name = name or DEFAULT_BUILD
    if name not in known:
        raise ValueError(f"unknown DDTree build {name!r}; known builds: {', '.join(sorted(known))} "
                         "(specsweep/data/ddtree_builds.yaml)")
    return known[name]


def shape(tree_build: TreeBuild, block_size: int, budget: int, topk: int | None) -> tuple[str, int]:
    """What a build verifies at a budget: ("chain", 1) in spine mode, else ("tree", width).

    Width (candidates per depth) = topk for the paper's tree; for PR 29907's
    min(max(budget // (block_size - 1) + 1, 2), cap), cap = topk or the build's max_topk.
    """
    depths = block_size - 1
    if tree_build.spine_mode and budget <= depths:
        return "chain", 1
    cap = topk or tree_build.max_topk
    if tree_build.width == "budget":
        return "tree", min(max(budget // max(depths, 1) + 1, 2), cap)
    return "tree", cap


def tree_prefixes(tree_build: TreeBuild, log_probs: tuple, budget: int, width: int, mode: str) -> frozenset:
    """The drafted nodes a build verifies, as prefixes (tuples of per-depth candidate ranks).

    ``log_probs[d][r]``: the drafter's log-probability of its rank-r candidate at depth d. A chain is the rank-0
    prefixes up to ``budget`` long. A tree is grown best first: pop the most probable prefix, then push its next
    sibling (rank + 1, below ``width``) and its first child (plus the depth bonus); branches below the early-stop
    threshold are skipped, the rank-0 spine never.
    """
    depths = len(log_probs)
    if mode == "chain":
        return frozenset(tuple([0] * n) for n in range(1, min(budget, depths) + 1))
    first = log_probs[0][0]
    margin = tree_build.early_stop_margin
    threshold = first - math.log(max(budget, 1)) - margin if margin is not None else -math.inf
    tree: set = set()
    heap = [(-first, (0,))]
    while heap and len(tree) < budget:
        negative, prefix = heapq.heappop(heap)
        logw = -negative
        if logw < threshold and any(prefix):
            continue
        tree.add(prefix)
        depth, rank = len(prefix) - 1, prefix[-1]
        if rank + 1 < min(width, len(log_probs[depth])):
            heapq.heappush(heap, (-(logw - log_probs[depth][rank] + log_probs[depth][rank + 1]),
                                  prefix[:-1] + (rank + 1,)))
        if depth + 1 < depths:
            heapq.heappush(heap, (-(logw + log_probs[depth + 1][0] + tree_build.depth_bonus), prefix + (0,)))
    return frozenset(tree)
