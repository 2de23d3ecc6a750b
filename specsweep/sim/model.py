"""The simulated model: what the target generates, what the drafter proposes, what a step costs.

Everything here is deterministic for a given prompt, method and seed. Numbers
produced with it are simulated and labelled so everywhere.

Each algorithm of the registry (specsweep.algorithms) names its drafting
mechanism; ``DRAFTING`` below implements each one, and an algorithm whose
mechanism is not there is refused (never simulated as another's):

- ``block`` (DFlash), ``block-tree`` (DDTree), ``draft-model`` (EAGLE, EAGLE-3,
  standalone): a drafter whose per-depth top-1 probability comes from the text
  (how predictable the context is: repetition, digits; lower with thinking mode
  and temperature; each drafter its own parameters). Per verify round the
  drafter yields, for each depth, a distribution over ranked candidates; the
  target's token is drawn from it (a calibrated drafter). A chain accepts the
  longest prefix of rank-0 tokens; a tree (DDTree's build, or a draft model's
  num_draft_tokens - 1 nodes chosen from its beams as SGLang does) is walked
  from the root along the target's tokens.
- ``lookup`` (NGRAM): no drafter and no draw. Drafts continue the latest
  earlier occurrences of the context's last tokens, in what SGLang indexes of
  the request (its output and its prompt's last tokens), grown breadth first as
  SGLang's n-gram trie does; the target's actual next tokens walk that tree.
  Acceptance follows the output's repetition.

Every round adds the bonus token.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
from dataclasses import dataclass, field, replace
from functools import lru_cache

from .. import algorithms, ddtree
from ..canon import yaml_data
from ..text import split_tokens

CANDIDATES_PER_DEPTH = 32  # ranked candidates the drafter distribution covers


def _seed(*parts) -> int:
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "big")


_STRUCTURE = set("{}[]()<>:;=\"',._-/#*+|\\`")
_MARKUP = re.compile(r"<\|[^|]*\|>|</?think>|^(system|user|assistant|tool)$", re.MULTILINE)

# Acceptance model, fitted by benchmarks/calibrate_sim.py to published DFlash acceptance by content and the DDTree
# paper's Qwen3-8B rows (batch 1, temperature 0); config `sim.acceptance` overrides. A draft model's profile
# (sim_profiles.yaml drafters) sets its own base, gain, cap, depth decay and second-choice ratio, and has no hard
# positions (hard_share 0).
ACCEPTANCE = {
    # a position the drafter finds easy: top-1 = min(cap, base + gain x predictability) x depth_decay^depth
    "base": 0.729,
    "gain": 0.6213,
    "cap": 0.98,
    # predictability = repetition + digit_weight x digits (text_features)
    "digit_weight": 3.9,
    "second_choice_ratio": 0.55,  # easy positions: how fast the rest of the mass falls over ranks 2, 3, ...
    "depth_decay": 0.9867,
    # the share of a draft's positions the drafter finds hard: hard_share x exp(-hard_gain x predictability) +
    # hard_structure x symbols (structure: positions where the text chooses among a few forms); at
    # a hard position its top-1 is hard_top1 and the rest falls over ranks 2, 3, ... at
    # hard_ratio x (1 - min(0.9, structure_focus x symbols)): in structured text a hard position is a choice among
    # few tokens (a key, a bracket), in prose among many
    "hard_share": 0.3429,
    "hard_gain": 2.321,
    "hard_structure": 0.08,
    "hard_top1": 0.3213,
    "hard_ratio": 0.936,
    "structure_focus": 0.4543,
    "thinking": 0.45,  # every top-1 x this with thinking mode on
    "temperature": 0.35,  # every top-1 / (1 + temperature_factor x T)
    # a request that shares its step with others: the chance, per drafted depth and round, that the batch's bf16
    # numerics (kernels and reductions chosen by the batch's shape) move the drafter's ranking there, so that the
    # target's token is ranked afresh (0 for a request alone: its numerics are the reference)
    "batch_numerics": 0.01,
}


def text_features(text: str) -> dict:
    """Predictability features of a context's content (chat markup removed): repetition, digits, structure symbols."""
    content = _MARKUP.sub(" ", text)[-6000:]
    tokens = [t.strip() for t in split_tokens(content) if t.strip()]
    if not tokens:
        return {"repetition": 0.0, "digits": 0.0, "symbols": 0.0}
    return {
        "repetition": 1.0 - len(set(tokens)) / len(tokens),
        "digits": sum(1 for t in tokens if t[0].isdigit()) / len(tokens),
        "symbols": sum(1 for t in tokens if t[0] in _STRUCTURE) / len(tokens),
    }


@dataclass(frozen=True)
class Skill:
    """How a drafter does on one request's content: ``top1`` at an easy position (before the depth decay), the
    share ``hard`` of positions it finds hard, its top-1 there (``hard_top1``) and the fall of the rest over
    ranks 2, 3, ... there (``hard_ratio``). A float where a Skill is asked for is a drafter with no hard positions."""

    top1: float
    hard: float = 0.0
    hard_top1: float = 0.0
    hard_ratio: float = 0.5

    @classmethod
    def of(cls, value: "Skill | float") -> "Skill":
        return value if isinstance(value, Skill) else cls(float(value))

    def key(self) -> "Skill":
        """Rounded, so that trees and distributions are cached per kind of content, not per prompt."""
        return Skill(round(self.top1, 3), round(self.hard, 3), round(self.hard_top1, 3), round(self.hard_ratio, 2))

    def per_depth(self, depth: int = 0, decay: float = ACCEPTANCE["depth_decay"]) -> float:
        """A chain's chance to accept the draft's token at ``depth``: (1 - hard) x top1 x decay^depth + hard x
        hard_top1."""
        return (1 - self.hard) * self.top1 * decay**depth + self.hard * self.hard_top1


def request_skill(text: str, temperature: float, thinking: bool, params: dict | None = None) -> Skill:
    """The drafter's Skill on a context (ACCEPTANCE's formulas, ``params`` over them): with x = repetition +
    digit_weight x digits, top1 = min(cap, base + gain x x), hard = min(0.9, hard_share x
    exp(-hard_gain x x) + hard_structure x symbols), hard_ratio = hard_ratio x (1 - min(0.9, structure_focus x
    symbols)); every top-1 x the thinking factor with thinking on and / (1 + t x T) at temperature T."""
    p = {**ACCEPTANCE, **(params or {})}
    f = text_features(text)
    x = f["repetition"] + p["digit_weight"] * f["digits"]
    scale = (p["thinking"] if thinking else 1.0) / (1.0 + p["temperature"] * temperature if temperature > 0 else 1.0)

    def bounded(v: float) -> float:
        return max(0.05, min(0.99, v))

    return Skill(
        bounded(min(p["cap"], p["base"] + p["gain"] * x) * scale),
        min(0.9, p["hard_share"] * math.exp(-p["hard_gain"] * x) + p["hard_structure"] * f["symbols"]),
        bounded(p["hard_top1"] * scale),
        p["hard_ratio"] * (1.0 - min(0.9, p["structure_focus"] * f["symbols"])),
    )


