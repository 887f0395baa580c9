"""Moving the KV cache off the device: offload tiers, reuse across requests, prefill→decode handoff.

serde.py: one chunk of K/V as bytes (safetensors with a checksum): the disk tier's files and a handoff's message.
tiers.py: the bounded CPU-memory tier (LRU) and the bounded disk tier (one file per chunk, survives a restart).
store.py: chunks keyed by chained hashes (as LMCache), the longest stored prefix loaded, every miss explained.
serve.py: a request served through the store and measured, the per-tier costs, the offload demonstration.
handoff.py: a prefill worker and a decode worker, the KV sent between them over a loopback socket.
"""
