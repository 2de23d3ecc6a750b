"""Production traces replayed: their arrivals, lengths and shared prefixes, their text filled in.

Public serving traces carry no text: the Mooncake traces (FAST'25; github.com/kvcache-ai/Mooncake, folder
FAST25-release/traces) give each request's arrival time, input and output length and the hash ids of its 512-token
prefix blocks (two requests with the same first k hash ids share their first k blocks); Azure's LLM inference traces
(github.com/Azure/AzurePublicDataset, AzureLLMInferenceTrace_{code,conv}) give arrival times and token counts.
Formats (docs/workloads.md has the field tables):

- ``mooncake``: JSONL, one object a line: ``timestamp`` (ms since the trace's start), ``input_length``,
  ``output_length`` (tokens), ``hash_ids`` (one id per 512-token block of the input, the last block partial);
  an ``id`` where a line has one.
- ``azure``: CSV with the header TIMESTAMP,ContextTokens,GeneratedTokens; TIMESTAMP a date and time
  (2023-11-16 18:15:46.6805900) or seconds.

A malformed line is refused naming the file, the line and the field. A window of the trace (seconds from its first
arrival, or a range of lines) is replayed open loop at its arrival times divided by a time scale. Each prompt is
filled with real text of the workload's content (fill_prompt): the content's corpus is cut into disjoint blocks,
no two of which begin with the same OPENING_TOKENS tokens (a corpus with fewer than MIN_BLOCKS is not used), and
each block name of the window (a hash id; past a request's hash ids, blocks of its own) gets the next unused block
the first time the window holds it (assign_blocks); past the corpus's blocks the text comes again under a line of
its own. Every block ends its last line and the next starts a new one, so that the tokenizer cuts the prompt at
every block boundary as it cuts each block alone: requests whose hash ids begin alike begin with the same tokens
for exactly those blocks, requests that share no hash id part within a few tokens of the chat template's opening,
and no prompt holds a block twice while its corpus has others. The prefix cache sees the sharing production saw;
the text is not production's, so acceptance follows the content mix, not the production workload.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

BLOCK_TOKENS = 512  # tokens per hash id (Mooncake's block)
TRACE_FORMATS = ("mooncake", "azure")
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
OVER_CONTEXT = ("clip", "drop")
PAD = " the"  # a word of one token (a word of its own wherever it follows: after a cut, before nothing)


class TraceError(ValueError):
    """A trace that cannot be replayed; the message names the file, the line and what to do."""


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace: where it is (line, id), when it arrived (seconds after the trace's first arrival),
    its lengths in tokens and the hash ids of its prefix blocks."""

    line: int
    arrival_s: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...] = ()
    id: str | None = None


def trace_format(path: str, given: str | None) -> str:
    """The trace's format: given (workloads[].format), else azure for a .csv file, mooncake otherwise."""
    if given in TRACE_FORMATS:
        return given
    return "azure" if str(path).lower().endswith(".csv") else "mooncake"


def read_trace(path: str, fmt: str) -> list[TraceRequest]:
    """Every request of a trace file, in arrival order (a line's order where arrivals tie), arrival times from its
    first arrival on."""
    try:
        text = Path(path).read_text(encoding="utf-8-sig")  # a byte-order mark (as spreadsheets write) is no field
    except FileNotFoundError:
        raise TraceError(f"{path}: no such trace file (workloads[].path)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: cannot be read as UTF-8 text ({exc})") from None
    rows = _mooncake(path, text) if fmt == "mooncake" else _azure(path, text)
    if not rows:
        raise TraceError(f"{path}: the trace holds no request")
    rows.sort(key=lambda r: (r.arrival_s, r.line))
    first = rows[0].arrival_s
    return [  # to the microsecond: a date's seconds since 1970 carry float noise below it
        TraceRequest(r.line, round(r.arrival_s - first, 6), r.input_length, r.output_length, r.hash_ids, r.id)
        for r in rows
    ]


