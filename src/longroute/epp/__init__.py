"""longroute as an Envoy endpoint picker (EPP): the Gateway API Inference Extension protocol.

``longroute epp --config fleet.yaml`` serves Envoy's external processing API
(``envoy.service.ext_proc.v3.ExternalProcessor/Process``) over gRPC with the
gateway's config, router, fleet view, health checks, RTT probes, metrics
scraping and prefix index. Envoy stays the data plane: it sends each request's
headers and body, the picker answers with the chosen backend in the
``x-gateway-destination-endpoint`` header and in the ``envoy.lb`` dynamic
metadata, and Envoy's ``ORIGINAL_DST`` cluster connects there.

Modules: :mod:`.messages` (building and reading the protocol's messages),
:mod:`.exchange` (one HTTP request's message sequence: a state machine without
I/O), :mod:`.picker` (the routing state behind every exchange), :mod:`.server`
(the gRPC and metrics servers), :mod:`.envoy` (the Envoy binary, its config and
process), :mod:`.cli` (``longroute epp``) and :mod:`.demo` (``longroute epp --demo``).
"""
