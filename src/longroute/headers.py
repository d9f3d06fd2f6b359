"""HTTP headers of longroute's protocol, shared by the gateway, the emulator and the load generator.

Requests may carry:

* ``x-longroute-session``: the session key (session-affinity and prefix routing);
* ``x-longroute-task``: the task type, a feature of accuracy-aware routing;
* ``x-longroute-tried: m1,m2``: models that already answered this request
  wrongly (LAAR's stateless retry penalty);
* ``x-longroute-attempt: k``: which attempt of a question this is;
* ``x-longroute-ttft-slo-ms: 500``: the request's TTFT objective, the deadline
  of the gateway's slack policies (its EDF queue, the priority sent to backends).

Gateway responses name the backend and model chosen in
``x-longroute-endpoint`` and ``x-longroute-model``.
"""

from __future__ import annotations

SESSION_HEADER = "x-longroute-session"
TASK_HEADER = "x-longroute-task"
TRIED_HEADER = "x-longroute-tried"
ATTEMPT_HEADER = "x-longroute-attempt"
TTFT_SLO_HEADER = "x-longroute-ttft-slo-ms"
ENDPOINT_HEADER = "x-longroute-endpoint"
MODEL_HEADER = "x-longroute-model"
