"""The server's counters: Prometheus text read whatever its label values hold."""

from __future__ import annotations

import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conftest import patience, start_sim
from specsweep.client import LoadModel, measure
from specsweep.counters import counter_deltas, parse_prometheus, scrape
from specsweep.workloads import Session

# SGLang's exposition (prometheus_client's): one sample per label set; a label value may hold "}" and "\"".
EXPOSITION = r"""# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="qwen3",tp_rank="0"} 300.0
sglang:generation_tokens_total{model_name="qwen3 {tp=1}",tp_rank="0"} 1200.0
sglang:generation_tokens_created{model_name="qwen3",tp_rank="0"} 1.7e9
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="say \"}\" twice",tp_rank="0"} 3.0
"""


def test_every_sample_is_summed_whatever_its_label_values_hold():
    values = parse_prometheus(EXPOSITION)
    assert values["sglang:generation_tokens_total"] == 1500.0  # 300 + 1,200: none lost to the "}"
    assert values["sglang:num_running_reqs"] == 3.0


class LoginPage(BaseHTTPRequestHandler):
    """What a proxy in front of the server may answer on any path: a 200 page that is not Prometheus text."""

    def do_GET(self):
        body = b"<html><body>login</body></html>\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_text_that_is_not_prometheus_is_refused_with_the_url_named():
    server = ThreadingHTTPServer(("127.0.0.1", 0), LoginPage)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with pytest.raises(ValueError, match=re.escape(f"{url}/metrics answered text that is not Prometheus")):
            scrape(url)
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("name", ["qwen3 {tp=1}", 'say "}" \\ twice'])
def test_a_served_model_name_with_a_brace_a_quote_or_a_backslash_keeps_every_generated_token(tmp_path, name):
    server = start_sim(tmp_path, "--served-model-name", name)
    try:
        before = scrape(server.url)
        sessions = [Session(f"s{i}", "chat", [{"role": "user", "content": f"count to {i}"}], [], 500) for i in range(3)]
        records = measure(
            server.url, sessions, 3, {"temperature": 0.0}, timeout=patience(24), load=LoadModel(ignore_eos=True)
        )
        after = scrape(server.url)
    finally:
        server.stop()
    assert [r.error for r in records] == [None] * 3
    delta = counter_deltas(before, after)
    assert sum(r.output_tokens for r in records) == 1500
    assert delta["sglang:generation_tokens_total"] == 1500.0
