"""Workloads: lengths, determinism, content mix, multi-turn structure, user files and bad data."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import warnings

import pytest
import requests

from conftest import patience, start_sim
from specsweep.client import measure
from specsweep.text import chat_prompt
from specsweep.workloads import (
    WorkloadError,
    WorkloadWarning,
    build,
    content_mix,
    count_tokens,
    distinct_sessions,
    read_user_file,
    warmup_fill,
    warmup_sessions,
    workload_digest,
)


CONTEXT = 40960


def family(name, **extra):
    return {"name": name, "family": name, "requests": 8, "max_new_tokens": 256, **extra}


@pytest.mark.parametrize("name,target", [("long", 8000), ("very_long", 32000)])
def test_long_contexts_hit_their_token_target(name, target):
    sessions = build(family(name), 0, context_length=CONTEXT)
    for s in sessions:
        tokens = count_tokens(chat_prompt(s.messages))
        assert abs(tokens - target) / target < 0.03, tokens
        assert s.tokens == tokens


def test_very_long_is_capped_by_the_models_context():
    sessions = build(family("very_long", context_tokens=60000), 0, context_length=CONTEXT)
    assert all(s.tokens + s.max_new_tokens <= CONTEXT for s in sessions)


@pytest.mark.parametrize("name", ["short", "long", "agentic_1", "agentic_2"])
def test_same_seed_same_prompts_in_the_same_order(name):
    a = build(family(name), 7, context_length=CONTEXT)
    b = build(family(name), 7, context_length=CONTEXT)
    c = build(family(name), 8, context_length=CONTEXT)
    assert [s.as_dict() for s in a] == [s.as_dict() for s in b]
    assert workload_digest(a) == workload_digest(b) != workload_digest(c)


def test_short_mixes_chat_math_code_and_json_from_real_text():
    sessions = build(family("short", requests=16), 0, context_length=CONTEXT)
    assert content_mix(sessions) == {"chat": 0.25, "code": 0.25, "json": 0.25, "math": 0.25}
    text = {s.kind: s.messages[-1]["content"] for s in sessions}
    assert "def " in text["code"] and "```python" in text["code"]  # HumanEval
    assert "step by step" in text["math"]  # GSM8K
    system = next(s for s in sessions if s.kind == "json").messages[0]["content"]
    assert '"parameters"' in system  # BFCL function schema
    assert all(20 < s.tokens < 1500 for s in sessions)


def test_agentic_1_replays_recorded_agent_sessions_turn_by_turn():
    sessions = build(family("agentic_1", turns=4), 0, context_length=CONTEXT)
    assert all(1 <= 1 + len(s.followups) <= 4 for s in sessions)
    assert any(len(s.followups) == 3 for s in sessions)
    assert all(m["role"] in ("user", "tool") for s in sessions for m in s.followups)
    assert all(s.kind == "code" for s in sessions)


def test_agentic_1_builtin_tool_loop_grows_the_context():
    (s,) = build(family("agentic_1", source="builtin", requests=1, turns=4), 0)
    assert len(s.followups) == 3
    assert all(json.loads(m["content"])["tool"] == "read_file" for m in s.followups)
    contexts = [count_tokens(chat_prompt(s.messages + s.followups[:i])) for i in range(4)]
    assert contexts == sorted(contexts) and contexts[-1] > contexts[0] + 1500


def test_agentic_2_sessions_share_one_long_system_prefix():
    sessions = build(family("agentic_2", turns=3), 0, context_length=CONTEXT)
    prefixes = {s.messages[0]["content"] for s in sessions}
    assert len(prefixes) == 1
    assert count_tokens(next(iter(prefixes))) > 8000
    assert len({s.messages[1]["content"] for s in sessions}) > 1  # different user requests
    assert all(1 <= 1 + len(s.followups) <= 3 for s in sessions)
    assert all(s.kind == "json" for s in sessions)


# ------------------------------------------------------------------ user files


def write(tmp_path, name, lines):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n" if lines else "")
    return path


def test_user_formats(tmp_path):
    jsonl = write(
        tmp_path,
        "p.jsonl",
        [
            json.dumps({"prompt": "What is 2+2?", "kind": "math"}),
            json.dumps(
                {
                    "messages": [
                        {"role": "user", "content": "Hi"},
                        {"role": "assistant", "content": "Hello"},
                        {"role": "user", "content": "Tell a joke"},
                    ]
                }
            ),
        ],
    )
    rows = read_user_file(str(jsonl), "jsonl")
    assert rows[0][1] == "math" and rows[0][2][-1]["content"] == "What is 2+2?"
    assert rows[1][3] == [{"role": "user", "content": "Tell a joke"}]
    share = write(
        tmp_path,
        "s.json",
        [
            json.dumps(
                [
                    {
                        "conversations": [
                            {"from": "human", "value": "Q1"},
                            {"from": "gpt", "value": "A1"},
                            {"from": "human", "value": "Q2"},
                        ]
                    }
                ]
            )
        ],
    )
    (row,) = read_user_file(str(share), "sharegpt")
    assert row[2][-1]["content"] == "Q1" and row[3][0]["content"] == "Q2"
    mt = write(tmp_path, "mt.jsonl", [json.dumps({"question_id": 81, "category": "coding", "turns": ["A", "B"]})])
    (row,) = read_user_file(str(mt), "mt-bench")
    assert row[1] == "code" and [m["content"] for m in row[3]] == ["B"]
    spec = write(tmp_path, "sb.jsonl", [json.dumps({"question_id": 1, "category": "math_reasoning", "turns": ["x"]})])
    assert read_user_file(str(spec), "spec-bench")[0][1] == "math"
    sessions = build(
        {
            "name": "mine",
            "family": "short",
            "source": "file",
            "path": str(mt),
            "format": "mt-bench",
            "requests": 3,
            "max_new_tokens": 64,
        },
        0,
        context_length=CONTEXT,
    )
    assert len(sessions) == 3 and all(len(s.followups) == 1 for s in sessions)


BAD = [
    ("empty", [], "jsonl", "the file is empty"),
    ("malformed", ['{"prompt": "ok"}', '{"prompt": "broken"'], "jsonl", "line 2: not valid JSON"),
    ("unknown-line-format", ['{"text": "what format is this"}'], "jsonl", "line 1: unknown line format"),
    ("unknown-format", ['{"prompt": "x"}'], "alpaca", "unknown format 'alpaca'"),
    (
        "no-user-turn",
        ['{"prompt": "ok"}', json.dumps({"messages": [{"role": "system", "content": "be nice"}]})],
        "jsonl",
        "line 2: the conversation has no user turn",
    ),
    (
        "mt-bench-no-turns",
        [json.dumps({"question_id": 1, "turns": []})],
        "mt-bench",
        "line 1: the conversation has no user turn",
    ),
]


@pytest.mark.parametrize("name,lines,fmt,message", BAD, ids=[b[0] for b in BAD])
def test_bad_data_names_file_and_line(tmp_path, name, lines, fmt, message):
    path = write(tmp_path, f"{name}.jsonl", lines)
    with pytest.raises(WorkloadError) as error:
        read_user_file(str(path), fmt)
    assert str(path) in str(error.value) and message in str(error.value)


def test_prompt_longer_than_the_context_names_the_line(tmp_path):
    path = write(tmp_path, "long.jsonl", [json.dumps({"prompt": "short"}), json.dumps({"prompt": "word " * 5000})])
    with pytest.raises(WorkloadError, match=r"long.jsonl: line 2: a prompt of \d+ tokens"):
        build(
            {"name": "w", "family": "short", "source": "file", "path": str(path), "requests": 2, "max_new_tokens": 64},
            0,
            context_length=4096,
        )


def test_undecodable_bytes_are_refused_naming_file_and_line(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"prompt": "fine"}\n{"prompt": "caf\xe9"}\n')  # Latin-1, not UTF-8
    with pytest.raises(WorkloadError) as error:
        read_user_file(str(path), "jsonl")
    assert str(error.value).startswith(f"{path}: line 2: not valid UTF-8 (byte 0xe9 at column 16)")


@pytest.mark.parametrize(
    "fmt,text,where",
    [
        ("jsonl", '{"prompt": "a"}\n{"prompt": "b", "prompt": "c"}\n', "line 2: "),
        ("sharegpt", '[{"conversations": [{"from": "human", "value": "x", "value": "y"}]}]', ""),
    ],
)
def test_a_key_given_twice_is_refused_naming_file_and_key(tmp_path, fmt, text, where):
    path = tmp_path / "twice.json"
    path.write_text(text)
    with pytest.raises(WorkloadError) as error:
        read_user_file(str(path), fmt)
    key = "prompt" if fmt == "jsonl" else "value"
    assert str(error.value).startswith(f"{path}: {where}duplicated key '{key}' in one object")


def test_repeated_prompts_are_used_once_with_a_warning(tmp_path):
    lines = [json.dumps({"prompt": "Summarise the plot of Hamlet."})] * 20
    lines += [json.dumps({"prompt": f"Question {i}: what is {i} squared?"}) for i in range(3)]
    path = write(tmp_path, "twenty.jsonl", lines)
    with pytest.warns(
        WorkloadWarning,
        match=r"twenty.jsonl: 19 entries repeat an earlier entry's first turn "
        r"\(line 2 repeats line 1; line 3 repeats line 1; .*\); each prompt is "
        r"used once, so the file offers 4 distinct sessions",
    ):
        rows = read_user_file(str(path), "jsonl")
    assert [r[0] for r in rows] == [1, 21, 22, 23]
    workload = {
        "name": "mine",
        "family": "short",
        "source": "file",
        "path": str(path),
        "requests": 4,
        "max_new_tokens": 64,
    }
    with pytest.warns(WorkloadWarning):
        assert distinct_sessions(workload) == 4
        sessions = build(workload, 0, context_length=CONTEXT)
    assert len({workload_digest([s]) for s in sessions}) == 4


# ------------------------------------------------------------------ warm-up

HEADER = "<|im_start|>system\n"  # the chat template's first role header, which every prompt opens with


def common_prefix(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@pytest.mark.parametrize("name", ["short", "long", "agentic_1", "agentic_2", "file"])
def test_warm_up_prompts_share_no_prefix_with_any_measured_prompt(tmp_path, name):
    """A warm-up drawn from the workload's own prompts repeated measured ones (or, for agentic_2, their long shared
    system prefix); now no warm-up prompt shares more than the opening role header with a measured one."""
    if name == "file":
        path = write(
            tmp_path, "eight.jsonl", [json.dumps({"prompt": f"Prompt {i}: " + "tell me more. " * 30}) for i in range(8)]
        )
        workload = {
            "name": "mine",
            "family": "short",
            "source": "file",
            "path": str(path),
            "requests": 8,
            "max_new_tokens": 64,
        }
    else:
        workload = family(name, turns=2) if name.startswith("agentic") else family(name)
    measured = build(workload, 3, context_length=CONTEXT)
    warm = warmup_sessions(workload, 4, 3, context_length=CONTEXT)
    assert len(warm) == 4 and all(w.kind in {s.kind for s in measured} | {"chat"} for w in warm)
    for w in warm:
        for s in measured:
            shared = common_prefix(chat_prompt(w.messages + w.followups), chat_prompt(s.messages + s.followups))
            assert shared <= len(HEADER), (w.id, s.id, shared)


def test_a_measured_request_is_never_served_from_a_warm_ups_prefix(tmp_path):
    """On the simulated server (64-token prefix-cache pages, cached tokens reported per request): after the warm-up
    a cell sends, no measured request finds any of its prompt in the cache. The same check sees the bias of a
    warm-up drawn from the measured prompts, as cells drew it before."""
    path = write(
        tmp_path,
        "eight.jsonl",
        [json.dumps({"prompt": f"Prompt {i}: " + "tell me more about it. " * 40}) for i in range(8)],
    )
    workload = {
        "name": "mine",
        "family": "short",
        "source": "file",
        "path": str(path),
        "requests": 8,
        "max_new_tokens": 16,
    }
    measured = build(workload, 0, context_length=CONTEXT)
    drawn_as_measured = build(dict(workload, name="mine-warmup", requests=2), 0, context_length=CONTEXT)
    server = start_sim(tmp_path)
    try:

        def cached_after(warm):
            assert requests.post(server.url + "/flush_cache", timeout=10).status_code == 200
            measure(server.url, warm, 2, {"temperature": 0.0}, timeout=patience(12))
            records = measure(server.url, measured, 1, {"temperature": 0.0}, timeout=patience(12))
            assert len(records) == 8 and all(r.error is None for r in records)
            return [r.cached_tokens for r in records]

        assert sum(cached_after(drawn_as_measured)) > 0  # the bias this check exists for
        assert cached_after(warmup_sessions(workload, 2, 0, context_length=CONTEXT)) == [0] * 8
    finally:
        server.stop()


# ------------------------------------------------------------------ sessions of one cell never share a prefix


@pytest.mark.parametrize(
    "name,extra",
    [
        ("long", {"context_tokens": 1000}),
        ("very_long", {"context_tokens": 1500}),
        ("agentic_1", {"source": "builtin", "turns": 2}),
    ],
)
def test_stdlib_sessions_are_distinct_from_their_first_line(name, extra):
    """Long prompts were drawn from 16 file starts (and builtin agent sessions from 16 modules) with replacement: in
    a cell of 32, most repeated an earlier session's first thousands of tokens (the question comes last), served
    from the prefix cache. Now every session starts at its own def or class, named in its first sentence."""
    workload = family(name, requests=48, **extra)
    sessions = build(workload, 0, context_length=CONTEXT)
    openings = [s.messages[1]["content"].split("\n")[0] for s in sessions]
    assert len(set(openings)) == 48, [o for o in openings if openings.count(o) > 1][:2]
    assert distinct_sessions(workload) >= 256  # enough for plan-full's largest long cell (4 x 64)
    assert [s.as_dict() for s in build(dict(workload, requests=16), 0, context_length=CONTEXT)] == [
        s.as_dict() for s in sessions[:16]
    ]  # a cell's sessions are the first of a larger build


def test_no_measured_long_request_is_served_from_another_ones_prefix(tmp_path):
    workload = family("long", requests=16, context_tokens=1000, max_new_tokens=8)
    sessions = build(workload, 0, context_length=CONTEXT)
    server = start_sim(tmp_path)
    try:
        records = measure(server.url, sessions, 1, {"temperature": 0.0}, timeout=patience(12))
    finally:
        server.stop()
    assert len(records) == 16 and all(r.error is None for r in records)
    assert [r.cached_tokens for r in records] == [0] * 16


@pytest.fixture
def token_counts(tmp_path, monkeypatch):
    """A token-count folder of the test's own (and the token counts' folder choice made again)."""
    from specsweep import workloads

    monkeypatch.setenv(workloads.TOKEN_COUNTS_ENV, str(tmp_path / "counts"))
    workloads._token_counts.cache_clear()
    yield tmp_path / "counts"
    workloads._token_counts.cache_clear()


def true_count(text):
    from specsweep import workloads

    return len(workloads.tokenizer().encode(text, add_special_tokens=False).ids)


def test_a_token_count_is_made_once_and_read_back_by_any_process(token_counts, monkeypatch):
    from specsweep import workloads

    text = "a text whose tokens are counted once"
    true = true_count(text)
    assert count_tokens(text) == true
    (written,) = list(token_counts.glob("*/*"))
    assert json.loads(written.read_text())["count"] == true
    # another process reads it back where the tokenizer cannot even be imported: the cost is reading one file
    reader = (
        "import sys; sys.modules['tokenizers'] = None; from specsweep.workloads import count_tokens; "
        f"print(count_tokens({text!r}))"
    )
    proc = subprocess.run([sys.executable, "-c", reader], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(true) and "not used" not in proc.stderr
    monkeypatch.setenv(workloads.TOKEN_COUNTS_ENV, "off")
    workloads._token_counts.cache_clear()
    assert count_tokens(text) == true


def _forged(count, text_digest=None):
    """An entry whose digest is computed again over a wrong count (or another text): only the bounds or the text's
    digest can tell."""
    from specsweep import workloads

    def entry(text):
        return json.dumps(
            workloads._token_count_entry(
                text_digest or workloads.digest(text), workloads._tokenizer_identity(None), count
            )
        )

    return entry


BAD_COUNTS = [  # (name, what the file holds, why it is not used)
    ("100", lambda text: "100", "it holds '100', not a token-count entry"),
    ("-50", lambda text: "-50", "it holds '-50', not a token-count entry"),
    ("99999", lambda text: "99999", "it holds '99999', not a token-count entry"),
    ("garbage", lambda text: "\x00\x7f{not json", "not a token-count entry"),
    ("nested past the parser's depth", lambda text: "[" * 100000, "it holds '[[["),
    (
        "count edited",
        lambda text: _forged(1)(text).replace('"count": 1', '"count": 100'),
        "its digest does not match its content",
    ),
    ("digest made again over 99999", _forged(99999), "its count 99999 is not a whole number from 0 to 54"),
    ("digest made again over -50", _forged(-50), "its count -50 is not a whole number from 0 to 54"),
    ("digest made again over 3.5", _forged(3.5), "its count 3.5 is not a whole number"),
    ("another text's entry", _forged(7, "0" * 64), "it counts another text"),
]


@pytest.mark.parametrize("name,content,why", BAD_COUNTS, ids=[b[0] for b in BAD_COUNTS])
def test_a_bad_token_count_is_counted_again_with_a_warning_naming_its_file(
    token_counts, monkeypatch, name, content, why
):
    from specsweep import workloads

    text = "def f(x):\n    return x * 2  # a text of a few tokens\n"
    assert workloads.token_bound(text) == 54  # its 53 bytes + 1
    true = true_count(text)
    count_tokens(text)
    (entry,) = list(token_counts.glob("*/*"))
    entry.write_text(content(text))
    with pytest.warns(
        WorkloadWarning, match=re.escape(f"token count {entry} not used: ") + ".*" + re.escape(why)
    ) as caught:
        assert count_tokens(text) == true
    assert len(caught) == 1
    assert json.loads(entry.read_text())["count"] == true  # rewritten
    assert [p.name for p in entry.parent.iterdir()] == [entry.name]  # atomically: no temporary file left
    monkeypatch.setattr(workloads, "tokenizer", None)  # the rewritten entry is used, the tokenizer not asked
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert count_tokens(text) == true


def test_prompts_are_built_from_true_counts_when_the_counts_were_overwritten(token_counts):
    workload = family("short", requests=4)
    before = [s.tokens for s in build(workload, 0, context_length=CONTEXT)]
    entries = list(token_counts.glob("*/*"))
    assert len(entries) == 4
    for entry in entries:
        entry.write_text("100")
    with pytest.warns(WorkloadWarning) as caught:
        after = [s.tokens for s in build(workload, 0, context_length=CONTEXT)]
    assert after == before and 100 not in after
    assert sorted(str(w.message).split(" not used")[0] for w in caught) == sorted(f"token count {e}" for e in entries)


def test_a_count_beyond_the_texts_bound_is_not_kept(token_counts, monkeypatch):
    from specsweep import workloads

    class Spread:
        """A tokenizer that makes two tokens of every byte, more than any text's bound."""

        def encode(self, text, add_special_tokens=False):
            return type("Encoding", (), {"ids": [0] * (2 * len(text.encode()))})()

    monkeypatch.setattr(workloads, "tokenizer", lambda model_path=None: Spread())
    assert count_tokens("abc") == 6
    assert list(token_counts.glob("*/*")) == []  # counted each time, never read back as a bad entry


