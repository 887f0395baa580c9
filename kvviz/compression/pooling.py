"""MHA → GQA/MQA without retraining: each group's K and V projection heads replaced by their mean
(Ainslie et al. 2023, "GQA", §2.1: "mean-pooling all the original heads" of a group, which beat keeping
the first head or a random init before uptraining). Query heads are untouched; group i of the query heads
reads the pooled KV head i, as GQA does.
"""
from __future__ import annotations

import copy
import dataclasses

import torch

from kvviz.engine.model import Decoder
from kvviz.errors import InputError


def pool_kv_heads(model: Decoder, n_kv_heads: int) -> Decoder:
    """A copy of `model` whose n_kv_heads K/V heads are the means of consecutive groups of its current ones."""
    cfg = model.cfg
    if n_kv_heads < 1 or cfg.n_kv_heads % n_kv_heads:
        raise InputError("compression.bad_pool", n_kv_heads=n_kv_heads, current=cfg.n_kv_heads)
    factor = cfg.n_kv_heads // n_kv_heads
    pooled = copy.deepcopy(model)
    pooled.cfg = dataclasses.replace(cfg, n_kv_heads=n_kv_heads)
    d = cfg.d_head
    with torch.no_grad():
        for layer in pooled.model.layers:
            attn = layer.self_attn
            for name in ("k_proj", "v_proj"):
                old: torch.nn.Linear = getattr(attn, name)
                w = old.weight.view(n_kv_heads, factor, d, cfg.d_model)
                # factor 1 keeps the very same numbers (a mean of one row is that row): bit-identical logits
                new_w = w[:, 0] if factor == 1 else w.float().mean(1).to(w.dtype)
                new = torch.nn.Linear(cfg.d_model, n_kv_heads * d, bias=old.bias is not None, dtype=w.dtype,
                                      device=w.device)
                new.weight.copy_(new_w.reshape(n_kv_heads * d, cfg.d_model))
                if old.bias is not None:  # Qwen2's K/V biases pool with their rows
                    b = old.bias.view(n_kv_heads, factor, d)
                    new.bias.copy_((b[:, 0] if factor == 1 else b.float().mean(1).to(b.dtype)).reshape(-1))
                setattr(attn, name, new)
            attn.n_kv_heads = n_kv_heads
    return pooled.eval().fuse()
