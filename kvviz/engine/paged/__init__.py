"""A paged KV cache with prefix sharing, as vLLM's PagedAttention and automatic prefix caching.

blocks.py: the pool's bookkeeping (no torch): blocks, reference counts, chained hashes, the LRU free list.
kv.py: the K/V tensors of the pool and the slot arithmetic a batched forward needs.
scheduler.py: requests, the scheduler (admit, decode together, preempt by recompute) and its snapshots.
demo.py: the prefix-sharing demonstration behind `python -m kvviz prefix-demo` and the Paged Blocks page.
"""
