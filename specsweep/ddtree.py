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
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, replace
from dataclasses import fields as dataclass_fields
from functools import lru_cache
from importlib import resources

from .canon import yaml_data
from .sglang_options import DECODING_PREFIX, decoding_variable

DEFAULT_BUILD = "sglang-pr29907"
RANK_PROBE_ENV = "SGLANG_DDTREE_RANK_PROBE"


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
    depth_bonus_env: str | None = None  # the environment variable that sets depth_bonus in this build, if any
    # whether a method's topk caps the width (SGLANG_DDTREE_MAX_TOPK in PR 29907); False: the build has no cap, its
    # proposal top-k is its own (a fork's: the budget) and a method must say topk "uncapped"
    topk_cap: bool = True
    # the SGLANG_ variables the build reads, as its source was read (None: not declared, nothing checked); a method's
    # SGLANG_DDTREE_ variable the build does not read is refused before any job, and on the GPU host the installed
    # package's speculative sources must name each one (environment.check_methods)
    variables: tuple[str, ...] | None = None
    overlap: bool = False  # DDTree runs under SGLang's overlap scheduler (PR 29907: off; a v2-runtime fork: on)
    page_size: int | None = None  # the one --page-size its tree verify takes (None: any)
    attention_backends: tuple[str, ...] | None = None  # the attention backends its tree verify takes (None: any)
    profiler: bool = False  # it has the stage profiler (--speculative-ddtree-profile; specsweep.ddtree_profile)
    # the budget must reach the drafter's whole depth, block_size - 1 (the fork follows the accepted path as
    # block_size - 1 tokens: a tree of fewer nodes fails its first verify, "size of tensor a (15) must match the size
    # of tensor b (8)" at budget 8, block 16, on the lent H200); a smaller budget is refused before any job
    full_depth_budget: bool = False
    # the build's own round costs, measured on it: runtime parameters of the cost model (cost.RUNTIME_BOUNDS, checked
    # by cost.cost_term_problems) that price its tree rounds over the runtime profile's (CostModel.with_build_costs),
    # as (name, value) pairs
    costs: tuple[tuple[str, float], ...] = ()

    def cost_terms(self) -> dict[str, float]:
        """The build's own round costs as runtime parameters (empty: the runtime profile's alone)."""
        return dict(self.costs)


# how wide a tree is at a depth: "budget": PR 29907's rule from the budget; "topk": the method's cap (else
# max_topk); "proposal": the budget itself (a fork that proposes min(budget, vocab) candidates a depth, no cap)
WIDTHS = ("budget", "topk", "proposal")
MAX_CANDIDATES = 32  # ranked candidates per depth a build may take (the simulator's and the plan's lists)


@lru_cache(maxsize=1)
def shipped_builds() -> dict[str, TreeBuild]:
    """The builds specsweep ships (specsweep/data/ddtree_builds.yaml), by name."""
    raw = yaml_data(resources.files("specsweep").joinpath("data/ddtree_builds.yaml").read_text())
    return {name: tree_build(name, fields, "specsweep/data/ddtree_builds.yaml") for name, fields in raw.items()}


_DEFINED: dict[str, TreeBuild] = {}  # the configuration's own builds (ddtree_builds), as this process read them


