"""The telemetry stream: engine and router events -> windowed rates for the planner.

Pure modules (numpy and protobuf only): `config`, `wire`, `decoding`, `validation`, `dedup`,
`keyspace`, `arrivals`, `ring`, `windows`, `processor`, `snapshots`, `assembly`,
`metrics`, `partitioning`, `usage`, `columns`, `settings`, `errors`.
The shells: `app` (the Faust worker; faust and aiokafka) and `emitter`
(confluent-kafka). See docs/streams.md. Nothing is imported here, so importing a
pure module never pulls in a server client.
"""
