"""What the Memory Footprint page computes, without streamlit or plotly: its screens in lecture mode
(`lecture_screens`), the study note's example (`seed_scenario`), a shape typed in (`custom_spec`) or an upload's
parameter count (`params_b_of`, `with_given_params`), the formula written out (`formula_latex`) and its four steps
(`footprint_steps`), the attention variants' bars (`attention_bars`, `Bars`), the cache against the weights
(`growth_curves`, `CacheCurve`, `crossing_kind`), the planner of the engine chosen (`device_total`,
`serving_flags`, `plan_for`, `flag_name`), the planner on real start-up logs (`residuals`, `Residual`, `log_cell`,
`log_name`), the request mix under the context (`capped_lengths`) and the live cache's verdict (`live_verdict`)."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kvviz.errors import InputError
from kvviz.i18n import t
from kvviz.kv.capacity import CapacityPlan, plan_capacity
from kvviz.kv.formula import (
    KVFootprint,
    KVSpec,
    attention_variants,
    cache_stops_growing,
    kv_footprint,
    tokens_to_reach,
)
from kvviz.kv.hardware import Hardware
from kvviz.kv.log_check import LogCheck
from kvviz.kv.presets import PRESETS
from kvviz.kv.sglang_pool import SglangPlan, plan_sglang
from kvviz.kv.vllm_profile import ServingFlags
from kvviz.kv.weights import WeightSizing, size_weights

GIB = 2**30
CROSSING_LIMIT = 1 << 24  # contexts searched for the cache reaching the weights (16,777,216 tokens)
# the planner's terms checked against the logs
LOG_TERMS = ("weights", "activation", "non_torch", "reserve", "kv_tokens")


# ---- lecture mode: one idea per screen ------------------------------------------------------------------------
def lecture_screens(lecture: bool) -> tuple[list[str], list[tuple[int, str]], list[int]]:
    """(the tabs' locale names, each screen as (its tab, its title's locale name), the capacity tab's two screens).
    The formula, then the tabs; in lecture mode the paged blocks are a tab of their own and the capacity planner
    takes two screens: the planner, then how it did on real start-up logs."""
    sections = ["idea_formula", "tab_compare", "tab_growth", "tab_capacity", *(["paged_title"] if lecture else []),
                "tab_live"]
    capacity = sections.index("tab_capacity")
    screens = [(i, s) for i, s in enumerate(sections)]
    screens.insert(capacity + 1, (capacity, "logs_title"))
    return sections, screens, [n for n, (section, _) in enumerate(screens) if section == capacity]


# ---- the model ------------------------------------------------------------------------------------------------
def seed_scenario(kv_heads: int) -> dict[str, object]:
    """The study note's example: Llama-2-7B's shape, bf16, 4096 tokens, 32 requests (the scenario's names)."""
    return {"src": "custom", "layers": 32, "heads": 32, "kv_heads": kv_heads, "d_head": 128, "tokens": 4096,
            "batch": 32, "kv_dtype": "bfloat16", "params_b": 6.74}


def custom_spec(layers: int, heads: int, kv_heads: int, d_head: int, params_b: float, name: str) -> KVSpec:
    """A shape typed in, with the parameter count (billions) the user gives."""
    return KVSpec(n_layers=layers, n_heads=heads, n_kv_heads=kv_heads, d_head=d_head, name=name,
                  d_model=heads * d_head, n_params=round(params_b * 1e9), params_source="given")


def params_b_of(spec: KVSpec) -> float | None:
    """The parameter box's value for a config read: its own count in billions, or empty when it cannot give one."""
    return None if spec.n_params is None else round(spec.n_params / 1e9, 3)


def with_given_params(spec: KVSpec, given_b: float | None) -> KVSpec:
    """An upload's count as the box says: unknown when emptied, the user's when it differs from the config's by
    half a million or more (the box shows three decimals), else the config's own."""
    if given_b is None:
        return spec.with_params(None, "unknown")
    if spec.n_params is None or abs(given_b * 1e9 - spec.n_params) >= 5e5:
        return spec.with_params(round(given_b * 1e9), "given")
    return spec


# ---- the formula ----------------------------------------------------------------------------------------------
def formula_latex(shape: KVSpec, fp: KVFootprint) -> str:
    """M_KV symbolically, with this scenario's numbers, and the total in bytes (LaTeX)."""
    batch, tokens = fp.batch, fp.n_tokens
    if shape.is_mla:
        symbolic = r"B \cdot L \cdot n \cdot (d_c + d_R) \cdot \text{bytes}"
        numbers = rf"{batch} \cdot {shape.n_layers} \cdot {tokens}"
        numbers += rf" \cdot ({shape.kv_lora_rank} + {shape.qk_rope_head_dim})"
    elif shape.n_sliding_layers:
        # full layers keep n tokens, windowed layers the W − 1 tokens the next query can still see
        full, kept = shape.n_layers - shape.n_sliding_layers, min(tokens, shape.window_kept)
        symbolic = r"2 \cdot B \cdot (L_{full} \cdot n + L_{W} \cdot \min(n, W - 1))"
        symbolic += r" \cdot H_{kv} \cdot d_{head} \cdot \text{bytes}"
        numbers = rf"2 \cdot {batch} \cdot ({full} \cdot {tokens} + {shape.n_sliding_layers} \cdot {kept})"
        numbers += rf" \cdot {shape.n_kv_heads} \cdot {shape.d_head}"
    else:
        symbolic = r"2 \cdot B \cdot L \cdot n \cdot H_{kv} \cdot d_{head} \cdot \text{bytes}"
        numbers = rf"2 \cdot {batch} \cdot {shape.n_layers} \cdot {tokens}"
        numbers += rf" \cdot {shape.n_kv_heads} \cdot {shape.d_head}"
    total = f"{fp.total:,}".replace(",", "{,}")
    return (rf"\begin{{aligned}} M_{{KV}} &= {symbolic} \\ &= {numbers} \cdot {fp.bytes_per_elem:g}\,\text{{B}}"
            + (r" + \text{scales}" if fp.scale_bytes_per_token_per_layer else "")
            + rf" \\ &= {total}\,\text{{B}} \end{{aligned}}")


def footprint_steps(shape: KVSpec, fp: KVFootprint, lang: str = "en") -> list[tuple[str, str, int]]:
    """The formula's four steps as (step, the factors it multiplies by, bytes): token·layer → token → request →
    all requests; a windowed model's request counts the token·layers its layers keep."""
    elem = f"{fp.bytes_per_elem:g}"
    factors = (f"({shape.kv_lora_rank} + {shape.qk_rope_head_dim}) · {elem} B" if shape.is_mla
               else f"2 · {shape.n_kv_heads} · {shape.d_head} · {elem} B")
    if fp.scale_bytes_per_token_per_layer:
        factors += f" + {fp.scale_bytes_per_token_per_layer} B ({t('memory.scales_unit', lang)})"
    tokens, batch = fp.n_tokens, fp.batch
    per_request = (f"· {tokens:,} {t('memory.tokens_unit', lang, n=tokens)}" if not shape.n_sliding_layers
                   else f"· Σ {fp.cached_token_layers:,} {t('memory.token_layers_unit', lang)}")
    return [("per_token_per_layer", factors, fp.per_token_per_layer),
            ("per_token", f"· {shape.n_layers} {t('memory.layers_unit', lang, n=shape.n_layers)}", fp.per_token),
            ("per_request", per_request, fp.per_request),
            ("total", f"· {batch} {t('memory.requests_unit', lang, n=batch)}", fp.total)]


# ---- MHA, GQA, MQA, MLA ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Bars:
    """The attention variants one KV dtype can store: a label, kind and bytes per token each; the kinds it
    refuses; and the MLA variant (its ranks are named under the chart)."""

    labels: list[str]
    kinds: list[str]
    per_token: list[int]
    refused: list[str]
    mla: KVSpec


def attention_bars(shape: KVSpec, kv_dtype_name: str) -> Bars:
    variants = attention_variants(shape)
    kinds, per_token, refused = [], [], []
    for kind, variant in variants.items():
        try:
            per_token.append(kv_footprint(variant, 1, 1, kv_dtype_name).per_token)
            kinds.append(kind)
        except InputError:  # e.g. an MLA latent that is not whole q8_0 blocks: that format cannot store it
            refused.append(kind)
    mla = variants["MLA"]
    labels = [f"{kind} (H_kv={variants[kind].n_kv_heads})" for kind in kinds if kind != "MLA"]  # MHA/GQA/MQA
    if "MLA" in kinds:
        labels.append(f"MLA ({mla.kv_lora_rank}+{mla.qk_rope_head_dim})")
    return Bars(labels, kinds, per_token, refused, mla)


# ---- the cache against the weights ----------------------------------------------------------------------------
@dataclass(frozen=True)
class CacheCurve:
    batch: int
    tokens: list[int]
    cache_bytes: list[int]
    crossing_tokens: int | None  # context where this batch's cache reaches the weights (None: never)


def growth_curves(shape: KVSpec, weights: int, batch: int, tokens: int, kv_dtype_name: str) -> list[CacheCurve]:
    """The cache of 1, 8, 32 and the scenario's requests over contexts from 256 tokens to past the last crossing
    of the weights (at least 128k, at most 4M), the scenario's own context among them."""
    batches = sorted({1, 8, 32, batch})
    crossings = {b: tokens_to_reach(shape, weights, b, kv_dtype_name, limit=CROSSING_LIMIT) for b in batches}
    top = max([17] + [min(22, math.ceil(math.log2(c)) + 1) for c in crossings.values() if c])
    grid = sorted({2**k for k in range(8, top + 1)} | {tokens})
    return [CacheCurve(b, grid, [kv_footprint(shape, n, b, kv_dtype_name).total for n in grid], crossings[b])
            for b in batches]


def crossing_kind(curve: CacheCurve, shape: KVSpec) -> str:
    """"at" a context; "never" (every layer slides: the cache stops growing); "beyond" the contexts searched."""
    if curve.crossing_tokens:
        return "at"
    return "never" if cache_stops_growing(shape) else "beyond"


# ---- the capacity planner -------------------------------------------------------------------------------------
def device_total(gpu: Hardware, total_gib: float) -> int:
    """The device's bytes: the table's exact figure while the box shows it (to 0.01 GiB), else what was typed."""
    shown = None if gpu.memory_bytes is None else round(gpu.memory_bytes / GIB, 2)
    return gpu.memory_bytes if total_gib == shown else round(total_gib * GIB)


def serving_flags(version: str, entry: str, eager: bool, max_num_batched_tokens: int, max_num_seqs: int
                  ) -> ServingFlags:
    """The launch as the boxes say it: "any" and 0 are not said (the version's default, or a range over them)."""
    return ServingFlags(vllm_version=None if version == "any" else version, entry=None if entry == "any" else entry,
                        enforce_eager=bool(eager), max_num_batched_tokens=int(max_num_batched_tokens) or None,
                        max_num_seqs=int(max_num_seqs) or None)


CHECKPOINT = "checkpoint"  # the weight-dtype box's first choice: the checkpoint's own format


def is_preset(spec: KVSpec) -> bool:
    return PRESETS.get(spec.name) == spec


def page_weights(spec: KVSpec, w_dtype_name: str, tp: int = 1) -> WeightSizing | None:
    """The weights the page shows: in the checkpoint's format (its config's quantization_config, a preset's own),
    or every parameter in the dtype picked; None when the parameter count is unknown. An unknown format raises
    (named, with the range the GPU surely holds)."""
    if spec.n_params is None:
        return None
    return size_weights(spec, tp=tp, weight_dtype=None if w_dtype_name == CHECKPOINT else w_dtype_name,
                        preset=is_preset(spec))


def plan_for(engine: str, spec: KVSpec, total_bytes: int, *, tokens: int, n_gpus: int, kv_dtype_name: str,
             weight_dtype: str, gpu: Hardware, gpu_name: str, fraction: float = 0.9,
             flags: ServingFlags | None = None, reserve_gib: float | None = None, sgl_frac: float = 0.0
             ) -> CapacityPlan | SglangPlan:
    """vLLM's plan (its fraction, flags and a reserve given in GiB, else predicted) or SGLang's (a fraction of 0
    is its default rule)."""
    weights = page_weights(spec, weight_dtype, n_gpus)
    if engine == "vllm":
        return plan_capacity(spec, total_bytes, max_model_len=tokens, gpu_memory_utilization=fraction, tp=n_gpus,
                             kv_dtype_name=kv_dtype_name, flags=flags, gpu_name=gpu_name, weights=weights,
                             reserve_bytes=None if reserve_gib is None else round(reserve_gib * GIB))
    if weights is not None and weights.per_gpu_bytes is None:
        plan_capacity(spec, total_bytes, max_model_len=tokens, weights=weights)  # raises: the format is unknown
    return plan_sglang(spec, total_bytes, context_len=tokens, tp=n_gpus, smi_mib=gpu.nvidia_smi_total_mib,
                       mem_fraction_static=sgl_frac or None, kv_dtype_name=kv_dtype_name,
                       weights_per_gpu=None if weights is None else weights.per_gpu_bytes)


def flag_name(field: str) -> str:
    """A ServingFlags field as vLLM's command line spells it: max_num_seqs → --max-num-seqs."""
    return "--" + field.replace("_", "-")


# ---- the planner against real start-up logs -------------------------------------------------------------------
@dataclass(frozen=True)
class Residual:
    log: str  # the log's label on hover
    term: str  # the x category (translated term name)
    difference: float  # (predicted − logged) / logged
    named: bool  # the log names its flags


def residuals(checks: Sequence[LogCheck], term_names: Mapping[str, str]) -> list[Residual]:
    """Each log's error in each term of `term_names` (term → its label), as its effect on the KV tokens."""
    return [Residual(f"{c.model} · {c.gpu}×{c.tp} · {c.engine} {c.version}", term_names[t.name], t.kv_effect,
                     c.flags_named)
            for c in checks for t in c.terms if t.name in term_names and t.kv_effect is not None]


def log_cell(check: LogCheck, name: str) -> str:
    """"logged → predicted (difference)" of one term; * marks a logged figure derived from others, ? one the log
    does not print, — a term the engine has not."""
    term = check.term(name)
    if term is None or term.logged is None:
        return f"? → {term.predicted:,.2f}" if term is not None else "—"
    fmt = "{:,.0f}" if term.unit == "tokens" else "{:,.2f}"
    mark = "*" if term.derived else ""
    diff = "" if term.difference is None else f" ({term.difference:+.1%})"  # 0 logged: the engine did not start
    return f"{fmt.format(term.logged)}{mark} → {fmt.format(term.predicted)}{diff}"


def log_name(check: LogCheck) -> str:
    """The model, linked to its log when the source is a web address (Markdown); † when its flags are not all
    named."""
    url = check.source_url.split(" ")[0]
    name = f"[{check.model}]({url})" if url.startswith("https://") else f"{check.model} ({check.source_url})"
    return name + ("" if check.flags_named else " †")


# ---- paged blocks and the live cache --------------------------------------------------------------------------
def capped_lengths(lengths: Sequence[int], tokens: int) -> tuple[list[int], int]:
    """The request mix under the context set above: (each length capped at it, how many were longer)."""
    return [min(n, tokens) for n in lengths], sum(n > tokens for n in lengths)


def live_verdict(live_bytes: int, formula_bytes: int, spec: KVSpec, stored_heads: int) -> str:
    """"equal" to the formula; "expanded": transformers' Falcon (new_decoder_architecture) caches K/V already
    repeated for every query head, stored_heads instead of H_kv; else "differ"."""
    if live_bytes == formula_bytes:
        return "equal"
    if not spec.is_mla and stored_heads != spec.n_kv_heads and live_bytes * spec.n_kv_heads == (
            formula_bytes * stored_heads):
        return "expanded"
    return "differ"