def tree_build(name: str, fields: Mapping, where: str) -> TreeBuild:
    """A build from its fields (the data file's or the configuration's), checked: a clear error naming ``where``
    and the field otherwise."""
    if not name:
        raise ValueError(f"{where}: a build named '' (an empty name); give it a name")
    declared = {f.name: f for f in dataclass_fields(TreeBuild) if f.name != "name"}
    unknown = sorted(set(fields) - set(declared))
    if unknown:
        raise ValueError(
            f"{where}.{name}.{unknown[0]}: not a field of a DDTree build; known: {', '.join(sorted(declared))}"
        )
    missing = sorted(n for n, f in declared.items() if f.default is MISSING and n not in fields)
    if missing:
        raise ValueError(f"{where}.{name}: '{missing[0]}' is required (the fields: specsweep/data/ddtree_builds.yaml)")
    if fields["width"] not in WIDTHS:
        raise ValueError(f"{where}.{name}.width: one of {', '.join(WIDTHS)}, not {fields['width']!r}")
    if not isinstance(fields["max_topk"], int) or not 1 <= fields["max_topk"] <= MAX_CANDIDATES:
        raise ValueError(f"{where}.{name}.max_topk: an integer from 1 to {MAX_CANDIDATES}, not {fields['max_topk']!r}")
    variable = fields.get("depth_bonus_env")
    if variable is not None and not (isinstance(variable, str) and decoding_variable(variable)):
        raise ValueError(
            f"{where}.{name}.depth_bonus_env: {variable!r} is not a variable of SGLang's kind ({DECODING_PREFIX}..., "
            "which only the configuration sets and the cells' keys hold); a variable the host sets for itself "
            "(PATH, HOME, ...) would reach the server as the build's depth bonus. Name the build's own variable, "
            "e.g. SGLANG_DDTREE_DEPTH_BONUS, or null"
        )
    listed = {}
    for key in ("variables", "attention_backends"):
        value = fields.get(key)
        if value is not None and not (isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)):
            raise ValueError(f"{where}.{name}.{key}: a list of names, or null, not {value!r}")
        listed[key] = None if value is None else tuple(value)
    for variable in listed["variables"] or ():
        if not decoding_variable(variable):
            raise ValueError(
                f"{where}.{name}.variables: {variable!r} is not a variable of SGLang's kind ({DECODING_PREFIX}...)"
            )
    costs = fields.get("costs") or {}
    numbers = isinstance(costs, Mapping) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in costs.values()
    )
    if not numbers:
        raise ValueError(f"{where}.{name}.costs: a mapping of runtime parameters to numbers, not {costs!r}")
    for key in ("topk_cap", "full_depth_budget", "overlap", "profiler"):
        if key in fields and not isinstance(fields[key], bool):
            raise ValueError(f"{where}.{name}.{key}: true or false, not {fields[key]!r}")
    page = fields.get("page_size")
    if page is not None and not (isinstance(page, int) and page >= 1):
        raise ValueError(f"{where}.{name}.page_size: a positive integer or null, not {page!r}")
    terms = tuple(sorted((str(k), float(v)) for k, v in costs.items()))
    return TreeBuild(name=name, **{**fields, **listed, "costs": terms})


def define(defined: Mapping | None) -> dict[str, TreeBuild]:
    """Make the configuration's builds (``ddtree_builds``: name -> fields) known to this process, in place of any it
    defined before; a name of a shipped build is refused. Returns them."""
    out = {}
    for name, fields in (defined or {}).items():
        if name in shipped_builds():
            raise ValueError(
                f"ddtree_builds.{name}: a shipped build has this name (specsweep/data/ddtree_builds.yaml); "
                "give yours another"
            )
        out[name] = tree_build(name, fields, "ddtree_builds")
    if out != _DEFINED:
        _DEFINED.clear()
        _DEFINED.update(out)
    return out


def builds() -> dict[str, TreeBuild]:
    """The known builds, by name: the shipped ones and the configuration's (``define``)."""
    return {**shipped_builds(), **_DEFINED}


def build(name: str | None) -> TreeBuild:
    """A build by name (None: the default); a clear error naming the known ones otherwise."""
    known = builds()
    name = DEFAULT_BUILD if name is None else name
    if name not in known:
        raise ValueError(
            f"unknown DDTree build {name!r}; known builds: {', '.join(sorted(known))} "
            "(specsweep/data/ddtree_builds.yaml, or define it under ddtree_builds)"
        )
    return known[name]


def with_environment(tree_build: TreeBuild, env: Mapping) -> TreeBuild:
    """The build as a server with this environment runs it: its depth bonus from its own variable where set
    (PR 29907: SGLANG_DDTREE_DEPTH_BONUS); a value that is not a number is a clear error."""
    name = tree_build.depth_bonus_env
    if not name or str(env.get(name, "")).strip() == "":
        return tree_build
    try:
        bonus = float(env[name])
    except ValueError:
        raise ValueError(
            f"{name}={env[name]!r} is not a number (the DDTree build {tree_build.name!r} reads it as its depth bonus)"
        ) from None
    return replace(tree_build, depth_bonus=bonus)


def shape(tree_build: TreeBuild, block_size: int, budget: int, topk: int | None) -> tuple[str, int]:
    """What a build verifies at a budget: ("chain", 1) in spine mode, else ("tree", width).

    Width (candidates per depth) = topk for the paper's tree; for PR 29907's
    min(max(budget // (block_size - 1) + 1, 2), cap), cap = topk or the build's max_topk; for a build whose width is
    its proposal (a v2-runtime fork), the budget: it ranks min(budget, vocab) candidates a depth, uncapped.
    """
    depths = block_size - 1
    if tree_build.spine_mode and budget <= depths:
        return "chain", 1
    if tree_build.width == "proposal":
        return "tree", budget
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
    heap: list[tuple[float, tuple[int, ...]]] = [(-first, (0,))]
    while heap and len(tree) < budget:
        negative, prefix = heapq.heappop(heap)
        logw = -negative
        if logw < threshold and any(prefix):
            continue
        tree.add(prefix)
        depth, rank = len(prefix) - 1, prefix[-1]
        if rank + 1 < min(width, len(log_probs[depth])):
            heapq.heappush(
                heap, (-(logw - log_probs[depth][rank] + log_probs[depth][rank + 1]), prefix[:-1] + (rank + 1,))
            )
        if depth + 1 < depths:
            heapq.heappush(heap, (-(logw + log_probs[depth + 1][0] + tree_build.depth_bonus), prefix + (0,)))
    return frozenset(tree)