@lru_cache(maxsize=1 << 12)
def hard_distribution(top1: float, ratio: float) -> tuple[float, ...]:
    """Probabilities of the ranked candidates at a hard position: top-1 ``top1``, rank r >= 1
    (1 - top1) x (1 - ratio) x ratio^(r - 1), the remainder outside every candidate list."""
    return (top1, *((1.0 - top1) * (1 - ratio) * ratio ** (r - 1) for r in range(1, CANDIDATES_PER_DEPTH)))


@lru_cache(maxsize=1 << 16)  # a request keeps its a: every verify round asks for the same depths again
def depth_distribution(
    a: float, depth: int, ratio: float = ACCEPTANCE["second_choice_ratio"], decay: float = ACCEPTANCE["depth_decay"]
) -> tuple[float, ...]:
    """Probabilities of the ranked candidates at a depth of the draft (rank 0 first).

    Top-1 mass q = a * decay^depth; of the rest, a share a falls geometrically
    (ratio) over the next ranks and the remainder lies outside every candidate
    list: a drafter that is often right is also close when it is wrong.
    """
    q = a * (decay**depth)
    inside = (1.0 - q) * a
    return (q, *(inside * (1 - ratio) * ratio ** (r - 1) for r in range(1, CANDIDATES_PER_DEPTH)))


def round_distributions(
    skill: Skill, hard: tuple[bool, ...], depths: int, ratio: float, decay: float
) -> tuple[tuple[float, ...], ...]:
    """The drafter's ranked candidates' probabilities at each depth of one round: depth_distribution at an easy
    position, hard_distribution at a position ``hard`` marks (a round's hard positions, ``draw_hard``)."""
    return tuple(
        hard_distribution(skill.hard_top1, skill.hard_ratio)
        if d < len(hard) and hard[d]
        else depth_distribution(skill.top1, d, ratio, decay)
        for d in range(depths)
    )


def draw_hard(skill: Skill, depths: int, rng: random.Random) -> tuple[bool, ...]:
    """Which positions of a round's draft the drafter finds hard: each with probability skill.hard (no draw at all
    for a drafter without hard positions)."""
    return tuple(rng.random() < skill.hard for _ in range(depths)) if skill.hard > 0 else ()


def build_tree(
    a_key: "float | Skill",
    depths: int,
    budget: int,
    topk: int | None,
    build_name: str = ddtree.DEFAULT_BUILD,
    depth_bonus: float | None = None,
    ratio: float = ACCEPTANCE["second_choice_ratio"],
    decay: float = ACCEPTANCE["depth_decay"],
    hard: tuple[bool, ...] = (),
) -> frozenset:
    """The drafted nodes a tree build verifies in a round (prefixes of ranks): the build's chain or tree
    (specsweep.ddtree) over the drafter's per-depth distributions that round (``round_distributions``: the
    drafter's Skill, or a top-1 probability, and the round's hard positions), with the build's own depth bonus
    unless one is given."""
    tree_build = ddtree.build(build_name)
    if depth_bonus is not None:
        tree_build = replace(tree_build, depth_bonus=depth_bonus)
    return _build_tree(Skill.of(a_key).key(), hard, depths, budget, topk, tree_build, ratio, decay)


@lru_cache(maxsize=1 << 14)  # by the build's fields, not its name: a configuration may define a name anew
def _build_tree(
    skill: Skill,
    hard: tuple[bool, ...],
    depths: int,
    budget: int,
    topk: int | None,
    tree_build: ddtree.TreeBuild,
    ratio: float,
    decay: float,
) -> frozenset:
    mode, width = ddtree.shape(tree_build, depths + 1, budget, topk)
    distributions = round_distributions(skill, hard, depths, ratio, decay)
    log_probs = tuple(tuple(math.log(p) for p in probs[: max(width, 1)]) for probs in distributions)
    return ddtree.tree_prefixes(tree_build, log_probs, budget, width, mode)


@lru_cache(maxsize=4096)
def beam_tree(
    a_key: float,
    steps: int,
    nodes: int,
    topk: int,
    ratio: float = ACCEPTANCE["second_choice_ratio"],
    decay: float = ACCEPTANCE["depth_decay"],
) -> frozenset:
    """The drafted nodes a draft model's tree verifies (prefixes of ranks), as SGLang's EAGLE worker chooses them:
    the first step's topk candidates, then at each later step topk children of each of the topk best paths so far
    (topk^2 candidates, of which the topk best are the next step's paths); of all topk + (steps - 1) x topk^2
    candidates, the ``nodes`` of highest cumulative score (log-probability of the drafter's per-depth
    distribution of top-1 ``a_key``). A parent scores at least its child, so the chosen nodes form a tree."""
    log_probs = [[math.log(p) for p in depth_distribution(a_key, d, ratio, decay)[:topk]] for d in range(steps)]
    beams: list[tuple[tuple[int, ...], float]] = [((), 0.0)]
    pool: list[tuple[tuple[int, ...], float]] = []
    for d in range(steps):
        candidates = [(prefix + (r,), score + log_probs[d][r]) for prefix, score in beams for r in range(topk)]
        candidates.sort(key=lambda c: -c[1])
        pool += candidates
        beams = candidates[:topk]
    pool.sort(key=lambda c: (-c[1], len(c[0])))
    return frozenset(prefix for prefix, _ in pool[:nodes])


@dataclass(frozen=True, repr=False)
class Decoding:
    """How the simulated server decodes: an algorithm of the registry and its parameters.

    Its repr seeds the acceptance draws; the parameters an algorithm does not have stay out of it (and the rank
    probe, the depth bonus and the overlap scheduler, which change nothing that is drawn). ``overlap`` is the
    scheduler as the server runs it: off where the algorithm forces it off (DDTree), whatever the flags say.
    """

    algorithm: str = "ar"  # a name of specsweep.algorithms.REGISTRY
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
        overlap = overlap and spec.overlap
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
        """DDTree: ("chain", 1) or ("tree", width) as its build runs this budget; None otherwise."""
        if self.algorithm != "ddtree":
            return None
        return ddtree.shape(ddtree.build(self.tree_build), self.block_size, self.budget, self.topk)

    def builds_tree(self) -> bool:
        """DDTree whose build grows a tree at this budget (``tree_shape``), not a chain."""
        shape = self.tree_shape()
        return shape is not None and shape[0] == "tree"


def target_ranks(
    decoding: Decoding,
    a: "float | Skill",
    rng: random.Random,
    acceptance: dict | None = None,
    hard: tuple[bool, ...] = (),
) -> list[int]:
    """One verify round's draw: at each depth of the draft, the rank of the target's token among the drafter's
    candidates (CANDIDATES_PER_DEPTH: outside every candidate list), from the round's distributions
    (round_distributions: the drafter's Skill and the round's ``hard`` positions); ``acceptance``: the drafter's
    parameters (default ACCEPTANCE, DFlash's)."""
    p = acceptance or ACCEPTANCE
    skill = Skill.of(a).key()
    ranks = []
    for probs in round_distributions(skill, hard, decoding.depths(), p["second_choice_ratio"], p["depth_decay"]):
        u, r = rng.random(), 0
        while r < len(probs) and u >= probs[r]:
            u -= probs[r]
            r += 1
        ranks.append(r)
    return ranks


