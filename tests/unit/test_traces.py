"""Traces replayed (workloads[].source: trace): the shipped Mooncake and Azure samples read, a malformed line refused
naming its file and line, prompts sharing exactly the prefixes the hash ids share, lengths as traced, over-context
inputs clipped or dropped and counted, and arrivals sent at the scaled traced times within the loop's bounds (a
simulated server the test starts, real HTTP on 127.0.0.1)."""

from __future__ import annotations

import itertools
import json
from importlib import resources

import pytest

from conftest import fast_config, load_default_config, start_sim, validated
from specsweep import traces, workloads
from specsweep.aggregate import trace_text
from specsweep.client import LoadModel, measure
from specsweep.errors import ConfigError

MOONCAKE = str(resources.files("specsweep").joinpath("data/traces/sample-mooncake.jsonl"))
AZURE = str(resources.files("specsweep").joinpath("data/traces/sample-azure.csv"))


def trace_workload(path=MOONCAKE, **changes) -> dict:
    return {"name": "moon", "family": "short", "source": "trace", "path": path, "max_new_tokens": 512, **changes}


def sessions_of(workload: dict, context_length: int = 40960) -> list:
    workload = dict(workload)
    workload.setdefault("requests", workloads.trace_account(workload, context_length)["requests"])
    return workloads.build(workload, 0, context_length=context_length)


def token_ids(session) -> list[int]:
    text = session.chat_template.render(session.messages, False)
    return workloads.tokenizer(None).encode(text, add_special_tokens=False).ids


def common_prefix(a: list, b: list) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def trailing_pads(text: str) -> int:
    """The one-token words (traces.PAD) a filled prompt ends with (at most: the text may end with such a word)."""
    count = 0
    while text.endswith(traces.PAD):
        text, count = text[: -len(traces.PAD)], count + 1
    return count


def opening_and_closing(session) -> tuple[list[int], list[int]]:
    """The chat template's tokens before a user's text, and after it (the end of the turn)."""
    opening = workloads.tokenizer(None).encode("<|im_start|>user\n", add_special_tokens=False).ids
    empty = session.chat_template.render([{"role": "user", "content": ""}], False)
    return opening, workloads.tokenizer(None).encode(empty, add_special_tokens=False).ids[len(opening) :]


# two blocks of different names part within this many tokens of the first: OPENING_TOKENS, and a block's own line
# past its corpus's blocks, "(n)\n"
PARTING = traces.OPENING_TOKENS + 4


def test_prompts_share_exactly_the_prefixes_their_hash_ids_share():
    """For every pair of requests of the shipped Mooncake trace: the token prefix they share covers the chat
    template's header and every block their hash ids share, and ends within a few tokens of the first block they do
    not share."""
    sessions = sessions_of(trace_workload())
    rows = {r.line: r for r in traces.read_trace(MOONCAKE, "mooncake")}
    header = len(token_ids(sessions[0])) - sessions[0].tokens  # 0: tokens counts the whole rendered prompt
    assert header == 0
    opening, closing = opening_and_closing(sessions[0])
    tokens = {s.trace["line"]: token_ids(s) for s in sessions}
    kinds = {s.trace["line"]: s.kind for s in sessions}
    padding = {s.trace["line"]: trailing_pads(s.messages[0]["content"]) for s in sessions}
    shared_pairs = parted_pairs = 0
    for a, b in itertools.combinations(sorted(tokens), 2):
        ha, hb = rows[a].hash_ids, rows[b].hash_ids
        k = common_prefix(list(ha), list(hb))
        common = common_prefix(tokens[a], tokens[b])
        # the content both hold (a request's last block is cut to its length, where its tokens are the block's first,
        # then made up with one-token words)
        whole = min(len(tokens[x]) - len(closing) - padding[x] for x in (a, b))
        # a block holds BLOCK_TOKENS - 1 tokens of text and a line's end (which may merge with its last token)
        least, most = len(opening) + k * (traces.BLOCK_TOKENS - 2), len(opening) + k * traces.BLOCK_TOKENS
        if k:
            shared_pairs += 1
            assert kinds[a] == kinds[b]  # the first block decides a request's content
            assert common >= min(least, whole), (a, b, k, common, least)
        if k < min(len(ha), len(hb)) and most + PARTING < whole:  # a block neither shares: they part at its start
            parted_pairs += 1
            assert common < most + PARTING, (a, b, k, common, most)
    assert shared_pairs and parted_pairs