def refusals(
    tree_build: TreeBuild, budget: int, block_size: int, topk: int | None, page_size: int, attention_backend: str | None
) -> str | None:
    """Why a build refuses a method's settings (None: it takes them), known before any job: a budget below the
    drafter's depth on a build that needs it (``full_depth_budget``), a width cap on a build without one, a page
    size or attention backend its tree verify does not take (the fork: page size 1, triton, flashinfer or fa3;
    anything else fails at the server's first verify round, not at its start)."""
    if tree_build.full_depth_budget and budget < block_size - 1:
        return (
            f"budget {budget}: the DDTree build {tree_build.name!r} needs a budget of at least block_size - 1 = "
            f"{block_size - 1} (it follows the accepted path as block_size - 1 tokens; a smaller tree fails its first "
            f"verify round); use budgets from {block_size - 1}, or a drafter of a smaller block_size"
        )
    if topk is not None and not tree_build.topk_cap:
        return (
            f"topk {topk}: the DDTree build {tree_build.name!r} has no width cap (it ranks min(budget, vocab) "
            "candidates a depth and reads no SGLANG_DDTREE_MAX_TOPK); set topk: uncapped on its methods"
        )
    if tree_build.page_size is not None and page_size != tree_build.page_size:
        return (
            f"--page-size {page_size}: the DDTree build {tree_build.name!r} verifies its tree only with "
            f"--page-size {tree_build.page_size}"
        )
    backends = tree_build.attention_backends
    if backends is not None and attention_backend is not None and attention_backend not in backends:
        return (
            f"attention backend {attention_backend!r}: the DDTree build {tree_build.name!r} verifies its tree only "
            f"on {', '.join(backends)} attention"
        )
    return None


def unread_variables(tree_build: TreeBuild, env: Mapping) -> list[str]:
    """The SGLANG_DDTREE_ variables of a method's environment that its build does not read (none where the build
    declares no ``variables``): a knob the server would silently ignore."""
    if tree_build.variables is None:
        return []
    return sorted(v for v in env if v.startswith(VARIABLE_PREFIX) and v not in tree_build.variables)


VARIABLE_PREFIX = "SGLANG_DDTREE_"  # a DDTree build's own knobs (the installed package's sources are searched for it)


def rank_probe_on(env: Mapping) -> bool:
    """Whether an environment turns PR 29907's rank probe on (SGLANG_DDTREE_RANK_PROBE = 1, true, yes or on)."""
    return str(env.get(RANK_PROBE_ENV, "")).strip().lower() in ("1", "true", "yes", "on")


class RankProbe:
    """PR 29907's rank probe, a diagnostic of the tree mode (budget > block_size - 1): does a wider tree help, or
    is the drafter's quality the ceiling?

    Along the path the target accepts, at each depth d it takes the rank r of the target's token in the drafter's
    distribution and counts, per threshold t in 1, 2, 4, 8, 16, 32, a hit when r < t. Logged every 50 counted
    verify steps (those whose batch's first request holds at least 64 tokens of context), cumulatively:
    hit rate at t = hits at t / rounds that reached depth d. A round reaches depth d + 1 only if the target's token
    at d is in the tree.
    """

    THRESHOLDS = (1, 2, 4, 8, 16, 32)
    EVERY = 50
    MIN_CONTEXT = 64
    TITLE = "[DDTREE rank-probe] target-token rank in draft dist (cumulative):"

    def __init__(self, depths: int):
        self.reached = [0] * depths
        self.hits = [[0] * len(self.THRESHOLDS) for _ in range(depths)]
        self.steps = 0

    def record(self, ranks: list[int], accepted: int) -> None:
        """One request's round: ``ranks[d]`` the target token's rank at depth d (>= 32: outside the top 32),
        ``accepted`` drafted tokens the target accepted (the walk stops at the first depth it rejects)."""
        for d in range(min(accepted + 1, len(self.reached))):
            self.reached[d] += 1
            for i, t in enumerate(self.THRESHOLDS):
                self.hits[d][i] += ranks[d] < t

    def step(self) -> str | None:
        """Count one verify step; every 50th returns the table the build logs."""
        self.steps += 1
        return self.table() if self.steps % self.EVERY == 0 else None

    def table(self) -> str:
        lines = [self.TITLE, "depth reached  t1    t2    t4    t8    t16   t32"]
        for d, reached in enumerate(self.reached):
            if not reached:
                break
            rates = "  ".join(f"{h / reached:.2f}" for h in self.hits[d])
            lines.append(f"d{d:<4} {reached:<7} {rates}")
        return "\n".join(lines)
