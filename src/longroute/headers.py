"""HTTP headers of longroute's protocol, shared by the gateway, the emulator and the load generator.

Requests may carry:

* ``x-longroute-session``: the session key (session-affinity and prefix routing);
* ``x-longroute-task``: the task type, a feature of accuracy-aware routing;
* ``x-longroute-tried: m1,m2``: models that already answered this request
  wrongly (LAAR's stateless retry penalty);
* ``x-longroute-attempt: k``: which attempt of a question this is;
* ``x-longroute-ttft-slo-ms: 500``: the request's TTFT objective, the deadline
  of the gateway's slack policies (its EDF queue, the priority sent to backends).

Agent workflows (Chimera, docs/gateway.md "Agent workflows"):

* ``x-longroute-program-id: run-42``: the workflow execution the request is a
  stage of; every stage with the same id goes to the model chosen for its first
  (1 to 128 printable ASCII characters);
* ``x-longroute-stage: 2``: the stage's 1-based number (an integer from 1 to 64);
* ``x-longroute-workflow: apps/planner-coder``: the workflow's kind, a feature of
  the remaining-length predictor (1 to 128 printable ASCII characters).

A malformed value of any of them is answered 400 naming the header.

Gateway responses name the backend and model chosen in
``x-longroute-endpoint`` and ``x-longroute-model``; with a router that predicts
it (``ttca``), ``x-longroute-predicted-ttft-ms`` carries the predicted time to
first token on that backend, network included, in integer milliseconds.
"""

from __future__ import annotations

SESSION_HEADER = "x-longroute-session"
TASK_HEADER = "x-longroute-task"
TRIED_HEADER = "x-longroute-tried"
ATTEMPT_HEADER = "x-longroute-attempt"
TTFT_SLO_HEADER = "x-longroute-ttft-slo-ms"
PROGRAM_ID_HEADER = "x-longroute-program-id"
STAGE_HEADER = "x-longroute-stage"
WORKFLOW_HEADER = "x-longroute-workflow"
ENDPOINT_HEADER = "x-longroute-endpoint"
MODEL_HEADER = "x-longroute-model"
PREDICTED_TTFT_HEADER = "x-longroute-predicted-ttft-ms"
# the prompt tokens the backend was predicted (before dispatch) to serve from its prefix cache,
# from its KV-cache events (precise_prefix); absent where the backend is not precise
PREDICTED_CACHED_HEADER = "x-longroute-predicted-cached-tokens"