def test_requests_that_share_no_hash_id_share_no_text_and_no_prompt_repeats_a_block(tmp_path):
    """Hundreds of requests whose hash ids are all different (more blocks than the content's corpora hold): no two
    prompts share more than a few tokens past the chat template's opening."""
    path = tmp_path / "disjoint.jsonl"
    lines = [
        {
            "timestamp": 10 * i,
            "input_length": 1400 + 37 * (i % 5),
            "output_length": 8,
            "hash_ids": [3 * i, 3 * i + 1, 3 * i + 2],
        }
        for i in range(300)
    ]
    long = {"timestamp": 3000, "input_length": 16 * 512, "output_length": 8, "hash_ids": list(range(10**6, 10**6 + 16))}
    path.write_text("".join(json.dumps(r) + "\n" for r in [*lines, long]))
    sessions = sessions_of(trace_workload(str(path), name="disjoint"))
    assert len(sessions) == 301 and {s.kind for s in sessions} == set(workloads.SHORT_MIX)
    blocks = sum(len(r["hash_ids"]) for r in lines)
    assert blocks > sum(len(workloads._trace_corpus(k, None).starts) for k in {s.kind for s in sessions})
    opening, _ = opening_and_closing(sessions[0])
    tokens = [token_ids(s) for s in sessions]
    worst = max(common_prefix(a, b) for a, b in itertools.combinations(tokens, 2)) - len(opening)
    assert worst < PARTING, worst


def test_a_block_name_keeps_its_block_and_no_prompt_uses_a_block_twice_while_its_corpus_has_others():
    """assign_blocks over a window: a hash id shared by two requests is one block in both, different names are
    different blocks, and a request holds no block twice (modulo the corpus's blocks) while the corpus has more
    blocks than it holds; identical requests (the same hash ids) get the same blocks, past their hash ids too."""
    size = 5
    corpus = traces.Corpus("x", ((0, 1),), tuple(range(size)))  # block() is not called: only its count matters
    requests = [
        traces.TraceRequest(1, 0.0, 900, 4, (1, 2)),
        traces.TraceRequest(2, 1.0, 1400, 4, (3, 4, 5)),
        traces.TraceRequest(3, 2.0, 1900, 4, (1, 6, 7, 8)),
        traces.TraceRequest(4, 3.0, 5000, 4, (1, 6, 7, 8)),  # the same hash ids, longer: blocks of its own past them
        traces.TraceRequest(5, 4.0, 5000, 4, (1, 6, 7, 8)),
        traces.TraceRequest(6, 5.0, 3000, 4, tuple(range(20, 27))),  # more blocks than the corpus holds
        traces.TraceRequest(7, 6.0, 1200, 4),  # no hash ids: blocks of its own
    ]
    window = [(r, r.input_length) for r in requests]
    blocks = traces.assign_blocks(window, lambda r: ("code", corpus))
    named: dict[str, int] = {}
    for (request, length), indices in zip(window, blocks):
        keys = traces.block_keys(request, length)
        assert len(indices) == len(keys) and len(indices) * (traces.BLOCK_TOKENS - 16) >= length
        for key, index in zip(keys, indices):
            assert named.setdefault(key, index) == index  # a name keeps its block
        if len(indices) <= size:
            assert len({i % size for i in indices}) == len(indices), (request.line, indices)
    assert len(set(named.values())) == len(
        named
    )  # different names, different blocks (past the corpus: a line of their own)
    assert blocks[2][0] == blocks[0][0] and blocks[3] == blocks[4] and blocks[3][: len(blocks[2])] == blocks[2]
    assert len(set(blocks[5][:size])) == size


def test_the_short_familys_trace_prompts_use_all_four_kinds_each_from_a_corpus_of_distinct_blocks():
    """The short family's trace prompts are filled with chat, math, code and JSON text, each kind's corpus holding at
    least MIN_BLOCKS blocks (with the default configuration's tokenizer: the Qwen one, which a model.path that is no
    local folder gets) whose openings differ, and requests of a window enough for every kind get every kind."""
    model_path = load_default_config()["model"]["path"]  # a Hugging Face name, no local folder: the Qwen tokenizer
    assert workloads.tokenizer_file(model_path) == workloads.tokenizer_file(None)
    assert workloads.trace_kinds("short", model_path) == workloads.SHORT_MIX
    for kind in workloads.SHORT_MIX:
        corpus = workloads._trace_corpus(kind, model_path)
        assert len(corpus.starts) >= traces.MIN_BLOCKS, (kind, len(corpus.starts))
        openings = [
            corpus.text[corpus.spans[i][0] : corpus.spans[i + traces.OPENING_TOKENS - 1][1]] for i in corpus.starts
        ]
        assert len(set(openings)) == len(openings), kind
    assert {s.kind for s in sessions_of(trace_workload())} == set(workloads.SHORT_MIX)


