"""Output length a router may expect: a quantile of recent completions, learned online.

A gateway does not know how long an answer will be; it knows the client's
``max_tokens`` (when given) and, once an answer ends, its ``usage.completion_tokens``.
:class:`OutputLengthEstimator` turns those completions into the expected length
of the next request, per ``(model, task)``. The simulator and the gateway use
this one class: the simulator feeds it each answer's length when the answer
reaches its client, the gateway feeds it each answer's usage; both read
:meth:`~OutputLengthEstimator.estimate` when they build the router's
:class:`~longroute.types.Request`.

The estimate is the ``quantile`` (default the median) of the last ``window``
completions of the most specific pool that holds at least ``min_samples`` of
them: the ``(model, task)`` pair, else the model (any task), else every
completion; with fewer, ``prior_tokens`` (the cold start). A known cap
(``max_tokens``) bounds it: ``min(quantile, cap)``.

Cost: :meth:`observe` is O(log W) comparisons plus an O(W) pointer move
(``bisect.insort`` into a sorted window of W = ``window`` values) for each of
three pools; :meth:`estimate` is O(1) (at most three dict lookups). Memory is
bounded: at most ``max_keys`` ``(model, task)`` pools and ``max_keys`` model
pools, least recently observed evicted first, W values each, plus the pooled
window. Pure: no clock, no randomness, no I/O; same completions in the same
order give the same estimates.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict, deque
from typing import TypeVar

DEFAULT_PRIOR_TOKENS = 256
DEFAULT_QUANTILE = 0.5
DEFAULT_WINDOW = 512
DEFAULT_MIN_SAMPLES = 8
DEFAULT_MAX_KEYS = 1024

_K = TypeVar("_K")

LengthKey = tuple[str | None, str | None]
"""(model, task) as the request names them (None: not named)."""


class _Window:
    """The last ``size`` values, kept both in arrival order (to expire the oldest) and
    sorted (to read a quantile in O(1))."""

    __slots__ = ("_arrivals", "_sorted", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self._arrivals: deque[int] = deque()
        self._sorted: list[int] = []

    def add(self, value: int) -> None:
        arrivals, values = self._arrivals, self._sorted
        arrivals.append(value)
        bisect.insort(values, value)
        if len(arrivals) > self.size:
            del values[bisect.bisect_left(values, arrivals.popleft())]

    def __len__(self) -> int:
        return len(self._sorted)

    def quantile(self, q: float) -> int:
        """The nearest-rank ``q`` quantile (lower); the window must not be empty."""
        values = self._sorted
        return values[min(len(values) - 1, int(q * len(values)))]


class OutputLengthEstimator:
    """Expected output tokens per (model, task), from completed requests (module doc)."""

    __slots__ = ("_by_key", "_by_model", "_last_key", "_last_windows", "_pooled", "max_keys",
                 "min_samples", "prior_tokens", "quantile", "window")  # fmt: skip

    def __init__(
        self,
        *,
        quantile: float = DEFAULT_QUANTILE,
        window: int = DEFAULT_WINDOW,
        prior_tokens: int = DEFAULT_PRIOR_TOKENS,
        min_samples: int = DEFAULT_MIN_SAMPLES,
        max_keys: int = DEFAULT_MAX_KEYS,
    ) -> None:
        if not 0.0 <= quantile <= 1.0:  # NaN fails too
            raise ValueError(f"quantile must be in [0, 1], got {quantile!r}")
        for name, value in (("window", window), ("prior_tokens", prior_tokens),
                            ("min_samples", min_samples), ("max_keys", max_keys)):  # fmt: skip
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if min_samples > window:
            raise ValueError(f"min_samples ({min_samples}) must be <= window ({window})")
        self.quantile = quantile
        self.window = window
        self.prior_tokens = prior_tokens
        self.min_samples = min_samples
        self.max_keys = max_keys
        self._by_key: OrderedDict[LengthKey, _Window] = OrderedDict()
        self._by_model: OrderedDict[str | None, _Window] = OrderedDict()
        self._pooled = _Window(window)
        # the (model, task) observed last and its two windows, both most recent in their pools
        self._last_key: LengthKey | None = None
        self._last_windows: tuple[_Window, _Window] | None = None

    def observe(self, model: str | None, task: str | None, num_output_tokens: int) -> None:
        """One completed request of ``model`` and ``task`` produced ``num_output_tokens``.

        Raises ValueError for a count that is not an integer >= 0 (callers bound what an
        engine reports before it gets here)."""
        n = num_output_tokens
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"num_output_tokens must be an integer >= 0, got {n!r}")
        key = (model, task)
        if key == self._last_key and self._last_windows is not None:
            # the pair observed last is already the most recent in both pools: moving it
            # to the end again would change no order (most answers repeat the last pair)
            by_key, by_model = self._last_windows
        else:
            by_key = _pool(self._by_key, key, self.window, self.max_keys)
            by_model = _pool(self._by_model, model, self.window, self.max_keys)
            self._last_key = key
            self._last_windows = (by_key, by_model)
        by_key.add(n)
        by_model.add(n)
        self._pooled.add(n)

    def estimate(self, model: str | None, task: str | None, max_tokens: int | None = None) -> int:
        """Expected output tokens of a request of ``model`` and ``task`` (>= 1), at most
        ``max_tokens`` when the client gave one."""
        value = self._quantile(model, task)
        if max_tokens is not None:
            value = min(value, max_tokens)
        return max(1, value)

    def _quantile(self, model: str | None, task: str | None) -> int:
        # the most specific pool with min_samples: (model, task), model, all (once per
        # request in a simulation, so without a tuple of the three or _Window.__len__)
        min_samples = self.min_samples
        window = self._by_key.get((model, task))
        if window is None or len(window._sorted) < min_samples:
            window = self._by_model.get(model)
            if window is None or len(window._sorted) < min_samples:
                window = self._pooled
                if len(window._sorted) < min_samples:
                    return self.prior_tokens
        return window.quantile(self.quantile)

    @property
    def num_keys(self) -> int:
        """(model, task) pools held (at most ``max_keys``)."""
        return len(self._by_key)

    @property
    def num_observed(self) -> int:
        """Completions in the pooled window (at most ``window``)."""
        return len(self._pooled)


def _pool(pools: OrderedDict[_K, _Window], key: _K, size: int, max_keys: int) -> _Window:
    """``key``'s window, made most recent (created, evicting the least recent, if new)."""
    window = pools.get(key)
    if window is None:
        window = pools[key] = _Window(size)
        if len(pools) > max_keys:
            pools.popitem(last=False)
    else:
        pools.move_to_end(key)
    return window


__all__ = ["DEFAULT_PRIOR_TOKENS", "DEFAULT_QUANTILE", "OutputLengthEstimator"]