def test_where_a_long_prompt_is_cut_is_worked_out_once_and_read_back(token_counts, monkeypatch):
    """Building a long workload encoded each prompt's documents whole to cut them at the target (about 2.4 s of
    every server job of the default plan); the cut is now kept beside the token counts, so that a later build
    (another process) gives the same prompts without the tokenizer."""
    from specsweep import workloads

    workload = family("long", requests=4, context_tokens=2000, max_new_tokens=64)
    first = [s.messages for s in build(workload, 0, context_length=CONTEXT)]
    monkeypatch.setattr(workloads, "tokenizer", None)  # every count and every cut is read back
    workloads._file_tokens.cache_clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [s.messages for s in build(workload, 0, context_length=CONTEXT)] == first


def test_the_warm_up_fills_a_wave_above_warmup_but_not_for_a_trace_or_with_warm_up_off():
    """concurrency - warmup fill sessions where the concurrency is higher; none at or below warmup, none with
    warm-up off (0), none for a traced workload (its window may hold fewer sessions than a wave)."""
    assert [warmup_fill(2, c) for c in (1, 2, 4, 16, 64)] == [0, 0, 2, 14, 62]
    assert warmup_fill(0, 64) == 0
    assert warmup_fill(2, 64, {"source": "trace", "path": "t.jsonl"}) == 0
    assert warmup_fill(2, 64, {"source": "builtin"}) == 62
