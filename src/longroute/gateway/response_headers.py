"""The headers the gateway adds to a backend's answer: who served it, what was predicted.

Rendered once per backend (:func:`backend_headers`, kept by the proxy per
backend and reload); per request only the router's predictions are added, and
only when there are some (:func:`with_prediction`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from longroute.gateway.admission import Grant
from longroute.gateway.backends import Backend
from longroute.gateway.http.wire import RenderedHeaders
from longroute.gateway.observe import RequestTrace
from longroute.headers import (
    ENDPOINT_HEADER,
    MODEL_HEADER,
    PREDICTED_CACHED_HEADER,
    PREDICTED_TTFT_HEADER,
)


def backend_headers(backend: Backend) -> dict[str, str]:
    """The fixed headers of every answer from ``backend``: its name and served model."""
    return {ENDPOINT_HEADER: backend.name, MODEL_HEADER: backend.model}


def with_prediction(
    headers: RenderedHeaders, grant: Grant, trace: RequestTrace
) -> Mapping[str, str]:
    """A backend's fixed response headers, plus the router's predicted TTFT (integer ms)
    when it made one for the backend it was sent to, and the cached tokens engine truth
    predicted for it (precise backends only).

    ``headers`` itself (no copy) when it did not: a router that predicts nothing, or
    admission sent the request elsewhere than the router chose (that one was full), so
    the prediction is another backend's.
    """
    decision = grant.decision
    predicted_s = decision.predicted_ttft_s
    cached = trace.predicted_cached_tokens
    if predicted_s is None or decision.endpoint != grant.endpoint or not math.isfinite(predicted_s):
        if cached is None:
            return headers
        return {**headers, PREDICTED_CACHED_HEADER: str(cached)}
    extra = {PREDICTED_TTFT_HEADER: str(round(predicted_s * 1000.0))}
    if cached is not None:
        extra[PREDICTED_CACHED_HEADER] = str(cached)
    return {**headers, **extra}
