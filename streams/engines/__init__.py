"""Adapters for what engines publish themselves (the engines issue, #18): one module per
engine kind and signal, pure decoders apart from the shells that own sockets.

    vllm_kv      vLLM's KV-cache events (msgpack KVEventBatch: BlockStored / BlockRemoved /
                 AllBlocksCleared), both wire layouts vLLM has shipped (pure)
    kv_state     a destination's cache as those events describe it: resident blocks,
                 stored / removed rates, how long a block stays resident (pure)
    kv_bridge    the ZMQ subscriber: sequence gaps detected and replayed from the
                 publisher's replay socket, garbage counted and skipped (shell)
    (the /metrics parser is cacheroute.engine_metrics, shared with the gateway)
"""