def accepted_tokens(
    decoding: Decoding,
    a: "float | Skill",
    rng: random.Random,
    ranks: list[int] | None = None,
    acceptance: dict | None = None,
    hard: tuple[bool, ...] | None = None,
) -> int:
    """Tokens committed by one verify round of a drafter of Skill ``a`` (or top-1 probability; accepted drafts +
    bonus token), for the round's hard positions and target ranks (drawn here when not given): the longest rank-0
    prefix of a chain, the deepest path of the tree the target's tokens walk (a DDTree tree built from that
    round's distributions, so that it branches where the drafter is unsure). A draft model's tree (beam_tree) is
    chosen by its own scores, whose top-1 is a x tree_confidence (a drafter less sure than it is right branches
    early)."""
    kind = _mechanism(decoding)
    if kind == "none":
        return 1
    if kind == "lookup":
        raise ValueError("NGRAM drafts from the request's tokens, not from a drafter's ranks: use LookupDrafter")
    p = acceptance or ACCEPTANCE
    skill = Skill.of(a)
    depths = decoding.depths()
    if ranks is None:
        hard = draw_hard(skill, depths, rng)
        ranks = target_ranks(decoding, skill, rng, p, hard)
    hard = hard or ()
    if kind == "block" or kind == "draft-model" and decoding.shape() == ("chain", 1):
        accepted = 0
        while accepted < depths and ranks[accepted] == 0:
            accepted += 1
        return accepted + 1
    if kind == "block-tree":
        tree = build_tree(
            skill,
            depths,
            decoding.budget,
            decoding.topk,
            decoding.tree_build,
            decoding.depth_bonus,
            p["second_choice_ratio"],
            p["depth_decay"],
            hard,
        )
    else:  # a draft model's tree, chosen as SGLang's EAGLE worker chooses it
        tree = beam_tree(
            round(skill.top1 * p.get("tree_confidence", 1.0), 3),
            depths,
            decoding.num_draft_tokens - 1,
            decoding.topk,
            p["second_choice_ratio"],
            p["depth_decay"],
        )
    accepted = 0
    while accepted < depths and tuple(ranks[: accepted + 1]) in tree:
        accepted += 1
    return accepted + 1


class RankedDrafter:
    """A drafter model's rounds for one request: the target's ranks drawn per depth, then the chain or tree walk.

    In a step shared with others (``batch`` > 1) each depth's rank is drawn afresh with probability
    ``batch_numerics`` (ACCEPTANCE), from a stream seeded by the request's own, the round and the batch's size:
    the batch's bf16 numerics move the drafter's near-ties. The request's own stream is drawn alike whatever the
    batch, so a request alone always accepts what it accepts alone, and the target's tokens never change."""

    def __init__(self, decoding: Decoding, a: "float | Skill", rng: random.Random, acceptance: dict):
        self.decoding, self.skill, self.rng, self.acceptance = decoding, Skill.of(a), rng, acceptance
        self.seed, self.rounds = rng.random(), 0

    def round(self, produced: int, batch: int = 1) -> tuple[int, list[int]]:
        """(tokens the round commits, the target's rank at each depth) in a step of ``batch`` requests."""
        hard = draw_hard(self.skill, self.decoding.depths(), self.rng)
        ranks = target_ranks(self.decoding, self.skill, self.rng, self.acceptance, hard)
        self.rounds += 1
        share = self.acceptance.get("batch_numerics", 0.0)
        if batch > 1 and share > 0:
            numerics = random.Random(_seed(self.seed, self.rounds, batch))
            fresh = target_ranks(self.decoding, self.skill, numerics, self.acceptance, hard)
            ranks = [f if numerics.random() < share else r for r, f in zip(ranks, fresh)]
        return accepted_tokens(self.decoding, self.skill, self.rng, ranks, self.acceptance, hard), ranks


class LookupDrafter:
    """SGLang's NGRAM drafting over one request's own tokens (its prompt, then its output as it grows).

    Each round: anchors are the context's suffixes of k = MAX_TRIE_DEPTH - 1 .. 1 tokens that occurred before
    (at most MATCH_CANDIDATES of the last token's latest occurrences are compared), longest first. From each
    anchor a breadth-first growth follows the tokens that came after its occurrences, the latest first (match type
    BFS) or the most frequent first (PROB): at most breadth = (D - k) x (max_bfs_breadth - 1) / D + 1 children a
    node (D = MAX_TRIE_DEPTH - 1), one step of that scale less per level, MAX_TRIE_DEPTH - k levels below the
    anchor; children with the same token under one parent are one node; num_draft_tokens - 1 nodes in all.
    The target's actual next tokens walk the tree from the root (the last token): committed = depth reached + 1.
    What is indexed is what SGLang 0.5.16 inserts for a request: after each round the context's last
    MAX_TRIE_DEPTH tokens, so the prompt's last tokens and the whole output, never the prompt's body. SGLang
    keeps one trie for all requests; this index holds the request's own tokens, so that one request's acceptance
    does not depend on which others ran beside it.
    """

    MAX_TRIE_DEPTH = 18  # SGLang's --speculative-ngram-max-trie-depth default
    MATCH_CANDIDATES = 64
    OCCURRENCES = 16  # occurrences followed per draft node

    def __init__(self, decoding: Decoding, prompt: list, reply: list):
        self.decoding, self.reply = decoding, reply  # tokens: any hashable values (the simulator's: their text)
        self.tokens: list = []
        self.where: dict = {}
        for token in prompt[-self.MAX_TRIE_DEPTH :]:
            self._append(token)
        self.prompt_length = len(self.tokens)

    def _append(self, token: int) -> None:
        self.where.setdefault(token, []).append(len(self.tokens))
        self.tokens.append(token)

    def _catch_up(self, produced: int) -> None:
        while len(self.tokens) < self.prompt_length + produced:
            self._append(self.reply[len(self.tokens) - self.prompt_length])

    def _anchors(self) -> list[tuple[int, list[int]]]:
        """[(k, positions of the k-token suffix's earlier occurrences, latest first)], longest k first."""
        tokens, last = self.tokens, len(self.tokens) - 1
        limit = self.MAX_TRIE_DEPTH - 1
        lengths = []
        for p in reversed(self.where.get(tokens[last], [])[-self.MATCH_CANDIDATES - 1 :]):
            if p == last:
                continue
            m = 1
            while m < limit and p - m >= 0 and tokens[p - m] == tokens[last - m]:
                m += 1
            lengths.append((p, m))
        return [(k, [p for p, m in lengths if m >= k]) for k in range(limit, 0, -1) if any(m >= k for _, m in lengths)]

    def draft(self) -> list[dict[int, int]]:
        """The draft tree: children[node] = {token: child node}; node 0 is the root (the last token)."""
        tokens, end = self.tokens, len(self.tokens)
        d = self.decoding
        budget, top = d.num_draft_tokens - 1, d.max_bfs_breadth
        scale = (top - 1) / (self.MAX_TRIE_DEPTH - 1)
        children: list[dict[int, int]] = [{}]
        for k, occurrences in self._anchors():
            queue = [(0, (self.MAX_TRIE_DEPTH - 1 - k) * scale + 1, occurrences, self.MAX_TRIE_DEPTH - k)]
            while queue and len(children) - 1 < budget:
                node, breadth, at, levels = queue.pop(0)
                follow: dict[int, list[int]] = {}
                for q in at:
                    if q + 1 < end:
                        follow.setdefault(tokens[q + 1], []).append(q + 1)
                order = list(follow)  # latest first (the occurrences are)
                if d.match_type == "PROB":
                    order.sort(key=lambda t: -len(follow[t]))
                for token in order[: max(1, int(breadth))]:
                    child = children[node].get(token)
                    if child is None:
                        if len(children) - 1 >= budget:
                            break
                        child = len(children)
                        children.append({})
                        children[node][token] = child
                    if levels > 1:
                        queue.append((child, breadth - scale, follow[token][: self.OCCURRENCES], levels - 1))
        return children

    def round(self, produced: int, batch: int = 1) -> tuple[int, None]:
        """(tokens the round commits: the deepest path of the draft the reply's next tokens walk, plus the bonus
        token; at most what is left of the reply), None: there are no ranks. The batch changes nothing: the
        drafts are the request's own tokens and the target's are the same in any batch."""
        self._catch_up(produced)
        children, node, accepted = self.draft(), 0, 0
        for token in self.reply[produced:-1]:  # the last token of the reply is always the bonus of some round
            child = children[node].get(token)
            if child is None:
                break
            node, accepted = child, accepted + 1
        return min(accepted + 1, len(self.reply) - produced), None


