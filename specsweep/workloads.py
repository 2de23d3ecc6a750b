"""Workloads: what is sent. Deterministic prompt sets per family and seed.

A workload is a list of sessions; a single-turn request is a session of one
turn. Each session has a content kind (chat, math, code, json) and its turns:
the first turn's messages, then for multi-turn families the message appended
after each reply (a tool result or the next user question).

Built-in sources (no download needed):
- short: natural prompts shipped in specsweep/data/short.yaml;
- long / very_long: a source file of Python's standard library as the
  document, plus a question about it, sized to ``context_tokens``;
- agentic_1: a coding-agent tool loop (tool schemas in the system prompt,
  tool results from standard-library sources appended turn by turn);
- agentic_2: structured-output sessions sharing one long system prefix.
"""

from __future__ import annotations

import json
import random
import sysconfig
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import yaml

from .canon import digest
from .text import count_tokens

DEFAULT_CONTEXT = {"long": 8000, "very_long": 32000}
DEFAULT_TURNS = {"agentic_1": 4, "agentic_2": 3}

# Standard-library modules used as long documents, in a fixed order.
_DOCUMENT_MODULES = [
    "argparse.py", "difflib.py", "textwrap.py", "json/decoder.py", "json/encoder.py",
    "configparser.py", "dataclasses.py", "heapq.py", "statistics.py", "fractions.py",
    "shlex.py", "csv.py", "calendar.py", "ipaddress.py", "pprint.py", "string.py",
]


@dataclass
class Session:
    """One request (or multi-turn session): content kind, first messages, follow-up messages."""

    id: str
    kind: str
    messages: list[dict]
    followups: list[dict] = field(default_factory=list)
    max_new_tokens: int = 512

    def as_dict(self) -> dict:
        return {"id": self.id, "kind": self.kind, "messages": self.messages,
                "followups": self.followups, "max_new_tokens": self.max_new_tokens}


def _short_prompts() -> list[dict]:
    text = resources.files("specsweep").joinpath("data/short.yaml").read_text()
    return yaml.safe_load(text)


