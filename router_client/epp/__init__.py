"""CacheRoute as a Gateway API Inference Extension endpoint picker (`cacheroute epp`).

Any GIE-conformant gateway (Envoy Gateway, kgateway, Istio, GKE) asks the picker, over
Envoy's External Processing gRPC protocol, which pod of an InferencePool serves each
request; the picker answers from the planner's plan, the same decision the CacheRoute
gateway makes.

Modules: `protocol` (the wire vocabulary: GIE's headers and metadata over ext_proc
messages; pure), `picker` (the routing decision as endpoints, fallbacks, subset,
in-flight caps), `exchange` (one request's ext_proc stream, message by message),
`metrics` (Prometheus), `server` (the gRPC edge: ext_proc, health, reflection).
Envoy's messages come from the `xds-protos` package (the `epp` extra).
"""