def test_each_kinds_trace_text_is_its_own():
    """No text fills trace prompts of two kinds, and none of the chat or math text is a JSON kind's question (BFCL's
    live user turns hold one of them); the GSM8K solutions are there without their calculator annotations."""
    texts = {kind: workloads.trace_texts(kind) for kind in workloads.SHORT_MIX}
    for a, b in itertools.combinations(workloads.SHORT_MIX, 2):
        assert not set(texts[a]) & set(texts[b]), (a, b)
    questions = {question for _, question in workloads._bfcl_simple()}
    assert not questions & (set(texts["chat"]) | set(texts["math"]))
    assert all(len(set(kind_texts)) == len(kind_texts) for kind_texts in texts.values())
    assert "####" in " ".join(texts["math"]) and "<<" not in " ".join(texts["math"])
    with pytest.raises(workloads.WorkloadError, match="no trace text for content kind 'poetry'"):
        workloads.trace_texts("poetry")


def test_a_content_corpus_too_small_to_fill_distinct_blocks_is_not_used(monkeypatch):
    """A kind whose corpus holds fewer than MIN_BLOCKS blocks is left out of the family's trace kinds (its blocks
    would repeat across and within prompts); code where no kind has enough."""
    real = workloads._trace_corpus
    small = traces.Corpus("x", ((0, 1),), tuple(range(traces.MIN_BLOCKS - 1)))

    monkeypatch.setattr(workloads, "_trace_corpus", lambda kind, path: small if kind == "math" else real(kind, path))
    assert workloads.trace_kinds("short", None) == ("chat", "code", "json")
    monkeypatch.setattr(workloads, "_trace_corpus", lambda kind, path: small)
    assert workloads.trace_kinds("short", None) == ("code",)
    assert workloads.trace_kinds("long", None) == ("code",)


def test_inputs_and_outputs_are_the_traced_lengths_and_every_request_names_its_line():
    sessions = sessions_of(trace_workload())
    rows = traces.read_trace(MOONCAKE, "mooncake")
    assert [s.trace["line"] for s in sessions] == [r.line for r in rows]
    for s, r in zip(sessions, rows):
        assert s.id == f"moon-line{r.line}"
        assert s.tokens == r.input_length, (r.line, s.tokens, r.input_length)
        assert (s.max_new_tokens, s.ignore_eos) == (r.output_length, True)
    azure = sessions_of(trace_workload(AZURE, name="az"))
    lengths = [r.input_length for r in traces.read_trace(AZURE, "azure")]
    assert [s.tokens for s in azure] == lengths
    assert [s.id for s in azure][:2] == ["az-line2", "az-line3"]  # line 1 is the header


def test_a_window_selects_by_seconds_or_lines_and_the_time_scale_divides_the_arrivals():
    rows = traces.read_trace(MOONCAKE, "mooncake")
    window = traces.Window.of({"window": {"start_s": 1.0, "duration_s": 5.0}, "time_scale": 4})
    chosen = window.select(rows)
    assert chosen and all(1.0 <= r.arrival_s < 6.0 for r in chosen)
    assert len(chosen) == sum(1.0 <= r.arrival_s < 6.0 for r in rows)
    assert window.replay_times(chosen) == pytest.approx([(r.arrival_s - 1.0) / 4 for r in chosen])
    lines = traces.Window.of({"window": {"first_line": 5, "last_line": 9}})
    picked = lines.select(rows)
    assert [r.line for r in picked] == [5, 6, 7, 8, 9]
    assert lines.replay_times(picked)[0] == 0.0
    account = workloads.trace_account(trace_workload(window={"first_line": 5, "last_line": 9}, time_scale=2), 40960)
    assert (account["requests"], account["lines"], account["time_scale"]) == (5, [5, 9], 2)
    text = trace_text(account)
    assert "sample-mooncake.jsonl (mooncake)" in text and "lines 5-9, time scale 2x" in text