def _count(value, where: str, field: str, least: int) -> int:
    """A whole token count of at least ``least``; TraceError naming the line and field otherwise."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise TraceError(f"{where}: '{field}' must be a whole number of at least {least}, not {value!r}")
    return value


def _mooncake(path: str, text: str) -> list[TraceRequest]:
    rows = []
    named: dict[str, int] = {}  # each id's line
    for number, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        where = f"{path}: line {number}"
        try:
            entry = json.loads(raw)
        except ValueError as exc:
            raise TraceError(f"{where}: not a JSON object ({exc}); a Mooncake trace has one object a line") from None
        if not isinstance(entry, dict):
            raise TraceError(f"{where}: not a JSON object; a Mooncake trace has one object a line")
        missing = [k for k in ("timestamp", "input_length", "output_length") if k not in entry]
        if missing:
            raise TraceError(
                f"{where}: no '{missing[0]}' (a Mooncake line has timestamp, input_length, output_length, hash_ids)"
            )
        stamp = entry["timestamp"]
        if not isinstance(stamp, (int, float)) or isinstance(stamp, bool) or not 0 <= stamp < math.inf:
            raise TraceError(f"{where}: 'timestamp' must be milliseconds (a number from 0), not {stamp!r}")
        hashes = entry.get("hash_ids", [])
        if not isinstance(hashes, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in hashes):
            raise TraceError(f"{where}: 'hash_ids' must be a list of whole numbers, not {hashes!r}")
        input_length = _count(entry["input_length"], where, "input_length", 1)
        if len(hashes) > -(-input_length // BLOCK_TOKENS):
            raise TraceError(
                f"{where}: {len(hashes)} hash_ids for an input of {input_length} tokens, which holds at most "
                f"{-(-input_length // BLOCK_TOKENS)} blocks of {BLOCK_TOKENS}"
            )
        name = str(entry["id"]) if entry.get("id") is not None else None
        if name is not None and name in named:
            raise TraceError(f"{where}: id {name!r} is line {named[name]}'s too; every request's id must be its own")
        if name is not None:
            named[name] = number
        rows.append(
            TraceRequest(
                number,
                stamp / 1000.0,
                input_length,
                _count(entry["output_length"], where, "output_length", 0),
                tuple(hashes),
                name,
            )
        )
    return rows


def _azure_time(value: str, where: str) -> float:
    """An Azure TIMESTAMP as seconds: a date and time (its fraction to the microsecond) or a number of seconds."""
    value = value.strip()
    try:
        return float(value)
    except ValueError:
        pass
    stamp, _, fraction = value.partition(".")
    try:
        moment = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S")
    except ValueError:
        raise TraceError(
            f"{where}: TIMESTAMP {value!r} is neither a date and time (2023-11-16 18:15:46.6805900) nor seconds"
        ) from None
    if fraction and not fraction.isdigit():
        raise TraceError(f"{where}: TIMESTAMP {value!r} has a fraction of a second that is not digits")
    # read as UTC (the Azure traces' clock), never the host's time zone: only differences count, and a host's zone
    # would shift an hour across a daylight-saving change
    return moment.replace(tzinfo=timezone.utc).timestamp() + (float("0." + fraction) if fraction else 0.0)


def _azure(path: str, text: str) -> list[TraceRequest]:
    reader = csv.DictReader(text.splitlines())
    header = [h.strip() for h in reader.fieldnames or []]
    missing = [c for c in AZURE_COLUMNS if c not in header]
    if missing:
        raise TraceError(
            f"{path}: line 1: the header has no {', '.join(missing)} (an Azure trace's header is "
            f"{','.join(AZURE_COLUMNS)})"
        )
    reader.fieldnames = header
    rows = []
    for entry in reader:
        number = reader.line_num
        where = f"{path}: line {number}"
        if None in entry or any(entry.get(c) is None for c in AZURE_COLUMNS):
            raise TraceError(f"{where}: {len(header)} fields expected ({','.join(header)})")
        rows.append(
            TraceRequest(
                number,
                _azure_time(entry["TIMESTAMP"], where),
                _count(entry["ContextTokens"].strip(), where, "ContextTokens", 1),
                _count(entry["GeneratedTokens"].strip(), where, "GeneratedTokens", 0),
            )
        )
    return rows


@dataclass(frozen=True)
class Window:
    """The part of a trace replayed: seconds from its first arrival (``start_s``, ``duration_s``) or a range of lines
    (``first_line``, ``last_line``, inclusive), and how many times fast (``time_scale``)."""

    start_s: float = 0.0
    duration_s: float | None = None
    first_line: int | None = None
    last_line: int | None = None
    time_scale: float = 1.0

    @classmethod
    def of(cls, workload: dict) -> "Window":
        given = workload.get("window") or {}
        return cls(
            float(given.get("start_s", 0.0)),
            float(given["duration_s"]) if given.get("duration_s") is not None else None,
            given.get("first_line"),
            given.get("last_line"),
            float(workload.get("time_scale", 1.0)),
        )

    def select(self, rows: Sequence[TraceRequest]) -> list[TraceRequest]:
        """The window's requests, in arrival order."""
        if self.first_line is not None or self.last_line is not None:
            low, high = self.first_line or 1, self.last_line or 10**12
            return [r for r in rows if low <= r.line <= high]
        end = self.start_s + self.duration_s if self.duration_s is not None else float("inf")
        return [r for r in rows if self.start_s <= r.arrival_s < end]

    def replay_times(self, rows: Sequence[TraceRequest]) -> list[float]:
        """Each request's send time in seconds after the cell starts: its arrival after the window's start (its first
        request's, for a range of lines), divided by the time scale."""
        if not rows:
            return []
        origin = rows[0].arrival_s if self.first_line is not None or self.last_line is not None else self.start_s
        return [(r.arrival_s - origin) / self.time_scale for r in rows]

    def text(self) -> str:
        """The window as the report states it."""
        if self.first_line is not None or self.last_line is not None:
            part = f"lines {self.first_line or 1}-{self.last_line if self.last_line is not None else 'end'}"
        else:
            end = f"{self.start_s + self.duration_s:g} s" if self.duration_s is not None else "the end"
            part = f"{self.start_s:g} s to {end}"
        return f"{part}, time scale {self.time_scale:g}x"


