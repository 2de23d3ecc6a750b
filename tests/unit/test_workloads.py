"""Workloads: lengths, determinism, content mix, multi-turn structure, user files and bad data."""

from __future__ import annotations

import json

import pytest

from specsweep.text import chat_prompt
from specsweep.workloads import WorkloadError, build, content_mix, count_tokens, read_user_file, workload_digest


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
    jsonl = write(tmp_path, "p.jsonl", [json.dumps({"prompt": "What is 2+2?", "kind": "math"}),
                                        json.dumps({"messages": [{"role": "user", "content": "Hi"},
                                                                 {"role": "assistant", "content": "Hello"},
                                                                 {"role": "user", "content": "Tell a joke"}]})])
    rows = read_user_file(str(jsonl), "jsonl")
    assert rows[0][1] == "math" and rows[0][2][-1]["content"] == "What is 2+2?"
    assert rows[1][3] == [{"role": "user", "content": "Tell a joke"}]
    share = write(tmp_path, "s.json", [json.dumps([{"conversations": [
        {"from": "human", "value": "Q1"}, {"from": "gpt", "value": "A1"}, {"from": "human", "value": "Q2"}]}])])
    (row,) = read_user_file(str(share), "sharegpt")
    assert row[2][-1]["content"] == "Q1" and row[3][0]["content"] == "Q2"
    mt = write(tmp_path, "mt.jsonl", [json.dumps({"question_id": 81, "category": "coding", "turns": ["A", "B"]})])
    (row,) = read_user_file(str(mt), "mt-bench")
    assert row[1] == "code" and [m["content"] for m in row[3]] == ["B"]
    spec = write(tmp_path, "sb.jsonl", [json.dumps({"question_id": 1, "category": "math_reasoning", "turns": ["x"]})])
    assert read_user_file(str(spec), "spec-bench")[0][1] == "math"
    sessions = build({"name": "mine", "family": "short", "source": "file", "path": str(mt), "format": "mt-bench",
                      "requests": 3, "max_new_tokens": 64}, 0, context_length=CONTEXT)
    assert len(sessions) == 3 and all(len(s.followups) == 1 for s in sessions)


BAD = [
    ("empty", [], "jsonl", "the file is empty"),
    ("malformed", ['{"prompt": "ok"}', '{"prompt": "broken"'], "jsonl", "line 2: not valid JSON"),
    ("unknown-line-format", ['{"text": "what format is this"}'], "jsonl", "line 1: unknown line format"),
    ("unknown-format", ['{"prompt": "x"}'], "alpaca", "unknown format 'alpaca'"),
    ("no-user-turn", ['{"prompt": "ok"}', json.dumps({"messages": [{"role": "system", "content": "be nice"}]})],
     "jsonl", "line 2: the conversation has no user turn"),
    ("mt-bench-no-turns", [json.dumps({"question_id": 1, "turns": []})], "mt-bench", "line 1: the conversation has no user turn"),
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
        build({"name": "w", "family": "short", "source": "file", "path": str(path), "requests": 2,
               "max_new_tokens": 64}, 0, context_length=4096)