def test_inputs_over_the_context_are_clipped_or_dropped_by_the_stated_rule_and_counted():
    rows = traces.read_trace(MOONCAKE, "mooncake")
    context = 2048
    over = [r for r in rows if r.input_length + r.output_length > context]
    assert over  # the sample holds requests longer than this context
    clipped = sessions_of(trace_workload(), context)
    assert len(clipped) == len(rows)
    for s in clipped:
        if s.trace["clipped"]:
            assert s.tokens == context - s.max_new_tokens
        assert s.tokens + s.max_new_tokens <= context
    assert sum(s.trace["clipped"] for s in clipped) == len(over)
    account = workloads.trace_account(trace_workload(over_context="drop"), context)
    assert (account["clipped"], account["dropped"], account["requests"]) == (0, len(over), len(rows) - len(over))
    dropped = sessions_of(trace_workload(over_context="drop"), context)
    assert {s.trace["line"] for s in dropped} == {r.line for r in rows} - {r.line for r in over}


@pytest.mark.parametrize(
    "fmt, content, message",
    [
        (
            "mooncake",
            '{"timestamp": 0, "input_length": 10, "output_length": 4, "hash_ids": [1]}\nnot json\n',
            "line 2: not a JSON object",
        ),
        ("mooncake", '\n{"timestamp": 0, "output_length": 4, "hash_ids": [1]}\n', "line 2: no 'input_length'"),
        (
            "mooncake",
            '{"timestamp": 0, "input_length": 10, "output_length": 4, "hash_ids": "1,2"}\n',
            "line 1: 'hash_ids' must be a list",
        ),
        (
            "mooncake",
            '{"timestamp": -5, "input_length": 10, "output_length": 4}\n',
            "line 1: 'timestamp' must be milliseconds",
        ),
        (
            "mooncake",
            '{"timestamp": 0, "input_length": 0, "output_length": 4}\n',
            "line 1: 'input_length' must be a whole number of at least 1",
        ),
        (
            "mooncake",
            '{"timestamp": Infinity, "input_length": 10, "output_length": 4}\n',
            "line 1: 'timestamp' must be milliseconds",
        ),
        (
            "mooncake",
            '{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [1, 2, 3]}\n',
            "line 1: 3 hash_ids for an input of 600 tokens, which holds at most 2 blocks",
        ),
        (
            "mooncake",
            '{"timestamp": 0, "input_length": 9, "output_length": 4, "id": "a"}\n'
            '{"timestamp": 1, "input_length": 9, "output_length": 4, "id": "a"}\n',
            "line 2: id 'a' is line 1's too",
        ),
        ("azure", "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.0,10\n", "line 1: the header has no GeneratedTokens"),
        (
            "azure",
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.0,10,4\nyesterday,10,4\n",
            "line 3: TIMESTAMP 'yesterday'",
        ),
        (
            "azure",
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.0,ten,4\n",
            "line 2: 'ContextTokens' must be a whole number",
        ),
    ],
)
def test_a_malformed_line_is_refused_naming_the_file_and_line(tmp_path, fmt, content, message):
    path = tmp_path / ("trace.csv" if fmt == "azure" else "trace.jsonl")
    path.write_text(content)
    config = fast_config()
    config["workloads"] = [trace_workload(str(path))]
    with pytest.raises(ConfigError) as refused:
        validated(config)
    assert f"{path}: {message}" in str(refused.value)


def test_azure_times_are_utc_whatever_the_host_zone_and_a_byte_order_mark_is_read(tmp_path, monkeypatch):
    """Two arrivals an hour apart across New York's change from summer time are an hour apart on a host in that zone
    (read in local time they were two); a file starting with a byte-order mark reads its header."""
    import time

    path = tmp_path / "dst.csv"
    path.write_text(
        "\ufeffTIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-05 01:30:00.0,10,4\n2023-11-05 02:30:00.0,12,4\n",
        encoding="utf-8",
    )
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        rows = traces.read_trace(str(path), "azure")
    finally:
        monkeypatch.undo()
        time.tzset()
    assert [r.arrival_s for r in rows] == [0.0, 3600.0]