@dataclass(frozen=True)
class Fitted:
    """A window's requests that fit the context: each with the input it is sent (clipped where the rule says), and
    how many were clipped and dropped."""

    requests: list[tuple[TraceRequest, int]]
    clipped: int
    dropped: int  # over the context (drop), or an output that leaves no room for an input token
    no_output: int = 0  # asking for no output (dropped by either rule: nothing to measure)


def fit_context(rows: Sequence[TraceRequest], context_length: int | None, rule: str) -> Fitted:
    """The requests under the context length (input + output at most ``context_length``): a longer input is clipped
    to the room its output leaves (``rule`` clip) or the request dropped (``drop``); a request whose output leaves no
    room for one input token is dropped by either rule, as is one that asks for no output (counted apart: it is no
    matter of the context). Each counted."""
    kept: list[tuple[TraceRequest, int]] = []
    clipped = dropped = no_output = 0
    limit = context_length or 10**12
    for r in rows:
        room = limit - r.output_length
        if r.output_length < 1:
            no_output += 1
        elif room < 1:
            dropped += 1
        elif r.input_length <= room:
            kept.append((r, r.input_length))
        elif rule == "clip":
            kept.append((r, room))
            clipped += 1
        else:
            dropped += 1
    return Fitted(kept, clipped, dropped, no_output)


MIN_BLOCKS = 64  # distinct blocks a content corpus needs to fill trace prompts (32k tokens; a smaller one is not used)
OPENING_TOKENS = 8  # no two of a corpus's blocks begin with the same this many tokens


@dataclass(frozen=True)
class Corpus:
    """Real text of one content kind, tokenized once, cut into disjoint blocks: the text, each token's character
    span, and each block's first token (the start of a line at least BLOCK_TOKENS - 1 tokens after the previous
    block's, whose first OPENING_TOKENS tokens begin no earlier block)."""

    text: str
    spans: tuple[tuple[int, int], ...]
    starts: tuple[int, ...]

    @classmethod
    def of(cls, text: str, encode: Callable[[str], list[tuple[int, int]]]) -> "Corpus":
        """``encode(text)``: each token's (start, end) in characters."""
        spans = tuple(encode(text))
        starts: list[int] = []
        openings: set[str] = set()
        after = 0
        for i, (a, _) in enumerate(spans):
            if i < after or i + BLOCK_TOKENS - 1 > len(spans) or text[a].isspace() or (a and text[a - 1] != "\n"):
                continue
            opening = text[a : spans[i + OPENING_TOKENS - 1][1]]
            if opening in openings:
                continue
            openings.add(opening)
            starts.append(i)
            after = i + BLOCK_TOKENS - 1
        if not starts:
            raise TraceError(f"a content corpus of {len(spans)} tokens is shorter than one {BLOCK_TOKENS}-token block")
        return cls(text, spans, tuple(starts))

    def block(self, index: int) -> str:
        """Block ``index`` of the corpus: BLOCK_TOKENS - 1 tokens of its text from a block's start, ending its last
        line (so the next block starts a new one). Past the corpus's own blocks (index ``n`` and on, n of them), its
        text again under a line of its own, ``(index // n)``, so that no two indices begin alike."""
        start = self.starts[index % len(self.starts)]
        end = min(start + BLOCK_TOKENS - 1, len(self.spans))
        text = self.text[self.spans[start][0] : self.spans[end - 1][1]].rstrip("\n") + "\n"
        rounds = index // len(self.starts)
        return f"({rounds})\n{text}" if rounds else text


