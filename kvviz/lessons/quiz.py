"""The Check page's questions as data: predict-then-reveal, numeric answers computed by the memory calculator.

Texts live in the `check` locale section: `check.<id>_q`, `check.<id>_opt_<option>`, `check.<id>_explain`.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from kvviz.kv.formats import kv_dtype
from kvviz.kv.formula import KVFootprint, KVSpec, kv_footprint, weight_bytes
from kvviz.units import format_binary, format_decimal

GIB = 1024**3
MAX_ESTIMATE_GIB = 1_000_000.0  # an estimate box's range: 0 … a million GiB (the answer is 64)
NUMBER_TOLERANCE = 0.01  # a numeric answer within 1 % counts (rounding of a hand calculation)


class Kind(StrEnum):
    CHOICE = "choice"  # pick one of several explanations
    TRUTH = "truth"  # a misconception: is the statement true or false?
    NUMBER = "number"  # a number in GiB, checked against the calculator


class Verdict(StrEnum):
    CORRECT = "correct"
    DECIMAL_UNITS = "decimal_units"  # the right size in GB (10⁹ B) where GiB (2³⁰ B) was asked
    WRONG = "wrong"


@dataclass(frozen=True)
class Question:
    id: str
    kind: Kind
    page: str  # the app page that demonstrates the answer (a path in kvviz.app.navigation.PAGES)
    options: tuple[str, ...] = ()
    answer: str = ""  # the correct option (CHOICE / TRUTH)


# The study note's example: 32 layers, 32 KV heads, d_head 128, bf16, 4096 tokens, 32 requests.
CACHE_SIZE_EXAMPLE = dict(batch=32, n_tokens=4096, kv_dtype="bfloat16")
CACHE_SIZE_SPEC = KVSpec(n_layers=32, n_heads=32, n_kv_heads=32, d_head=128)
WEIGHTS_7B_BF16 = weight_bytes(7 * 10**9, "bfloat16")  # a 7B-parameter model's weights, for scale


def cache_size_memory() -> KVFootprint:
    """The cache-size question's answer, computed by the same formula the calculator uses."""
    e = CACHE_SIZE_EXAMPLE
    return kv_footprint(CACHE_SIZE_SPEC, e["n_tokens"], e["batch"], e["kv_dtype"])


TRUTH = ("true", "false")
REUSE, PREFILL_DECODE = "pages/1_Reusing_Past_KV.py", "pages/2_Prefill_and_Decode.py"
MEMORY, LATENCY = "pages/3_Memory_Footprint.py", "pages/4_Latency_and_Capacity.py"
TRAINING = "pages/5_Training_Prefill_Decode.py"
# The correct option sits at a different place in each question.
QUESTIONS: tuple[Question, ...] = (
    Question("why_kv", Kind.CHOICE, TRAINING, ("bigger", "once", "changes", "position"), "once"),
    Question("cache_size", Kind.NUMBER, MEMORY),
    Question("long_prompt", Kind.CHOICE, LATENCY, ("recompute", "tokenize", "read", "evict"), "read"),
    Question("reuse_condition", Kind.CHOICE, TRAINING, ("greedy", "small", "fp32", "causal"), "causal"),
    Question("cache_update", Kind.CHOICE, REUSE, ("append", "rebuild", "logits", "last_layer"), "append"),
    Question("m_training", Kind.TRUTH, TRAINING, TRUTH, "false"),
    Question("m_optional", Kind.TRUTH, REUSE, TRUTH, "false"),
    Question("m_latency", Kind.TRUTH, PREFILL_DECODE, TRUTH, "false"),
    Question("m_no_attention", Kind.TRUTH, REUSE, TRUTH, "false"),
    Question("m_no_memory", Kind.TRUTH, MEMORY, TRUTH, "false"),
)


def question(question_id: str) -> Question:
    return next(q for q in QUESTIONS if q.id == question_id)


def check_choice(q: Question, option: str) -> bool:
    return option == q.answer


def check_number(value_gib: float) -> Verdict:
    """Judge an estimate of the cache-size question, in GiB."""
    total = cache_size_memory().total
    if abs(value_gib * GIB - total) <= NUMBER_TOLERANCE * total:
        return Verdict.CORRECT
    if abs(value_gib * 1e9 - total) <= NUMBER_TOLERANCE * total:
        return Verdict.DECIMAL_UNITS
    return Verdict.WRONG


def explain_values() -> dict[str, str]:
    """Numbers the explanations quote, all from the calculator (never typed into a locale file)."""
    m = cache_size_memory()
    return {
        # the question's own factors, so the text and the answer cannot drift apart
        "layers": f"{m.n_layers}",
        "kv_heads": f"{m.n_kv_heads}",
        "d_head": f"{m.d_head}",
        "dtype": m.kv_dtype,
        "elem_bytes": f"{kv_dtype(m.kv_dtype).data_bytes:g}",
        "tokens": f"{m.n_tokens}",
        "batch": f"{m.batch}",
        "per_token_per_layer": format_binary(m.per_token_per_layer),
        "per_token": format_binary(m.per_token),
        "per_request": format_binary(m.per_request),
        "total": format_binary(m.total),
        "total_gb": format_decimal(m.total),  # the calculator's own formatter: 68.72 GB
        "weights_7b": format_binary(WEIGHTS_7B_BF16),
    }