def test_an_input_shorter_than_the_chat_template_is_marked_lengthened(tmp_path):
    path = tmp_path / "tiny.jsonl"
    path.write_text(
        json.dumps({"timestamp": 0, "input_length": 3, "output_length": 4})
        + "\n"
        + json.dumps({"timestamp": 5, "input_length": 300, "output_length": 4})
        + "\n"
    )
    tiny, fine = sessions_of(trace_workload(str(path), name="tiny"))
    assert tiny.tokens > 3 and tiny.trace["lengthened"] is True
    assert fine.tokens == 300 and fine.trace["lengthened"] is False


def test_a_request_asking_for_no_output_is_counted_apart_from_those_over_the_context(tmp_path):
    path = tmp_path / "zero.jsonl"
    lines = [
        {"timestamp": 0, "input_length": 100, "output_length": 8},
        {"timestamp": 10, "input_length": 100, "output_length": 0},
        {"timestamp": 20, "input_length": 3000, "output_length": 8},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    account = workloads.trace_account(trace_workload(str(path), over_context="drop"), 2048)
    assert (account["requests"], account["dropped"], account["no_output"]) == (1, 1, 1)
    assert "1 dropped over the context (drop), 1 asking for no output dropped" in trace_text(account)


def test_trace_settings_on_another_source_and_too_many_requests_are_refused():
    config = fast_config()
    config["workloads"][0]["time_scale"] = 2
    with pytest.raises(ConfigError, match=r"workloads\[0\] \(short\)\.time_scale: only a trace has it"):
        validated(config)
    config = fast_config()
    config["workloads"] = [trace_workload(requests=25)]
    with pytest.raises(ConfigError, match=r"requests: 25, but its trace window holds 24 requests"):
        validated(config)
    config["workloads"] = [trace_workload()]
    assert validated(config)["workloads"][0]["requests"] == 24  # the window's requests, at every concurrency


def ordered_by_send(records) -> list:
    return sorted(records, key=lambda r: r.t0)


def test_arrivals_are_sent_at_the_scaled_traced_times_within_the_loop_bound(tmp_path):
    """A simulated server started here: under concurrency 8 every request is scheduled at its traced arrival / time
    scale and sent no earlier; under concurrency 1 the schedule is the same, and no request is sent before the one
    in flight ends (the bound shows as queue delay). Outputs are the traced lengths (ignore_eos)."""
    scale = 20.0
    sessions = sessions_of(trace_workload(time_scale=scale, window={"first_line": 1, "last_line": 12}))
    rows = traces.read_trace(MOONCAKE, "mooncake")[:12]
    expected = [(r.arrival_s - rows[0].arrival_s) / scale for r in rows]
    server = start_sim(tmp_path, "--sim-time-scale", "50", "--sim-tokenizer", "approximate")
    try:
        for concurrency in (8, 1):
            records = measure(server.url, sessions, concurrency, {"temperature": 0.0}, 60, load=LoadModel("trace"))
            by_session = {r.session: r for r in records}
            assert len(records) == len(sessions) and all(r.ok for r in records)
            for session, due in zip(sessions, expected):
                record = by_session[session.id]
                assert record.t_sched == pytest.approx(due, abs=1e-6)
                assert record.t0 >= record.t_sched
                assert record.output_tokens == record.expected_tokens == session.max_new_tokens
            sends = [by_session[s.id].t0 for s in sessions]
            assert sends == sorted(sends)  # sent in the schedule's order
            if concurrency == 1:
                ordered = sorted(records, key=lambda r: r.t0)
                assert all(b.t0 >= a.t_end for a, b in zip(ordered, ordered[1:]))
            else:  # open loop: a request due goes while an earlier one is still in flight
                assert any(b.t0 < a.t_end for a, b in itertools.combinations(ordered_by_send(records), 2))
    finally:
        server.stop()


def test_a_trace_cell_records_its_trace(tmp_path):
    """The cell's workload record states the trace, its window and time scale, and what did not fit."""
    from specsweep.cells import _workload_record
    from specsweep.jobs import server_job

    config = fast_config()
    config["workloads"] = [trace_workload(window={"start_s": 0, "duration_s": 8}, time_scale=2)]
    config["model"] = dict(config.get("model") or {}, name="Qwen3-8B", context_length=2048)
    config = validated(config)
    job = server_job(config, 1, "ar")
    rows = traces.Window.of(config["workloads"][0]).select(traces.read_trace(MOONCAKE, "mooncake"))
    fits = [r for r in rows if 1 <= r.output_length < 2048]  # every one fits: clipped where it is over
    over = next(i for i, r in enumerate(fits) if r.input_length + r.output_length > 2048)
    sent = fits[: over + 1]  # a cell that sends up to the first clipped request, and no further
    assert len(sent) < len(fits)
    cell = {"workload": "moon", "concurrency": 1, "requests": len(sent)}
    record = _workload_record(job, cell, "d", sessions_of(config["workloads"][0], 2048)[: len(sent)])
    trace = record["trace"]
    assert (trace["file"], trace["format"], trace["window"]) == (
        "sample-mooncake.jsonl",
        "mooncake",
        "0 s to 8 s, time scale 2x",
    )
    # the account is of what the cell sent: its requests, their lines, what was clipped or dropped up to its last
    assert (trace["requests"], trace["lines"], trace["clipped"]) == (len(sent), [sent[0].line, sent[-1].line], 1)
    assert trace["no_output"] == sum(r.output_length < 1 for r in rows[: rows.index(sent[-1]) + 1])
    assert trace["dropped"] == 0  # clipped, not dropped: no output fills the context alone
    assert record["sessions"] == trace["requests"] and json.dumps(record)
    whole = workloads.trace_account(config["workloads"][0], 2048)
    assert whole["requests"] == len(fits) > trace["requests"]


def test_a_trace_window_over_the_session_limit_and_adaptive_stopping_are_refused(tmp_path):
    """A trace window holding more requests than a cell may send is refused (naming the window and requests); so is
    adaptive stopping on a configuration with a trace workload (a replay sends its window's requests)."""
    from specsweep.config import MAX_SESSIONS

    path = tmp_path / "long.jsonl"
    count = MAX_SESSIONS + 5
    path.write_text(
        "".join(json.dumps({"timestamp": i, "input_length": 40, "output_length": 4}) + "\n" for i in range(count))
    )
    config = fast_config()
    config["workloads"] = [trace_workload(str(path), name="long")]
    with pytest.raises(
        ConfigError, match=rf"holds {count} requests .* more than the {MAX_SESSIONS}.*workloads\[\]\.window"
    ):
        validated(config)
    config["workloads"] = [trace_workload(str(path), name="long", requests=MAX_SESSIONS)]
    assert validated(config)["workloads"][0]["requests"] == MAX_SESSIONS
    config["workloads"] = [trace_workload(str(path), name="long", window={"first_line": 1, "last_line": 50})]
    assert validated(config)["workloads"][0]["requests"] == 50
    config["adaptive"] = {"enabled": True}
    with pytest.raises(ConfigError, match=r"adaptive\.enabled: workload 'long' replays a trace"):
        validated(config)


def test_a_line_with_an_id_names_its_request_and_warm_ups_are_sent_at_once(tmp_path):
    """A Mooncake line's id names its request's sessions; a cell's warm-up sessions from a trace carry no arrival
    (they go closed loop, before the measured ones) and share no prefix with them."""
    path = tmp_path / "ids.jsonl"
    rows = [
        {"timestamp": 500 * i, "input_length": 300, "output_length": 8, "hash_ids": [0], "id": f"r{i}"}
        for i in range(4)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    workload = trace_workload(str(path), name="ids", requests=4)
    measured = sessions_of(workload)
    assert [s.id for s in measured] == ["ids-r0", "ids-r1", "ids-r2", "ids-r3"]
    assert [s.arrival for s in measured] == [0.0, 0.5, 1.0, 1.5]
    warm = workloads.warmup_sessions(workload, 2, 0, context_length=40960)
    assert [s.arrival for s in warm] == [None, None]
    assert all(common_prefix(token_ids(w), token_ids(measured[0])) < 8 for w in warm)


def test_the_plan_prices_a_trace_cell_at_least_until_its_last_send():
    from specsweep import plan
    from specsweep.methods import expand_methods

    last = traces.read_trace(MOONCAKE, "mooncake")[-1].arrival_s
    priced = {}
    for scale in (1, 4):
        config = fast_config()
        config["workloads"] = [trace_workload(time_scale=scale)]
        config = validated(config)
        method = expand_methods(config)[0]
        priced[scale] = plan.cell_seconds(config, 1, method, config["workloads"][0], 2, 24)
        assert priced[scale] > last / scale
    assert priced[4] < priced[1]