def _stdlib_document(index: int, target_tokens: int) -> tuple[str, str]:
    """A standard-library source file (or several) of about target_tokens; returns (name, text)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    names, chunks, total = [], [], 0
    i = index
    while total < target_tokens:
        name = _DOCUMENT_MODULES[i % len(_DOCUMENT_MODULES)]
        text = (root / name).read_text(encoding="utf-8")
        names.append(name)
        chunks.append(f"# File: {name}\n{text}")
        total += count_tokens(chunks[-1])
        i += 1
    document = "\n\n".join(chunks)
    tokens = count_tokens(document)
    if tokens > target_tokens:  # trim at a line boundary to the target
        keep = int(len(document) * target_tokens / tokens)
        document = document[: document.rfind("\n", 0, keep) + 1]
    return ", ".join(names), document


_QUESTIONS = [
    "Explain what the main classes and functions in this code do and how they fit together.",
    "Find a function in this code that could be simplified, and show the simplified version.",
    "Write unit tests with pytest for two functions defined in this code.",
    "Summarise the error handling strategy used in this code and suggest one improvement.",
]

_AGENT_TOOLS = [
    {"name": "read_file", "description": "Read a file of the repository.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
    {"name": "search_code", "description": "Search the repository for a regular expression.",
     "parameters": {"type": "object", "properties": {"pattern": {"type": "string"}}, "required": ["pattern"]}},
    {"name": "run_tests", "description": "Run the test suite and return its output.",
     "parameters": {"type": "object", "properties": {"selector": {"type": "string"}}}},
]

_ASSISTANT_FUNCTIONS = [
    {"name": "create_event", "description": "Create a calendar event.",
     "parameters": {"type": "object", "properties": {"title": {"type": "string"}, "start": {"type": "string", "format": "date-time"},
                                                       "duration_minutes": {"type": "integer"}, "attendees": {"type": "array", "items": {"type": "string"}}},
                    "required": ["title", "start"]}},
    {"name": "send_email", "description": "Send an email.",
     "parameters": {"type": "object", "properties": {"to": {"type": "array", "items": {"type": "string"}}, "subject": {"type": "string"}, "body": {"type": "string"}},
                    "required": ["to", "subject", "body"]}},
    {"name": "lookup_contact", "description": "Find a contact by name.",
     "parameters": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}},
]

_ASSISTANT_ASKS = [
    ["Schedule a 30 minute call with Ana next Tuesday at 10:00 about the budget.",
     "Also email her the agenda: budget review, hiring plan, open questions.",
     "Move the call to 11:00 and tell her."],
    ["Find Ben's contact details.", "Invite Ben and Chen to a planning meeting on Friday at 14:00 for an hour.",
     "Send both a reminder email with the meeting room, B-204."],
    ["Book a team lunch for Thursday at 12:30 with Ana, Ben and Chen.", "Email the team that lunch is booked.",
     "Add a follow-up meeting the next Monday at 9:00 for 45 minutes."],
]


def build(workload: dict, seed: int, thinking: bool = False) -> list[Session]:
    """Sessions of a workload for a seed; the same arguments always give the same sessions in the same order."""
    family = workload["family"]
    count = workload["requests"]
    rng = random.Random(f"{seed}:{workload['name']}:{family}")
    max_new = workload.get("max_new_tokens", 512)
    sessions: list[Session] = []
    system = {"role": "system", "content": "You are a helpful assistant."}
    if family == "short":
        prompts = _short_prompts()
        order = list(range(len(prompts)))
        rng.shuffle(order)
        for i in range(count):
            p = prompts[order[i % len(order)]]
            sessions.append(Session(f"{workload['name']}-{i}", p["kind"],
                                    [system, {"role": "user", "content": p["text"]}], [], max_new))
    elif family in ("long", "very_long"):
        target = workload.get("context_tokens", DEFAULT_CONTEXT[family])
        for i in range(count):
            start = rng.randrange(len(_DOCUMENT_MODULES))
            question = _QUESTIONS[rng.randrange(len(_QUESTIONS))]
            names, document = _stdlib_document(start, max(target - 60, 100))
            user = f"Here is some Python code ({names}).\n\n```python\n{document}```\n\n{question}"
            sessions.append(Session(f"{workload['name']}-{i}", "code", [system, {"role": "user", "content": user}], [], max_new))
    elif family == "agentic_1":
        turns = workload.get("turns", DEFAULT_TURNS[family])
        tools = json.dumps(_AGENT_TOOLS, indent=1)
        agent = {"role": "system", "content": "You are a coding agent working in a Python repository. "
                 "Call tools by answering with one JSON object {\"tool\": name, \"arguments\": {...}}. "
                 f"Available tools:\n{tools}"}
        for i in range(count):
            start = rng.randrange(len(_DOCUMENT_MODULES))
            task = f"The module {_DOCUMENT_MODULES[start]} has a failing test. Find the cause and propose a fix."
            followups = []
            for t in range(1, turns):
                name, text = _stdlib_document(start + t, 700)
                followups.append({"role": "tool", "content": json.dumps({"tool": "read_file", "path": name, "content": text})})
            sessions.append(Session(f"{workload['name']}-{i}", "code", [agent, {"role": "user", "content": task}], followups, max_new))
    elif family == "agentic_2":
        turns = workload.get("turns", DEFAULT_TURNS[family])
        _, policy = _stdlib_document(0, 1500)
        shared = {"role": "system", "content": "You are an office assistant. Answer only with a JSON function call "
                  "{\"name\": ..., \"arguments\": {...}} using these functions:\n"
                  + json.dumps(_ASSISTANT_FUNCTIONS, indent=1)
                  + "\n\nReference material for date and text handling follows.\n" + policy}
        for i in range(count):
            asks = _ASSISTANT_ASKS[rng.randrange(len(_ASSISTANT_ASKS))]
            asks = (asks * turns)[:turns]
            followups = [{"role": "user", "content": a} for a in asks[1:]]
            sessions.append(Session(f"{workload['name']}-{i}", "json", [shared, {"role": "user", "content": asks[0]}], followups, max_new))
    else:  # the schema admits only the families above
        raise ValueError(f"workload '{workload['name']}': unknown family '{family}'")
    return sessions


def workload_digest(sessions: list[Session]) -> str:
    """Digest of the exact sessions sent (content and order)."""
    return digest([s.as_dict() for s in sessions])
