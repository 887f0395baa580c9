"""A small transcription of vLLM's KV-cache sizing, as written in its released wheels, to hold kvviz's planner to.

Transcribed from vllm 0.20.0 (vllm/v1/kv_cache_interface.py, vllm/v1/core/kv_cache_utils.py), with the two
counting rules around it: 0.9.1 – 0.20.0 log "GPU KV cache size" as num_blocks // groups · block_size
(_report_kv_cache_config), 0.21.0 as int(max_concurrency · max_model_len); 0.8.5 / 0.9.0
(_get_kv_cache_config_uniform_type, unify_hybrid_kv_cache_specs) turn sliding layers into full attention when
both kinds are present and log num_blocks · block_size, concurrency = tokens / max_model_len. Names follow vLLM's.
No kvviz import: the planner is checked against this, not against itself.
"""

from collections import defaultdict
from dataclasses import dataclass


def cdiv(a: int, b: int) -> int:
    return -(a // -b)


@dataclass(frozen=True)
class FullAttentionSpec:
    block_size: int
    page_size_bytes: int

    def max_memory_usage_bytes(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        return cdiv(max_model_len, self.block_size) * self.page_size_bytes


@dataclass(frozen=True)
class SlidingWindowSpec:
    block_size: int
    page_size_bytes: int
    sliding_window: int

    def max_memory_usage_bytes(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        # max_admission_blocks_per_request: the last W − 1 tokens plus the newly scheduled ones, at most
        # max_model_len; +1 because the window may not start at a block boundary
        num_tokens = min(self.sliding_window - 1 + max_num_batched_tokens, max_model_len)
        return (cdiv(num_tokens, self.block_size) + 1) * self.page_size_bytes


def get_kv_cache_groups(kv_cache_spec: dict, *, pad_to_larger: bool = True) -> tuple[list[list], int]:
    """get_kv_cache_groups → _get_kv_cache_groups_uniform_spec or _get_kv_cache_groups_uniform_page_size; returns
    the groups (lists of layer names, None for a padding slot) and the padding layers added."""
    if len(set(kv_cache_spec.values())) == 1:
        return [list(kv_cache_spec)], 0
    same_type_layers = defaultdict(list)
    for layer_name, layer_spec in kv_cache_spec.items():
        same_type_layers[layer_spec].append(layer_name)
    min_num_layers = min(len(layers) for layers in same_type_layers.values())
    group_size = min_num_layers
    max_num_layers = max(len(layers) for layers in same_type_layers.values())
    if pad_to_larger and max_num_layers < min_num_layers * 1.5:  # 0.18.0+
        group_size = max_num_layers
    grouped_layers, padding = [], 0
    for layers in same_type_layers.values():
        num_padding_layers = group_size - len(layers) % group_size
        if num_padding_layers != group_size:  # "Add %d padding layers"
            padding += num_padding_layers
        num_groups = cdiv(len(layers), group_size)
        for i in range(num_groups):
            grouped_layers.append(layers[i::num_groups])
    return grouped_layers, padding


def get_kv_cache_config(kv_cache_spec: dict, groups: list[list], available_memory: int) -> int:
    """get_kv_cache_config_from_groups, general case: group_size tensors, num_blocks from get_num_blocks."""
    group_size = max(len(g) for g in groups)
    page_size = next(iter(kv_cache_spec.values())).page_size_bytes
    return max(int(available_memory // page_size // group_size), 0)


def get_max_concurrency_for_kv_cache_config(kv_cache_spec: dict, groups: list[list], num_blocks: int,
                                            max_model_len: int, max_num_batched_tokens: int) -> float:
    num_layer_per_group = max(len(g) for g in groups)
    specs = [kv_cache_spec[g[0]] for g in groups]
    max_memory_usage_per_request = num_layer_per_group * sum(
        s.max_memory_usage_bytes(max_model_len, max_num_batched_tokens) for s in specs)
    memory_per_block = specs[0].page_size_bytes * num_layer_per_group
    num_block_per_request = cdiv(max_memory_usage_per_request, memory_per_block)
    return num_blocks / num_block_per_request


def vllm_start_up(layer_kinds: list[str], *, sliding_window: int, page_size_bytes: int, available_memory: int,
                  max_model_len: int, max_num_batched_tokens: int, block_size: int,
                  version: tuple[int, ...]) -> dict:
    """What one release logs at start-up for layers of these kinds ("full" / "sliding")."""
    full = FullAttentionSpec(block_size, page_size_bytes)
    sliding = SlidingWindowSpec(block_size, page_size_bytes, sliding_window)
    spec = {f"layers.{i}": sliding if kind == "sliding" else full for i, kind in enumerate(layer_kinds)}
    if version < (0, 9, 1):  # _get_kv_cache_config_uniform_type after unify_hybrid_kv_cache_specs
        if len(set(spec.values())) > 1:
            spec = dict.fromkeys(spec, full)
        num_blocks = max(int(available_memory // page_size_bytes // len(spec)), 0)
        tokens = num_blocks * block_size
        return {"num_blocks": num_blocks, "tokens": tokens, "concurrency": tokens / max_model_len,
                "groups": 1, "padding": 0}
    groups, padding = get_kv_cache_groups(spec, pad_to_larger=version >= (0, 18, 0))
    num_blocks = get_kv_cache_config(spec, groups, available_memory)
    concurrency = get_max_concurrency_for_kv_cache_config(spec, groups, num_blocks, max_model_len,
                                                          max_num_batched_tokens)
    if version >= (0, 21, 0):
        tokens = int(concurrency * max_model_len)
    else:
        tokens = num_blocks // len(groups) * block_size
    return {"num_blocks": num_blocks, "tokens": tokens, "concurrency": concurrency, "groups": len(groups),
            "padding": padding}
