"""Server metrics in the Prometheus text exposition format (``GET /metrics``).

Counters (requests by endpoint and status, prompt and generated tokens, the prefix cache's looked-up
and hit tokens and evictions), gauges (running rows, waiting requests, the prefix cache's size and hit
rate) and histograms (request latency, time to first token, queue time, decode batch
size). Updated from the event loop and the scheduler thread, hence the lock.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Callable

PREFIX = "dsv32_"
SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
HISTOGRAMS = {
    "request_latency_seconds": ("time from request to last token", SECONDS),
    "time_to_first_token_seconds": ("time from request to the first generated token", SECONDS),
    "queue_time_seconds": ("time a request waited for a batch slot", SECONDS),
    "batch_size": ("rows in the batch at each decode step", (1, 2, 4, 8, 16, 32, 64, 128, 256)),
}
COUNTERS = {
    "requests_total": "finished requests by endpoint and HTTP status",
    "prompt_tokens_total": "prompt tokens of admitted requests",
    "generation_tokens_total": "generated tokens",
    "prefix_cache_queries_total": "prompt tokens looked up in the prefix cache",
    "prefix_cache_hits_total": "prompt tokens whose KV entries came from the prefix cache",
    "prefix_cache_evictions_total": "rows evicted from the prefix cache (least recently used)",
}
GAUGES = {
    "running_rows": "rows decoding now",
    "waiting_requests": "requests waiting for a slot",
    "prefix_cache_bytes": "memory the prefix cache's KV entries take",
    "prefix_cache_rows": "token sequences held in the prefix cache",
    "prefix_cache_hit_rate": "prefix_cache_hits_total / prefix_cache_queries_total",
}


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


class Metrics:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counters: dict[str, dict[tuple, float]] = {name: {} for name in COUNTERS}
        self.gauges: dict[str, float] = dict.fromkeys(GAUGES, 0.0)
        self.histograms = {name: [[0] * (len(b) + 1), 0.0, 0] for name, (_, b) in HISTOGRAMS.items()}
        self.sources: list[Callable[[], dict[str, float]]] = []

    def read_from(self, source: Callable[[], dict[str, float]]) -> None:
        """Counters and gauges (by name, unlabelled) that ``source`` returns when the metrics are
        rendered: numbers an object keeps itself, read where they are kept."""
        self.sources.append(source)

    def count(self, name: str, value: float = 1.0, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        with self.lock:
            self.counters[name][key] = self.counters[name].get(key, 0.0) + value

    def set_gauges(self, **values: float) -> None:
        with self.lock:
            for name, value in values.items():
                self.gauges[name] = float(value)

    def observe(self, name: str, value: float) -> None:
        buckets = HISTOGRAMS[name][1]
        with self.lock:
            counts, _, _ = hist = self.histograms[name]
            counts[bisect_left(buckets, value)] += 1
            hist[1] += value
            hist[2] += 1

    def render(self) -> str:
        """The Prometheus text format (version 0.0.4)."""
        lines: list[str] = []
        read = {name: value for source in self.sources for name, value in source().items()}
        with self.lock:
            for name, help_text in COUNTERS.items():
                lines += [f"# HELP {PREFIX}{name} {help_text}", f"# TYPE {PREFIX}{name} counter"]
                values = {(): read[name]} if name in read else self.counters[name] or {(): 0.0}
                lines += [f"{PREFIX}{name}{_labels(dict(k))} {v:g}" for k, v in sorted(values.items())]
            for name, help_text in GAUGES.items():
                lines += [f"# HELP {PREFIX}{name} {help_text}", f"# TYPE {PREFIX}{name} gauge"]
                lines.append(f"{PREFIX}{name} {read.get(name, self.gauges[name]):g}")
            for name, (help_text, buckets) in HISTOGRAMS.items():
                counts, total, n = self.histograms[name]
                lines += [f"# HELP {PREFIX}{name} {help_text}", f"# TYPE {PREFIX}{name} histogram"]
                running = 0
                for bound, c in zip([*buckets, "+Inf"], counts):
                    running += c
                    lines.append(f'{PREFIX}{name}_bucket{{le="{bound}"}} {running}')
                lines += [f"{PREFIX}{name}_sum {total:g}", f"{PREFIX}{name}_count {n}"]
        return "\n".join(lines) + "\n"