# the simulator's drafting mechanisms, by the registry's names (specsweep.algorithms.Algorithm.drafting)
DRAFTING = {
    "none": None,
    "block": RankedDrafter,
    "block-tree": RankedDrafter,
    "draft-model": RankedDrafter,
    "lookup": LookupDrafter,
}


def _mechanism(decoding: Decoding) -> str:
    kind = decoding.spec.drafting
    if kind not in DRAFTING:
        raise ValueError(
            f"the simulated backend has no drafting mechanism {kind!r} (algorithm "
            f"{decoding.algorithm!r}); add it to specsweep.sim.model.DRAFTING"
        )
    return kind


class RandomDrafter:
    """A drafter model with random weights (``--speculative-draft-load-format dummy``): its proposals are never the
    target's choice, so each round commits the target's own token alone (SGLang's accept length 1)."""

    def round(self, produced: int, batch: int = 1) -> tuple[int, None]:
        return 1, None


class ForcedDrafter:
    """Acceptance forced as SGLang forces it (SGLANG_SIMULATE_ACC_LEN, method match-expected): a round commits
    floor(a) + 1 tokens with probability a - floor(a), else floor(a), a clamped to 1 .. depths + 1, whatever was
    drafted. SGLang draws once a verify batch; here each request draws its own rounds (the same mean)."""

    def __init__(self, decoding: Decoding, rng: random.Random):
        assert decoding.accept_length is not None
        self.rng = rng
        self.length = max(1.0, min(float(decoding.depths() + 1), decoding.accept_length))

    def round(self, produced: int, batch: int = 1) -> tuple[int, None]:
        lower = int(self.length)
        return lower + (1 if self.rng.random() < self.length - lower else 0), None


CHUNKED_PREFILL_SIZE = 8192  # new prompt tokens a prefill step takes at most, as SGLang 0.5.16 picks on an H200


# one request's rounds: ``round(produced)`` -> (tokens committed, ranks)
Drafter = RankedDrafter | LookupDrafter | RandomDrafter | ForcedDrafter


def request_drafter(
    decoding: Decoding,
    a: "float | Skill",
    rng: random.Random,
    acceptance: dict,
    prompt: list,
    reply: list,
    random_drafter: bool = False,
) -> Drafter | None:
    """The drafter of one request's rounds (None for AR): forced acceptance where the decoding forces it, ranked
    draws for drafter models (RandomDrafter where the drafter has random weights), the n-gram lookup over the
    request's tokens for NGRAM."""
    kind = _mechanism(decoding)
    if kind == "none":
        return None
    if decoding.accept_length is not None:
        return ForcedDrafter(decoding, rng)
    if kind == "lookup":
        return LookupDrafter(decoding, prompt, reply)
    return RandomDrafter() if random_drafter else RankedDrafter(decoding, a, rng, acceptance)


def random_weights_reply(reply: list) -> list:
    """The greedy reply of a target with random weights (``--load-format dummy``), as long as ``reply``: its first
    three tokens over and over (a randomly initialised model's greedy output falls into a loop of two or three
    tokens, which is what n-gram lookup accepts on such a model)."""
    return (reply[:3] * len(reply))[: len(reply)]


def drafter_acceptance(decoding: Decoding, profile_set: dict, dflash_overrides: dict | None = None) -> dict:
    """The acceptance parameters of a decoding's drafter: DFlash's (ACCEPTANCE, with ``sim.acceptance``
    overrides) for DFlash and DDTree, the drafter profile of its algorithm (profiles ``drafters``) for draft
    models."""
    if decoding.spec.drafting == "draft-model":  # fitted without hard positions
        return {**ACCEPTANCE, "hard_share": 0.0, **profile_set["drafters"][decoding.algorithm]}
    return {**ACCEPTANCE, **(dflash_overrides or {})}


