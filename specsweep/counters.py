"""What the server says about itself: Prometheus counters and gauges, /server_info."""

from __future__ import annotations

import threading

import requests
from prometheus_client.parser import text_string_to_metric_families


def parse_prometheus(text: str) -> dict[str, float]:
    """Sum of each sample name's values over its label sets, from Prometheus text format (read with
    prometheus_client's parser: label values may hold any character, "}" and escaped quotes included).

    Raises ValueError, naming what could not be read, when the text is not Prometheus text format."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + float(sample.value)
    return out


def scrape(url: str, headers: dict | None = None) -> dict[str, float]:
    """The server's /metrics, summed per sample name (parse_prometheus); {} when it has none (unreachable, or not
    200: SGLang serves it only with --enable-metrics). Raises ValueError when the answer is not Prometheus text."""
    try:
        resp = requests.get(url + "/metrics", timeout=10, headers=headers)
    except requests.RequestException:
        return {}
    if resp.status_code != 200:
        return {}
    try:
        return parse_prometheus(resp.text)
    except ValueError as exc:
        raise ValueError(
            f"{url}/metrics answered text that is not Prometheus text format ({exc}); the server's "
            "counters cannot be read: check that the URL is the SGLang server itself"
        ) from None


INFO_PATHS = ("/server_info", "/get_server_info")  # the second is SGLang's older spelling


def read_server_info(url: str, headers: dict | None = None, timeout: float = 10) -> tuple[dict | None, str, list[str]]:
    """(the server's own description, the path that gave it, what each path tried answered): /server_info, else
    /get_server_info; (None, "", [path: what it answered, ...]) when neither answers with a JSON object."""
    tried = []
    for path in INFO_PATHS:
        try:
            resp = requests.get(url + path, timeout=timeout, headers=headers)
        except requests.RequestException as exc:
            tried.append(f"{path}: {type(exc).__name__}")
            continue
        if resp.status_code != 200:
            tried.append(f"{path}: HTTP {resp.status_code}")
            continue
        try:
            info = resp.json()
        except ValueError:
            info = None
        if isinstance(info, dict):
            return info, path, tried
        tried.append(f"{path}: not a JSON object")
    return None, "", tried


def server_info(url: str, headers: dict | None = None) -> dict:
    """The server's /server_info (or /get_server_info) answer; {} when it has none."""
    return read_server_info(url, headers)[0] or {}


def server_cumulative_acceptance(info: dict) -> float | None:
    """internal_states[0].avg_spec_accept_length from server info (cumulative since launch)."""
    states = info.get("internal_states") or [{}]
    return states[0].get("avg_spec_accept_length")


# What the report and provenance keep of the server's own account of its settings.
SERVER_INFO_KEYS = (
    "version",
    "attention_backend",
    "prefill_attention_backend",
    "decode_attention_backend",
    "sampling_backend",
    "page_size",
    "disable_overlap_schedule",
    "max_running_requests",
    "min_free_slots_delay",
    "incremental_streaming_output",
    "load_format",
    "speculative_algorithm",
    "speculative_num_draft_tokens",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_ngram_max_bfs_breadth",
    "speculative_ngram_match_type",
    "cuda_graph_max_bs",
    "context_length",
    "mem_fraction_static",
    "sim_time_scale",
    "sim_clock",  # the simulated server's schedule since launch: steps, steps late, seconds late (sim/clock.py)
)


class LoadSampler:
    """Samples the server's running and queued requests (Prometheus gauges) while a cell is measured.

    Server running requests = time-weighted mean (over samples every ``interval`` s) and peak of
    sglang:num_running_reqs; queued likewise from sglang:num_queue_reqs.
    """

    def __init__(self, url: str, headers: dict | None = None, interval: float = 0.5):
        self.url, self.headers, self.interval = url, headers, interval
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=15)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):  # the first sample one interval in, once requests are out
            values = scrape(self.url, self.headers)
            if "sglang:num_running_reqs" in values:
                self.samples.append((values["sglang:num_running_reqs"], values.get("sglang:num_queue_reqs", 0.0)))

    def summary(self) -> dict:
        if not self.samples:
            return {"samples": 0}
        running = [r for r, _ in self.samples]
        queued = [q for _, q in self.samples]
        return {
            "samples": len(self.samples),
            "interval_s": self.interval,
            "running_mean": sum(running) / len(running),
            "running_peak": max(running),
            "queued_mean": sum(queued) / len(queued),
            "queued_peak": max(queued),
        }


def counter_deltas(before: dict, after: dict) -> dict:
    """Server counters differenced over the measurement window (never cumulative values)."""
    return {k: after[k] - before.get(k, 0.0) for k in after if k.endswith("_total")}
