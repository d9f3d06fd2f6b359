"""vLLM-style Prometheus metrics of the emulated engine.

Names and meanings follow vLLM v1's ``/metrics`` so that a scraper written
for vLLM reads the emulator unchanged: gauges ``vllm:num_requests_waiting``,
``vllm:num_requests_running``, ``vllm:kv_cache_usage_perc`` (a fraction in
[0, 1], as vLLM reports it); counters in tokens ``vllm:prefix_cache_queries``
and ``vllm:prefix_cache_hits`` (``_total`` in the exposition),
``vllm:prompt_tokens``, ``vllm:generation_tokens``; histograms of TTFT, E2E
latency and time per output token in seconds, measured from the request's
arrival at the engine (not counting the emulated network delay), in wall
seconds (emulated seconds divided by the speed factor).

``longroute:requests_received_total{model_name}`` counts valid generation
requests that reached the engine's front end, ``longroute:requests_aborted_total``
those whose client left before their last token (their work stopped then), and
``longroute:requests_poisoned_total`` those answered 500 for a poison prompt.

With an accuracy table, ``longroute:kv_answers_total{model_name, outcome}``
counts KV-lookup answers by ``outcome`` ("correct" or "wrong"), when the
verdict is decided (the request passed its fault decisions).

Each app has its own ``CollectorRegistry``: several emulators in one process
(tests) never share counters. Counters advance when the engine reports a
first token (prompt side) or a finish (generation side).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from longroute.sim.sequence import Sequence

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                   2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
_E2E_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                  60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
_TPOT_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                   5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip


class EmulatorMetrics:
    """The engine's counters; an ``EngineObserver`` of the driver."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ["model_name"]
        reg = self.registry

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=reg)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=reg)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, labels, registry=reg, buckets=buckets)

        self._waiting = gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.")
        self._running = gauge("vllm:num_requests_running", "Requests in model execution.")
        self._kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage; 1 means 100%.")
        self._prefix_queries = counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in prompt tokens."
        )
        self._prefix_hits = counter("vllm:prefix_cache_hits", "Prefix cache hits, in tokens.")
        self._prompt_tokens = counter("vllm:prompt_tokens", "Prefill tokens processed.")
        self._generation_tokens = counter("vllm:generation_tokens", "Generation tokens.")
        self._preemptions = counter("vllm:num_preemptions", "Cumulative preemptions.")
        self._success = Counter(
            "vllm:request_success",
            "Successfully processed requests.",
            ["model_name", "finished_reason"],
            registry=reg,
        )
        self._kv_answers = Counter(
            "longroute:kv_answers",
            "KV-lookup answers by outcome (correct, wrong).",
            ["model_name", "outcome"],
            registry=reg,
        )
        self.requests_received = counter(
            "longroute:requests_received", "Valid generation requests received."
        ).labels(model_name)
        self.requests_aborted = counter(
            "longroute:requests_aborted", "Requests whose client left before their last token."
        ).labels(model_name)
        self.requests_poisoned = counter(
            "longroute:requests_poisoned", "Requests answered 500 for a poison prompt."
        ).labels(model_name)
        self._ttft = histogram(
            "vllm:time_to_first_token_seconds", "Time to first token.", _TTFT_BUCKETS_S
        )
        self._e2e = histogram(
            "vllm:e2e_request_latency_seconds", "End-to-end request latency.", _E2E_BUCKETS_S
        )
        self._tpot = histogram(
            "vllm:time_per_output_token_seconds", "Time per output token.", _TPOT_BUCKETS_S
        )
        self._model_name = model_name
        self._num_preemptions_seen = 0
        # bound children: no label lookup per observation
        self._queries_child = self._prefix_queries.labels(model_name)
        self._hits_child = self._prefix_hits.labels(model_name)
        self._prompt_child = self._prompt_tokens.labels(model_name)
        self._generation_child = self._generation_tokens.labels(model_name)
        self._ttft_child = self._ttft.labels(model_name)
        self._e2e_child = self._e2e.labels(model_name)
        self._tpot_child = self._tpot.labels(model_name)
        self._ttft_by_seq: dict[Sequence, float] = {}

    # ---- EngineObserver ---------------------------------------------------
    def on_first_token(self, seq: Sequence, ttft_s: float) -> None:
        self._queries_child.inc(seq.num_prompt_tokens)
        self._hits_child.inc(seq.num_cached_tokens or 0)
        self._prompt_child.inc(seq.num_prompt_tokens)
        self._ttft_child.observe(ttft_s)
        self._ttft_by_seq[seq] = ttft_s

    def on_finish(self, seq: Sequence, e2e_s: float, finish_reason: str) -> None:
        self._generation_child.inc(seq.num_generated)
        self._e2e_child.observe(e2e_s)
        ttft_s = self._ttft_by_seq.pop(seq, e2e_s)
        if seq.num_generated > 1:
            self._tpot_child.observe((e2e_s - ttft_s) / (seq.num_generated - 1))
        self._success.labels(self._model_name, finish_reason).inc()

    def on_kv_answer(self, is_correct: bool) -> None:
        """Count one KV-lookup verdict; called by the handler when it decides one."""
        self._kv_answers.labels(self._model_name, "correct" if is_correct else "wrong").inc()

    # ---- scrape -------------------------------------------------------------
    def render(self, num_waiting: int, num_running: int, kv_usage: float,
               num_preemptions: int) -> bytes:  # fmt: skip
        """The exposition text, with the gauges set to the engine's current state."""
        name = self._model_name
        self._waiting.labels(name).set(num_waiting)
        self._running.labels(name).set(num_running)
        self._kv_usage.labels(name).set(kv_usage)
        if num_preemptions > self._num_preemptions_seen:
            self._preemptions.labels(name).inc(num_preemptions - self._num_preemptions_seen)
            self._num_preemptions_seen = num_preemptions
        return generate_latest(self.registry)