def block_keys(request: TraceRequest, length: int) -> list[str]:
    """The names of a request's blocks in order, enough for ``length`` tokens: one per hash id, then blocks of its
    own, named by its hash ids where it has some (two requests with the same hash ids are the same prompt: they share
    every block) and by its line otherwise."""
    own = f"own:{','.join(map(str, request.hash_ids))}" if request.hash_ids else f"own:line{request.line}"
    needed = -(-length // (BLOCK_TOKENS - 16)) + 1  # a block holds at least BLOCK_TOKENS - 16 tokens
    keys = [f"hash:{h}" for h in request.hash_ids]
    return keys + [f"{own}:{i}" for i in range(len(keys), max(needed, len(keys)))]


def assign_blocks(
    window: Sequence[tuple[TraceRequest, int]], corpus_of: Callable[[TraceRequest], tuple[str, Corpus]]
) -> list[list[int]]:
    """Each request's blocks (Corpus.block's indices in its content's corpus), for a window's requests with the input
    length each is sent (fit_context): every block name (block_keys) gets the next block of its corpus the first time
    the window holds it, and keeps it; within one request a block already used is skipped while the corpus has
    others. So requests share text exactly where their hash ids are shared, distinct names never begin alike, and
    no prompt repeats a block while its corpus has an unused one; the assignment depends on the window alone, never
    on how many of its requests a cell sends."""
    given: dict[tuple[str, str], int] = {}
    following: dict[str, int] = {}
    out = []
    for request, length in window:
        kind, corpus = corpus_of(request)
        size = len(corpus.starts)
        indices: list[int] = []
        for key in block_keys(request, length):
            if (kind, key) not in given:
                used = {i % size for i in indices}
                index = following.get(kind, 0)
                for _ in range(size):  # the next block this prompt holds no copy of, while there is one
                    if index % size not in used:
                        break
                    index += 1
                given[kind, key] = index
                following[kind] = index + 1
            indices.append(given[kind, key])
        out.append(indices)
    return out


def cut_at_word(text: str, spans: Sequence[tuple[int, int]], tokens: int) -> str:
    """``text`` cut to at most ``tokens`` of its tokens (``spans``: each token's characters), before the last token
    within them that starts a word (its first character a space, or the first of a line): the tokenizer splits text
    into words before it merges, so the cut text's tokens are exactly the whole text's first ones."""
    if tokens >= len(spans):
        return text
    for index in range(tokens, 0, -1):
        start = spans[index][0]
        if text[start].isspace() or text[start - 1] == "\n":
            return text[:start]
    return ""


def fill_prompt(
    blocks: Sequence[int],
    length: int,
    corpus: Corpus,
    count: Callable[[str], int],
    cut: Callable[[str, int], str],
) -> str:
    """A prompt of about ``length`` tokens for a traced request: its ``blocks`` (assign_blocks) in order, the last one
    cut (``cut(text, tokens)``: at most that many tokens, where the cut text's tokens are the whole block's first
    ones) to the tokens left (``count`` counts a text's). The same blocks in the same order give the same text, so
    requests whose hash ids begin alike begin alike."""
    parts: list[str] = []
    used = 0
    for index in blocks:
        block = corpus.block(index)
        tokens = count(block)
        if used + tokens >= length:  # the last block: cut where its own tokens are a prefix of the whole block's
            last = cut(block, length - used)
            # the cut falls before a word: one-token words make up what the word took (at most a few tokens)
            parts.append(last + PAD * (length - used - count(last)))
            return "".join(parts)
        parts.append(block)
        used += tokens
    raise TraceError(f"{len(blocks)} blocks hold fewer than {length} tokens (block_keys counts too few)")