def reply_tokens(prompt: str, max_new_tokens: int, ignore_eos: bool = False) -> tuple[list[str], bool]:
    """The target's greedy reply to a prompt: tokens and whether it stopped by itself.

    Deterministic per prompt and independent of the decoding method (lossless).
    The reply reuses the prompt's own vocabulary, so its content resembles it.
    """
    rng = random.Random(_seed("reply", prompt))
    natural = rng.randint(max(8, max_new_tokens // 5), max(9, int(max_new_tokens * 1.1)))
    length = max_new_tokens if ignore_eos else min(natural, max_new_tokens)
    vocab = [t for t in split_tokens(prompt[-4000:]) if t.strip()] or [" ok"]
    out, i = [], rng.randrange(len(vocab))
    for _ in range(length):
        if rng.random() < 0.7:  # continue the current run of prompt text
            i = (i + 1) % len(vocab)
        else:
            i = rng.randrange(len(vocab))
        tok = vocab[i]
        out.append(tok if tok[0].isspace() or not tok[0].isalnum() else " " + tok)
    return out, natural <= max_new_tokens and not ignore_eos


@dataclass(frozen=True)
class Bound:
    """The physically sensible range of one runtime parameter: low <= value <= high, in ``unit``; ``positive``:
    above 0 too (a rate or share the cost model divides by)."""

    low: float
    high: float
    unit: str
    positive: bool = False

    def problem(self, value) -> str | None:
        """Why ``value`` is not a value of this parameter, or None."""
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return f"{value!r} is not a finite number"
        if self.positive and value <= 0:
            return f"{value!r} must be above 0 (the cost model divides by it)"
        if not self.low <= value <= self.high:
            return f"{value!r} is outside {self.low:g}..{self.high:g} {self.unit}"
        return None


_SHARE = Bound(0.0, 1.0, "(a share of the GPU's datasheet rate)", positive=True)
# Every parameter a runtime profile may hold (the CostModel methods below say what each prices), with the range a
# real engine's value lies in: the measured ones (sim_profiles.yaml) sit one or two orders of magnitude inside, so
# that a bound is met only by a value no engine has (a request latency of seconds, a step cost of 1e9 s, a rate of 0).
RUNTIME_BOUNDS = {
    "bandwidth_efficiency": _SHARE,
    "compute_efficiency": _SHARE,
    "attention_bandwidth_efficiency": _SHARE,
    "attention_compute_efficiency": Bound(0.0, 1.0, "(a share of the GPU's flops; 0: no attention term)"),
    "attention_request_bandwidth": Bound(0.0, 1e14, "bytes/s a GPU (0: no per-request bound)"),
    "moe_compute_efficiency": Bound(0.0, 1.0, "(a share of the dense rate)", positive=True),
    "eager_bandwidth_efficiency": _SHARE,
    "eager_compute_efficiency": _SHARE,
    "roofline_exponent": Bound(0.0, 100.0, "(0: max(read, compute))"),
    "layer_overhead": Bound(0.0, 1e-3, "seconds a layer"),
    "moe_layer_overhead": Bound(0.0, 1e-3, "seconds a MoE layer"),
    "allreduce_latency": Bound(0.0, 1e-3, "seconds an all-reduce step"),
    "eager_layer_launch": Bound(0.0, 1e-2, "seconds a layer"),
    "eager_kv_passes": Bound(0.0, 1000.0, "reads of the KV cache a step"),
    "eager_score_bytes": Bound(0.0, 1e5, "bytes a query-key pair a layer"),
    "drafter_fraction": Bound(0.0, 2.0, "of a target step"),
    "drafter_prefill_fraction": Bound(0.0, 2.0, "of the target's prefill"),
    "drafter_prefill_fixed": Bound(0.0, 1.0, "seconds a prefill step"),
    "prefill_fixed": Bound(0.0, 1.0, "seconds a prefill step"),
    "verify_attention_reads": Bound(0.0, 100.0, "extra KV reads a verify step"),
    "verify_request_attention_reads": Bound(0.0, 100.0, "extra KV reads a verify step"),
    "draft_attention_reads": Bound(0.0, 100.0, "extra KV reads a drafter forward"),
    "shared_kv_reads": Bound(0.0, 1.0, "(a share of a KV page's read)"),
    "cpu_step": Bound(0.0, 0.1, "seconds a step"),
    "no_overlap_penalty": Bound(0.0, 0.1, "seconds a step"),
    "spec_cpu_per_request": Bound(0.0, 1e-2, "seconds a request a round"),
    "rank_probe_cpu_per_request": Bound(0.0, 1e-2, "seconds a request a round"),
    "verify_per_request": Bound(0.0, 1e-2, "seconds a request a round"),
    "tree_build_per_node": Bound(0.0, 1e-3, "seconds a tree node"),
    "hybrid_tree_per_node": Bound(0.0, 1e-2, "seconds a tree node"),
    "draft_step_overhead": Bound(0.0, 0.1, "seconds a drafter forward"),
    "draft_layer_overhead": Bound(0.0, 1e-3, "seconds a drafter layer"),
    "draft_per_request": Bound(0.0, 1e-2, "seconds a request a round"),
    "draft_tree_per_node": Bound(0.0, 1e-3, "seconds a tree node"),
    "ngram_step_overhead": Bound(0.0, 0.1, "seconds a round"),
    "ngram_cpu_per_request": Bound(0.0, 1e-2, "seconds a request a round"),
    "ngram_cpu_per_node": Bound(0.0, 1e-3, "seconds a tree node"),
    "request_latency": Bound(0.0, 1.0, "seconds a request"),
    "request_latency_per_token": Bound(0.0, 1e-3, "seconds a prompt token"),
    "startup_seconds": Bound(0.0, 3600.0, "seconds from launch to ready"),
}
RUNTIME_FLAGS = ("drafter_per_token",)  # true or false
# the parameters each kind of runtime reads unconditionally: the roofline's (SGLang's) and the eager one's (hf-eager,
# a runtime with eager_layer_launch); every other parameter counts as 0 (or off) where a runtime does not set it
REQUIRED_RUNTIME = {
    "roofline": (
        "bandwidth_efficiency",
        "compute_efficiency",
        "layer_overhead",
        "allreduce_latency",
        "drafter_fraction",
        "tree_build_per_node",
    ),
    "eager": (
        "eager_layer_launch",
        "eager_bandwidth_efficiency",
        "eager_compute_efficiency",
        "eager_kv_passes",
        "eager_score_bytes",
        "drafter_fraction",
        "tree_build_per_node",
    ),
}


def runtime_problems(runtime) -> list[str]:
    """Why a runtime profile cannot price a step, one "<parameter>: why" each (empty when it can): a parameter the
    cost model does not know, a value outside its RUNTIME_BOUNDS (or a flag not true or false), a parameter its
    kind of runtime (REQUIRED_RUNTIME: eager where it sets eager_layer_launch, else roofline) needs and lacks."""
    if not isinstance(runtime, dict) or not runtime:
        return ["missing or not a mapping of a runtime profile"]
    out = []
    for key, value in runtime.items():
        if key in RUNTIME_FLAGS:
            if not isinstance(value, bool):
                out.append(f"{key}: {value!r} is not true or false")
        elif key not in RUNTIME_BOUNDS:
            out.append(f"{key}: not a runtime parameter of the cost model (specsweep/sim/model.py RUNTIME_BOUNDS)")
        elif (why := RUNTIME_BOUNDS[key].problem(value)) is not None:
            out.append(f"{key}: {why}")
    kind = "eager" if "eager_layer_launch" in runtime else "roofline"
    missing = [key for key in REQUIRED_RUNTIME[kind] if key not in runtime]
    if missing:
        others = f", as are {', '.join(missing[1:])}" if missing[1:] else ""
        out.append(f"{missing[0]}: missing{others} (a {kind} runtime needs {', '.join(REQUIRED_RUNTIME[kind])})")
    return out


@lru_cache(maxsize=1)
def default_profiles() -> dict:
    """Hardware, model and runtime profiles shipped in specsweep/data/sim_profiles.yaml."""
    from importlib import resources

    return yaml_data(resources.files("specsweep").joinpath("data/sim_profiles.yaml").read_text())


def profiles(overrides: dict | None = None) -> dict:
    """Shipped profiles with config overrides (sim.profiles) merged in, entry by entry."""
    base = default_profiles()
    out = {kind: {name: dict(entry) for name, entry in base[kind].items()} for kind in base}
    for kind, entries in (overrides or {}).items():
        for name, entry in entries.items():
            out.setdefault(kind, {}).setdefault(name, {}).update(entry)
    return out


@dataclass(frozen=True)
class CostModel:
    """Time of one engine step for a hardware, model and runtime profile under tensor parallelism.

    ``draft_model``: the model profile of a standalone drafter (sim.draft_model_profile); EAGLE heads are sized
    from the target's profile (``draft_head``)."""

    gpu: dict
    model: dict
    runtime: dict
    tp: int = 1
    draft_model: dict | None = None

    @classmethod
    def named(
        cls,
        gpu: str,
        model: str,
        runtime: str = "sglang",
        tp: int = 1,
        overrides: dict | None = None,
        draft_model: str | None = "qwen3-0.6b",
    ):
        p = profiles(overrides)
        return cls(
            p["gpus"][gpu],
            p["models"][model],
            p["runtimes"][runtime],
            tp,
            p["models"][draft_model] if draft_model else None,
        )

    def draft_head(self, algorithm: str) -> dict:
        """An EAGLE head's model profile from the target's: one decoder layer (its weights and KV per token, the
        target's per layer) and an LM head of vocab x hidden (hidden: q_dim) in bf16; EAGLE-3's also fuses three
        of the target's layers' hidden states (3 x hidden x hidden)."""
        m = self.model
        hidden = m.get("q_dim", 4096)
        head = m.get("vocab", 151936) * hidden * 2 + (3 * hidden * hidden * 2 if algorithm == "eagle3" else 0)
        layer = (
            m["weight_bytes"]
            - m.get("expert_bytes", 0.0) * (1 - m.get("experts_per_token", 0) / max(m.get("experts", 1), 1))
        ) / m["layers"]
        return {
            "weight_bytes": layer + head,
            "active_params": (layer + head) / 2,
            "layers": 1,
            "kv_bytes_per_token": m["kv_bytes_per_token"] / m["layers"],
            "q_dim": hidden,
            "hybrid": False,
        }

    def draft_seconds(self, decoding: Decoding, contexts: list[int]) -> float:
        """GPU time of one round's drafting.

        Block drafters (DFlash, DDTree): drafter_fraction x a pass of the target as a dense model of its active size
        (dense_equivalent: the drafter reads no experts) over the drafted tokens (the block per request where
        drafter_per_token, else one; a DDTree tree is built from that one pass, whatever its budget).
        Draft models (SGLang's EAGLE worker): one forward over the num_steps + 1 tokens a round can accept (the
        draft extend, whose output is the first step's candidates), then num_steps - 1 forwards over topk tokens a
        request; each forward the drafter's own cost on this GPU (with
        the runtime's draft_layer_overhead and draft_attention_reads where it sets them) plus draft_step_overhead.
        NGRAM: none (its lookup runs on the CPU, see decode_step)."""
        r, batch, kind = self.runtime, len(contexts), decoding.spec.drafting
        if kind in ("block", "block-tree"):
            drafted = decoding.block_size * batch if r.get("drafter_per_token") else batch
            return r["drafter_fraction"] * self.dense_equivalent().verify_seconds(drafted, [0] * batch)
        if kind != "draft-model":
            return 0.0
        spec = decoding.spec
        head = isinstance(spec, algorithms.DraftModel) and spec.draft_model == "head"
        profile = self.draft_head(decoding.algorithm) if head else self.draft_model
        if profile is None:
            raise ValueError(f"{decoding.algorithm}: no draft model profile (sim.draft_model_profile)")
        own = {k: r[f"draft_{k}"] for k in ("layer_overhead", "attention_reads") if f"draft_{k}" in r}
        if "attention_reads" in own:  # a drafter forward's extra KV reads over several tokens a request
            own["verify_attention_reads"] = own["verify_request_attention_reads"] = own.pop("attention_reads")
        drafter = CostModel(self.gpu, profile, {**r, **own}, self.tp)
        overhead = r.get("draft_step_overhead", 0.0)
        topk = decoding.topk or 1
        extend = drafter.verify_seconds(batch * (decoding.num_steps + 1), contexts) + overhead
        return extend + (decoding.num_steps - 1) * (drafter.verify_seconds(batch * topk, contexts) + overhead)

    def dense_equivalent(self) -> CostModel:
        """This model as a dense one of its active size (itself where it is dense): what a block drafter's pass
        costs is a share of. A DFlash drafter is a few dense layers at the target's hidden size whatever the
        target's experts, so its pass reads no routed experts: weight_bytes becomes the bytes one token reads
        (_bytes_read(1)), the experts go."""
        if not self.model.get("experts"):
            return self
        dense = {k: v for k, v in self.model.items() if k not in ("experts", "experts_per_token", "expert_bytes")}
        return CostModel(self.gpu, {**dense, "weight_bytes": self._bytes_read(1)}, self.runtime, self.tp)

    def routed_active_params(self) -> float:
        """Parameters of the routed experts one token runs through: active_params x the routed share of the bytes
        one token reads (expert_bytes x k / E of weight_bytes - expert_bytes + expert_bytes x k / E); 0 if dense."""
        m = self.model
        if not m.get("experts"):
            return 0.0
        routed = m["expert_bytes"] * m["experts_per_token"] / m["experts"]
        return m["active_params"] * routed / (m["weight_bytes"] - m["expert_bytes"] + routed)

    def weights_compute(self, tokens: float, efficiency: float) -> float:
        """Seconds of the weights' arithmetic over ``tokens`` tokens at ``efficiency`` of the GPU's flops (x TP):
        2 x tokens x ((active_params - routed) / F + routed / (F x moe_compute_efficiency)), F = flops x efficiency
        x tp and routed = routed_active_params (0 for a dense model). A routed expert's GEMM runs over the few
        tokens routed to it: moe_compute_efficiency (the runtime's, 1 where it does not set it) of the dense rate."""
        m, r = self.model, self.runtime
        flops = self.gpu["flops"] * efficiency * self.tp
        routed = self.routed_active_params()
        seconds = 2 * (m["active_params"] - routed) * tokens / flops
        if routed:
            share = r.get("moe_compute_efficiency", 1.0)
            if share <= 0:
                raise ValueError(f"runtime profile: moe_compute_efficiency must be above 0, not {share}")
            seconds += 2 * tokens * routed / (flops * share)
        return seconds

    def experts_touched(self, tokens: float, requests: int = 1) -> float:
        """Expected routed experts per MoE layer that a step's ``tokens`` touch, spread evenly over ``requests``
        sequences (n = tokens / requests each); k for one token, never more than E. 0 for a dense model.

        Tokens of one sequence share experts more than chance (routing locality): they route within a working set
        of m = max(k, E / f) of the E experts, each token to k of them, so n tokens of one sequence touch
        D1(n) = m x (1 - (1 - k/m)^n). f is the model's expert_repeat_factor, how many times more often than
        chance two consecutive tokens pick the same first-choice expert (in this model 1/m against 1/E, so
        m = E / f); 1 (uniform routing) where the profile does not set it. Requests are independent sequences,
        each with its own working set, so their tokens share an expert only by chance:
        D = E x (1 - (1 - D1(n)/E)^requests). With f = 1 both reduce to uniform routing, E x (1 - (1 - k/E)^tokens),
        and a batch of one token per request is uniform whatever f. A working set rather than a chain from token to
        token: a step verifies one segment of a sequence, and a segment's tokens share experts throughout (segment
        routing consistency, arXiv 2505.16056); f itself is Mixtral's measured repeat (arXiv 2401.04088 Table 5,
        in sim_profiles.yaml)."""
        m = self.model
        experts, per_token = m.get("experts", 0), m.get("experts_per_token", 0)
        if not experts:
            return 0.0
        requests = max(1, requests)
        each = max(1.0, tokens / requests)
        working = min(float(experts), max(float(per_token), experts / max(1.0, m.get("expert_repeat_factor", 1.0))))
        one = working * (1.0 - (1.0 - per_token / working) ** each)
        return experts * (1.0 - (1.0 - one / experts) ** requests)

    def _bytes_read(self, tokens: int, requests: int = 1) -> float:
        """Weight bytes one step reads: all of them for a dense model; for MoE the shared weights (attention,
        embeddings, router) plus the routed experts the tokens of ``requests`` sequences touch:
        weight_bytes - expert_bytes + expert_bytes x experts_touched(tokens, requests) / E."""
        m = self.model
        if not m.get("experts"):
            return m["weight_bytes"]
        shared = m["weight_bytes"] - m["expert_bytes"]
        return shared + m["expert_bytes"] * self.experts_touched(tokens, requests) / m["experts"]

    def _eager_seconds(self, tokens: int, contexts: list[int]) -> float:
        """Target forward in HF transformers without CUDA graphs (runtime hf-eager, the DDTree paper's):
        launch + roofline + attention.

        launch = layers x eager_layer_launch (each layer's kernels launched one by one from Python: the step is
        launch-bound, whatever the GPU); roofline = max(weights read (_bytes_read) / (bandwidth x e),
        weights_compute(tokens, eager_compute_efficiency)), e = eager_bandwidth_efficiency;
        attention = sum over requests of (c x kv_bytes_per_token x eager_kv_passes + layers x n x (c + n) x
        eager_score_bytes) / (bandwidth x e), a request of context c verifying n = tokens / requests nodes: the
        eager path copies and re-reads its KV cache several times a step (the cache concatenated, K and V repeated
        for grouped-query attention) and materialises every query-key score with its dense mask (n x (c + n)
        pairs a layer). Bandwidth and flops scale with TP, the launches do not."""
        r, m, g = self.runtime, self.model, self.gpu
        bw = g["bandwidth"] * r["eager_bandwidth_efficiency"] * self.tp
        launch = m["layers"] * r["eager_layer_launch"]
        roofline = max(
            self._bytes_read(tokens, len(contexts)) / bw, self.weights_compute(tokens, r["eager_compute_efficiency"])
        )
        nodes = tokens / len(contexts) if contexts else float(tokens)
        attention_bytes = sum(
            c * m["kv_bytes_per_token"] * r["eager_kv_passes"]
            + m["layers"] * nodes * (c + nodes) * r["eager_score_bytes"]
            for c in contexts
        )
        return launch + roofline + attention_bytes / bw

    def verify_seconds(self, tokens: int, contexts: list[int], shared: float = 0.0) -> float:
        """Target forward over ``tokens`` tokens of a batch with these context lengths (no drafter).

        roofline(weights read, compute; where the runtime sets roofline_exponent p, (read^p + compute^p)^(1/p):
        the two overlap less than fully where they are close, as a verify of a few hundred tokens shows) +
        attention + layers x per-layer overhead (+ layers x moe_layer_overhead for a MoE model, 0 where the runtime
        does not set it) + TP all-reduces; read = weights read (_bytes_read) / (bandwidth x bandwidth_efficiency x
        tp), compute = weights_compute(tokens, compute_efficiency) (MoE: the routed experts at
        moe_compute_efficiency of the dense rate); attention
        reads every request's KV cache at the runtime's attention bandwidth (attention_bandwidth_efficiency, else
        bandwidth_efficiency, of the GPU's), and no faster for one request than
        ``attention_request_bandwidth`` (a lone long request leaves most of the GPU idle), where the runtime sets it;
        verification may read it more than once (verify_attention_reads). ``shared`` context tokens are KV pages
        that another request of the batch also reads (one copy in the radix cache: the same prompt in flight twice);
        the kernel reads them again at shared_kv_reads of their cost (the rest hits the GPU's L2), so attention reads
        sum(contexts) - (1 - shared_kv_reads) x shared tokens (1, no saving, where the runtime does not set it).
        The eager runtime (hf-eager) has its own model: _eager_seconds.
        """
        r, m, g = self.runtime, self.model, self.gpu
        if "eager_layer_launch" in r:
            return self._eager_seconds(tokens, contexts)
        bw = g["bandwidth"] * r["bandwidth_efficiency"] * self.tp
        read = self._bytes_read(tokens, len(contexts)) / bw
        compute = self.weights_compute(tokens, r["compute_efficiency"])
        if r.get("roofline_exponent"):  # a soft roofline: (read^p + compute^p)^(1/p), max(read, compute) as p grows
            p = max(1.0, r["roofline_exponent"])
            top = max(read, compute)
            roofline = top * ((read / top) ** p + (compute / top) ** p) ** (1 / p) if top > 0 else 0.0
        else:
            roofline = max(read, compute)
        # a verify step (several tokens per request) reads each request's KV cache 1 + verify_attention_reads
        # times, whatever its width (measured: SGLang's DFlash rounds grow with the context alike at widths 8-32)
        width = tokens / len(contexts) if contexts else 1.0
        reads = 1.0 + (r.get("verify_attention_reads", 0.0) if width > 1 else 0.0)
        kv_bw = g["bandwidth"] * r.get("attention_bandwidth_efficiency", r["bandwidth_efficiency"]) * self.tp
        read_tokens = sum(contexts) - (1.0 - min(1.0, r.get("shared_kv_reads", 1.0))) * shared
        attention = reads * read_tokens * m["kv_bytes_per_token"] / kv_bw
        if r.get("attention_request_bandwidth") and contexts:
            # one request's reads are parallel over its verified tokens too, so they may cost less than the
            # batch's (verify_request_attention_reads, where the runtime sets it)
            request_reads = 1.0 + (r.get("verify_request_attention_reads", reads - 1.0) if width > 1 else 0.0)
            attention = max(
                attention,
                request_reads * max(contexts) * m["kv_bytes_per_token"] / (r["attention_request_bandwidth"] * self.tp),
            )
        fixed = m["layers"] * r["layer_overhead"]
        if m.get("experts"):  # routing, top-k, sorting tokens by expert, the grouped GEMMs' launches: every MoE layer
            fixed += m["layers"] * r.get("moe_layer_overhead", 0.0)
        comm = 2 * m["layers"] * r["allreduce_latency"] * math.log2(self.tp) if self.tp > 1 else 0.0
        return roofline + attention + fixed + comm

    def cpu_seconds(self, decoding: Decoding, batch: int) -> float:
        """CPU work of one step: scheduling and sampling (cpu_step), plus, for a speculative round, its
        per-request bookkeeping (spec_cpu_per_request x batch), plus with the DDTree rank probe its walk
        (rank_probe_cpu_per_request x batch)."""
        r = self.runtime
        seconds = r.get("cpu_step", r.get("no_overlap_penalty", 0.0))
        if decoding.probes_ranks():  # the rank probe's per-request walk in Python
            seconds += r.get("rank_probe_cpu_per_request", 0.0) * batch
        return seconds + (r.get("spec_cpu_per_request", 0.0) * batch if decoding.algorithm != "ar" else 0.0)

    def decode_step(self, decoding: Decoding, contexts: list[int], shared: float = 0.0) -> float:
        """Seconds for one decode/verify step of a batch with these context lengths (``shared`` of their tokens read
        by two or more of its requests: see verify_seconds).

        step = GPU + exposed CPU. GPU = verify(width x batch tokens) + drafting (draft_seconds) + for a tree
        verified with a custom mask (DDTree at every budget, NGRAM, a draft model's tree) the mask read per layer
        (nodes x (context + nodes) bytes) and on hybrid models the recurrent state of nodes beyond the 8 a fused
        kernel takes + for DDTree in tree mode its construction (per node) and with the rank probe its top-32 over
        the drafter's logits (batch x (block - 1) x vocab x 4 bytes). The overlap scheduler prepares the next step
        on the CPU while the GPU runs this one, so only CPU work longer than the GPU's shows; without it (and for
        DDTree, which runs without it) all of it adds. NGRAM's lookup (ngram_step_overhead + (ngram_cpu_per_request +
        ngram_cpu_per_node x nodes) x batch) runs between two steps whatever the scheduler: it needs the last round's
        tokens. Every speculative round adds verify_per_request x batch on the GPU (each request's acceptance walk
        and sampling over its drafted tokens); a draft model adds draft_per_request x batch (its per-request work
        beside its forwards), and for a tree draft_tree_per_node x nodes x batch (choosing the nodes).
        """
        if not contexts:
            return 0.0
        r, spec = self.runtime, decoding.spec
        width = decoding.verify_width()
        gpu = self.verify_seconds(width * len(contexts), contexts, shared)
        if decoding.algorithm != "ar":
            gpu += self.draft_seconds(decoding, contexts) + r.get("verify_per_request", 0.0) * len(contexts)
            masked = spec.custom_mask and (spec.drafting != "draft-model" or decoding.verifies_tree())
            if masked:
                # the triton kernel reads the request's custom tree mask in every layer (one byte per node and
                # key: nodes x (context + nodes)); DDTree's heap that builds a tree costs per node (a chain has none)
                if "bandwidth_efficiency" in r:  # a roofline runtime (SGLang's), not the paper's eager one
                    mask_bytes = sum(width * (c + width) for c in contexts) * self.model["layers"]
                    gpu += mask_bytes / (self.gpu["bandwidth"] * r["bandwidth_efficiency"] * self.tp)
                if decoding.builds_tree():
                    gpu += r["tree_build_per_node"] * decoding.budget * len(contexts)
                if decoding.probes_ranks():  # top-32 over the drafter's float32 logits at every depth
                    logits = len(contexts) * (decoding.block_size - 1) * self.model.get("vocab", 151936) * 4
                    gpu += logits / (self.gpu["bandwidth"] * r.get("bandwidth_efficiency", 1.0) * self.tp)
                if self.model["hybrid"]:
                    gpu += r.get("hybrid_tree_per_node", 0.0) * max(0, width - 8) * len(contexts)
            if spec.drafting == "lookup":  # SGLang's n-gram match and tree mask, built for each request
                per_request = r.get("ngram_cpu_per_request", 0.0) + r.get("ngram_cpu_per_node", 0.0) * width
                gpu += r.get("ngram_step_overhead", 0.0) + per_request * len(contexts)
            elif spec.drafting == "draft-model":  # a draft model's per-request work a round (its tree, its sampling)
                gpu += r.get("draft_per_request", 0.0) * len(contexts)
                if decoding.verifies_tree():  # choosing the tree's nodes from topk^2 candidates a step
                    gpu += r.get("draft_tree_per_node", 0.0) * width * len(contexts)
        cpu = self.cpu_seconds(decoding, len(contexts))
        if decoding.overlap and spec.overlap:
            return max(gpu, cpu) if "cpu_step" in r else gpu
        return gpu + cpu

    def prefill(self, new_tokens: int, attention_pairs: float = 0.0, decoding: Decoding | None = None) -> float:
        """Seconds to prefill ``new_tokens`` prompt tokens (compute-bound): the weights' work,
        weights_compute(tokens, e) (2 x params x tokens / (flops x e) for a dense model), plus causal attention where
        the runtime sets attention_compute_efficiency: 4 x layers x q_dim x pairs / (flops x e_attention), pairs =
        sum over requests of new x cached + new^2 / 2 (query-key pairs), plus the runtime's prefill_fixed per
        prefill step (kernel launches without CUDA graphs). On a server decoding with a block drafter (DFlash,
        DDTree: ``decoding``) the drafter extends its own cache over the same tokens: drafter_prefill_fraction x
        the weights' work of the target as a dense model of its active size (dense_equivalent) +
        drafter_prefill_fixed a step (the runtime's; 0 where it does not set them: a drafter of a few layers adds
        little attention, so a share of the weights' work and not of the whole)."""
        if new_tokens <= 0:
            return 0.0
        r, m, g = self.runtime, self.model, self.gpu
        weights = self.weights_compute(new_tokens, r.get("compute_efficiency", 0.4))
        seconds = weights + r.get("prefill_fixed", 0.0)
        if attention_pairs and r.get("attention_compute_efficiency") and m.get("q_dim"):
            seconds += (
                4
                * m["layers"]
                * m["q_dim"]
                * attention_pairs
                / (g["flops"] * r["attention_compute_efficiency"] * self.tp)
            )
        if decoding is not None and decoding.spec.drafting in ("block", "block-tree"):
            dense = self.dense_equivalent().weights_compute(new_tokens, r.get("compute_efficiency", 0.4))
            seconds += r.get("drafter_prefill_fraction", 0.0) * dense + r.get("drafter_prefill_fixed", 0.0)
        return seconds

    def request_latency(self, prompt_tokens: int) -> float:
        """Seconds a request spends in the server outside the engine's steps (the HTTP server, tokenization, the
        hand-offs to the scheduler and from the detokenizer): request_latency + request_latency_per_token x prompt
        tokens, the runtime's (0 where it does not set them). The simulated server holds each request that long
        before its queue; a request's first token comes that much later than the steps that produce it."""
        r = self.runtime
        return r.get("request_latency", 0.0) + r.get("request_latency_per_token", 0.0) * prompt_tokens
