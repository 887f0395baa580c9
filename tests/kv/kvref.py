"""The study note's formula written out by hand, as an independent reference the product's one formula
(kvviz.kv.formula.kv_footprint) is checked against: M_KV = 2 · B · L · n · H_kv · d_head · bytes."""


from fractions import Fraction


def textbook_bytes(batch: int, n_layers: int, n_tokens: int, n_kv_heads: int, d_head: int, elem_bytes: float) -> int:
    return int(2 * batch * n_layers * n_tokens * n_kv_heads * d_head * Fraction(elem_bytes))  # exact at any size


KV_FIELDS = ("n_layers", "n_heads", "n_kv_heads", "d_head", "kv_lora_rank", "qk_rope_head_dim", "sliding_window",
             "n_sliding_layers")


def kv_part(spec) -> tuple:
    """What a token leaves in the cache, without the facts around it (name, parameters, context)."""
    return tuple(getattr(spec, f) for f in KV_FIELDS)
