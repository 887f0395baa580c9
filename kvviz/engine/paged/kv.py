"""The pool's K/V tensors and the index arithmetic of one batched forward over many requests.

Layout per layer: [n_blocks · block_size, n_kv_heads, d_head] (vLLM's [num_blocks, block_size, heads, d] flattened),
so token position p of a request lives in slot block_table[p // B] · B + p % B.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


class PagedKV:
    def __init__(self, n_layers: int, n_blocks: int, block_size: int, n_kv_heads: int, d_head: int, *,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> None:
        shape = (n_blocks * block_size, n_kv_heads, d_head)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.block_size = block_size

    def allocated_bytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in zip(self.k, self.v, strict=True))

    def bytes_per_block(self) -> int:
        return self.allocated_bytes() // (self.k[0].shape[0] // self.block_size)


@dataclass
class AttentionGroup:
    """Requests whose attention runs as one padded batch: [R, max_q] queries against [R, max_ctx] keys."""

    query_index: torch.Tensor  # [R, max_q] index into [T] of each query (0 in padding)
    key_slots: torch.Tensor  # [R, max_ctx] slot of each key position (0 in padding)
    mask: torch.Tensor  # [R, 1, max_q, max_ctx] True where a query may see a key
    out_index: torch.Tensor  # [Σ q_len] index into [T] of each real query, in flattened [R·max_q] order
    unpad_index: torch.Tensor  # [Σ q_len] index into the flattened [R·max_q]


@dataclass
class PagedBatch:
    """One forward over several requests, each bringing q_len new tokens on top of its cached ones.

    New tokens are concatenated ([T] = Σ q_len) for every projection and MLP. Attention runs in groups: the
    decoding requests (one query each) together, padded to the longest context; each prefilling request on
    its own, so a long prompt does not pad the decode queries to its length.
    """

    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T] absolute position of each new token in its request
    slots: torch.Tensor  # [T] slot its K/V is written to
    groups: list[AttentionGroup]
    last_index: torch.Tensor  # [R] index into [T] of each request's last new token
    query_lens: list[int]


def slot_of(block_table: Sequence[int], position: int, block_size: int) -> int:
    return block_table[position // block_size] * block_size + position % block_size


def _group(members: Sequence[int], q_lens: Sequence[int], n_cached: Sequence[int], starts: Sequence[int],
           block_tables: Sequence[Sequence[int]], block_size: int, device: torch.device | str) -> AttentionGroup:
    q = torch.tensor([q_lens[i] for i in members])
    c = torch.tensor([n_cached[i] for i in members])
    ctx = q + c
    max_q, max_ctx = int(q.max()), int(ctx.max())
    j = torch.arange(max_q)
    kpos = torch.arange(max_ctx)
    real_q = j[None, :] < q[:, None]  # [R, max_q]
    query_index = torch.where(real_q, torch.tensor([starts[i] for i in members])[:, None] + j[None, :], 0)
    n_tables = max(len(block_tables[i]) for i in members)
    tables = torch.tensor([list(block_tables[i]) + [0] * (n_tables - len(block_tables[i])) for i in members])
    key_slots = tables.gather(1, (kpos // block_size).clamp(max=n_tables - 1).expand(len(members), -1))
    key_slots = torch.where(kpos[None, :] < ctx[:, None], key_slots * block_size + kpos % block_size, 0)
    # Causal: the query at position c+j sees keys 0..c+j. A padding query sees key 0 only, so its discarded
    # softmax stays finite.
    mask = (kpos[None, None, :] <= (c[:, None] + j[None, :])[:, :, None]) & real_q[:, :, None]
    mask[:, :, 0] |= ~real_q
    flat = real_q.reshape(-1).nonzero().squeeze(1)
    return AttentionGroup(query_index.to(device), key_slots.to(device), mask[:, None].to(device),
                          query_index.reshape(-1)[flat].to(device), flat.to(device))


def build_batch(new_tokens: Sequence[Sequence[int]], n_cached: Sequence[int], block_tables: Sequence[Sequence[int]],
                block_size: int, device: torch.device | str = "cpu") -> PagedBatch:
    """new_tokens[r] follow n_cached[r] tokens already in request r's blocks; its table covers them all."""
    q_lens = [len(t) for t in new_tokens]
    starts = [sum(q_lens[:i]) for i in range(len(q_lens))]
    ids = [t for toks in new_tokens for t in toks]
    positions = [p for c, q in zip(n_cached, q_lens, strict=True) for p in range(c, c + q)]
    slots = [slot_of(table, p, block_size) for table, c, q in zip(block_tables, n_cached, q_lens, strict=True)
             for p in range(c, c + q)]
    decoding = [i for i, q in enumerate(q_lens) if q == 1]
    members = ([decoding] if decoding else []) + [[i] for i, q in enumerate(q_lens) if q > 1]
    groups = [_group(m, q_lens, n_cached, starts, block_tables, block_size, device) for m in members]
    last = [s + q - 1 for s, q in zip(starts, q_lens, strict=True)]
    as_long = lambda xs: torch.tensor(xs, dtype=torch.long, device=device)  # noqa: E731
    return PagedBatch(as_long(ids), as_long(positions), as_long(slots), groups, as_long(last), q_lens)
