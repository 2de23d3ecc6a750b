"""The acceptance model: what the target generates and what the drafter proposes, round by round.

Everything here is deterministic for a given prompt, method and seed. Numbers
produced with it are simulated and labelled so everywhere. What a step costs is
the cost model's (specsweep.modelling.cost).

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
import statistics
from dataclasses import dataclass, replace
from functools import lru_cache

from .. import ddtree
from ..algorithms import Algorithm
from ..text import split_tokens
from .decoding import Decoding
from .profiles import ACCEPTANCE, profiles  # ACCEPTANCE lives with the profiles, which check families by it

CANDIDATES_PER_DEPTH = 32  # ranked candidates the drafter distribution covers


def _seed(*parts) -> int:
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "big")


_STRUCTURE = set("{}[]()<>:;=\"',._-/#*+|\\`")
_MARKUP = re.compile(r"<\|[^|]*\|>|</?think>|^(system|user|assistant|tool)$", re.MULTILINE)


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


def missing_acceptance(algorithm: Algorithm, profile_set: dict) -> str | None:
    """Why this model cannot draw an algorithm's rounds (the simulated server's and the plan's), or None: a drafting
    mechanism it lacks (DRAFTING), or a draft model whose drafter has no acceptance profile (``drafters`` of the
    profiles, by the algorithm's name; block drafters draw DFlash's, ACCEPTANCE, and lookup none)."""
    if algorithm.drafting not in DRAFTING:
        return (
            f"the simulator has no drafting mechanism {algorithm.drafting!r} (add it to "
            "specsweep.modelling.acceptance.DRAFTING)"
        )
    if algorithm.drafting == "draft-model" and algorithm.name not in profile_set.get("drafters", {}):
        return (
            "its drafter has no acceptance profile, which the plan and the simulated backend draw its rounds from; add "
            f"drafters.{algorithm.name} to specsweep/data/sim_profiles.yaml, or define sim.profiles.drafters."
            f"{algorithm.name} (keys: {', '.join(ACCEPTANCE)})"
        )
    return None


def _mechanism(decoding: Decoding) -> str:
    kind = decoding.spec.drafting
    if kind not in DRAFTING:
        raise ValueError(
            f"the simulated backend has no drafting mechanism {kind!r} (algorithm "
            f"{decoding.algorithm!r}); add it to specsweep.modelling.acceptance.DRAFTING"
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


DEFAULT_DRAFTER_FAMILY = "qwen3"  # a model profile that names no drafter_family: Qwen3-8B's drafters (ACCEPTANCE's)


def model_drafter_family(profile_set: dict, model_profile: str | None) -> str:
    """The drafter family of a model profile: its ``drafter_family`` (sim_profiles.yaml, overridable under
    sim.profiles.models), DEFAULT_DRAFTER_FAMILY where it names none or no model profile is given."""
    model = profile_set.get("models", {}).get(model_profile or "", {})
    return model.get("drafter_family", DEFAULT_DRAFTER_FAMILY)


def drafter_acceptance(
    decoding: Decoding, profile_set: dict, dflash_overrides: dict | None = None, family: str | None = None
) -> dict:
    """The acceptance parameters of a decoding's drafter for a target of drafter ``family`` (profiles
    ``drafter_families``; None: the defaults alone, as the published rows of other targets are predicted):
    DFlash's (ACCEPTANCE, the family's ``dflash`` entry over it, ``sim.acceptance`` overrides over both) for DFlash
    and DDTree; for draft models the drafter profile of its algorithm (profiles ``drafters``) with the family's
    entry of that algorithm over it."""
    own = profile_set.get("drafter_families", {}).get(family, {}) if family else {}
    if decoding.spec.drafting == "draft-model":  # fitted without hard positions
        drafter = profile_set["drafters"][decoding.algorithm]
        return {**ACCEPTANCE, "hard_share": 0.0, **drafter, **own.get(decoding.algorithm, {})}
    return {**ACCEPTANCE, **own.get("dflash", {}), **(dflash_overrides or {})}


# How a reply copies, by how grounded its content is in what it was given (copying(): 0 open chat, 1 code, tool
# calls, long documents): the chance a token continues the current run of copied text, the chance a token is the
# reply's own (not in the prompt: open generation writes what it was not given), and the chance a jump goes back to
# a passage the reply already wrote (code re-uses its names and lines, a tool call its keys, a summary its terms).
REPLY = {
    "run": (0.6, 0.9),  # continue the run: open, grounded (linear between)
    "novel": (0.5, 0.0),  # a token of its own
    "self": (0.0, 0.7),  # a jump back into its own reply, not into the prompt
}
GROUNDED_SYMBOLS = 0.4  # a share of structure symbols (text_features) at which content counts as fully grounded
GROUNDED_CHARACTERS = 6000  # a prompt this long is a document to work from, whatever its symbols


def copying(prompt: str) -> float:
    """How much a reply to this prompt copies (0 to 1): structured content (code, tool calls: text_features'
    symbols over GROUNDED_SYMBOLS) and long documents (characters over GROUNDED_CHARACTERS) are worked from, open
    chat is not. Published n-gram lookup accepts most on such content (code editing, summarisation, retrieval) and
    least on open chat (benchmarks/README.md, "NGRAM's acceptance by content")."""
    symbols = text_features(prompt)["symbols"]
    return min(1.0, max(symbols / GROUNDED_SYMBOLS, len(_MARKUP.sub(" ", prompt)) / GROUNDED_CHARACTERS))


def reply_tokens(prompt: str, max_new_tokens: int, ignore_eos: bool = False) -> tuple[list[str], bool]:
    """The target's greedy reply to a prompt: tokens and whether it stopped by itself.

    Deterministic per prompt and independent of the decoding method (lossless). The reply walks the prompt's own
    vocabulary in runs (REPLY, by copying(prompt) = g, each chance linear in g between its open and grounded
    value): a token continues the run with chance run(g); else it is one of the reply's own with chance novel(g)
    (a prompt token with a letter appended: a word the prompt does not have); else the run jumps, back to a
    position the reply already copied with chance self(g), else anywhere in the prompt. So open chat writes new
    words and seldom repeats itself, and grounded content copies long runs and re-uses its own passages.
    """
    rng = random.Random(_seed("reply", prompt))
    natural = rng.randint(max(8, max_new_tokens // 5), max(9, int(max_new_tokens * 1.1)))
    length = max_new_tokens if ignore_eos else min(natural, max_new_tokens)
    vocab = [t for t in split_tokens(prompt[-4000:]) if t.strip()] or [" ok"]
    g = copying(prompt)
    run, novel, back = ((open_ + (grounded - open_) * g) for open_, grounded in REPLY.values())
    out: list[str] = []
    i, visited = rng.randrange(len(vocab)), list[int]()  # visited: prompt positions the reply copied, in order
    for _ in range(length):
        draw = rng.random()
        if draw < run:  # continue the current run of prompt text
            i = (i + 1) % len(vocab)
        elif draw < run + (1 - run) * novel:  # a word of its own
            tok = vocab[rng.randrange(len(vocab))] + chr(ord("a") + rng.randrange(26))
            out.append(tok if tok[0].isspace() or not tok[0].isalnum() else " " + tok)
            continue
        elif visited and rng.random() < back:  # back to a passage it already wrote
            i = visited[rng.randrange(len(visited))]
        else:
            i = rng.randrange(len(vocab))
        visited.append(i)
        tok = vocab[i]
        out.append(tok if tok[0].isspace() or not tok[0].isalnum() else " " + tok)
    return out, natural <= max_new_tokens and not ignore_eos


def mean_tau(
    prompts: list[str],
    decoding: Decoding,
    rounds: int = 400,
    acceptance: dict | None = None,
    max_new_tokens: int = 256,
    profile_set: dict | None = None,
    looping: bool = False,
    family: str | None = None,
) -> float:
    """Mean tokens per verify round over prompts (the prefill token excluded).

    Drafter models: ``rounds`` draws per prompt, the drafter's acceptance from the prompt's text (DFlash's with
    ``acceptance`` overrides, a draft model's from its profile). NGRAM: every round of each prompt's greedy reply
    of ``max_new_tokens`` tokens, drafted from the reply itself; with ``looping``, the reply of a randomly
    initialised model, whose greedy output repeats its first three tokens. ``family``: the target's drafter family
    (drafter_acceptance)."""
    params = drafter_acceptance(decoding, profile_set or profiles(), acceptance, family)
    taus = []
    for i, prompt in enumerate(prompts):
        if decoding.spec.drafting == "lookup":
            reply = reply_tokens(prompt, max_new_tokens, ignore_eos=True)[0]
            if looping:
                reply = random_weights_reply(reply)
            drafter = LookupDrafter(decoding, split_tokens(prompt), reply)
            produced, steps = 1, 0  # the first token comes from the prefill
            while produced < len(reply):
                produced += drafter.round(produced)[0]
                steps += 1
            taus.append((len(reply) - 1) / max(steps, 1))
            continue
        a = request_skill(prompt, 0.0, False, params)
        rng = random.Random(f"calibration:{i}:{decoding}")
        taus.append(sum(accepted_tokens(decoding, a, rng, acceptance=params) for _ in range(rounds)) / rounds)
    return statistics.mean(taus)
