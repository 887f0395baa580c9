"""What the Latency & Capacity page says, without Streamlit: durations, a sweep's verdict and table, the roofline's
numbers and cards."""
import pytest

from kvviz.engine import sweep_stats as stats
from kvviz.engine.config import DecoderConfig
from kvviz.engine.shape import native_spec, random_name
from kvviz.errors import InputError
from kvviz.i18n import t
from kvviz.kv.hardware import HARDWARE
from kvviz.kv.presets import PRESETS
from kvviz.lessons import latency as lessons
from kvviz.units import format_ms

H100 = HARDWARE["H100 SXM"]
LLAMA = PRESETS["Llama-3.1-8B"]


def test_fmt_time_picks_the_unit_and_keeps_the_error_in_it():
    assert lessons.fmt_time(0.0123) == "12.30 ms"
    assert lessons.fmt_time(4.2e-5) == "42.00 µs"
    assert lessons.fmt_time(-2e-4) == "−200.0 µs"  # 100 or more: one decimal; a true minus sign
    assert lessons.fmt_time(1.5e-10) == "0.15 ns"  # below a nanosecond it stays in ns
    assert lessons.fmt_time(0.0123, 0.0004) == "12.30 ± 0.40 ms"
    assert lessons.fmt_time(None) == "—"


def test_fmt_cost_subtracts_a_negative_term():
    text = lessons.fmt_cost("en", ("fixed", 1e-3, 1e-5), ("per_token", 4.2e-5, None), ("per_pair", -2e-10, 1e-11))
    assert text == "1.00 ± 0.01 ms + 42.00 µs per token − 0.20 ± 0.01 ns per pair of tokens"
    assert "+ −" not in text and "+ -" not in text
    assert lessons.fmt_cost("en", ("fixed", None, None), ("per_token", None, None)) == "— + — per token"


def test_durations_and_counts_read_as_people_read_them():
    assert lessons.fmt_duration(26_668.357_15, "en") == "7.41 h"  # never '26668357.15 ms'
    assert lessons.fmt_duration(10 * 86_400, "en") == "10.0 days"
    assert lessons.fmt_duration(10 * 86_400, "ko") == f"10.0 {t('latency.days', 'ko')}"
    assert lessons.fmt_duration(90, "en") == "1.50 min"
    assert lessons.fmt_duration(0.00495, "en") == "4.95 ms"
    assert lessons.fmt_duration(2.5e-5, "en") == "25.00 µs"
    assert lessons.fmt_count(1234.4) == "1,234" and lessons.fmt_count(0.5) == "0.5"
    assert lessons.fmt_count(0.04) == "0.04"
    assert lessons.fmt_interval([1e-3, 2e-3]) == "1.00 ms … 2.00 ms" and lessons.fmt_interval(None) == "—"
    assert format_ms(0.0125) == "12.50 ms" and format_ms(None) == "—" and format_ms(0.0125, 1) == "12.5 ms"


def _prompt_rows(fixed: float, per_token: float, per_pair: float) -> list[dict]:
    """Rows of a prompt-length sweep whose every run costs exactly fixed + per token + per pair (3 runs each)."""
    rows = []
    for n in (16, 32, 64, 128, 256):
        ttft = fixed + per_token * n + per_pair * n * n
        runs = [{"ttft_s": ttft, "tpot_s": 1.5e-3 + 2e-6 * n} for _ in range(3)]
        rows.append({"prompt_tokens": n, "ttft_s": ttft, "tpot_s": 1.5e-3 + 2e-6 * n, "runs": runs})
    return rows


def test_the_prompt_sweep_states_its_fitted_cost():
    verdict, details = lessons.describe("prompt-length", _prompt_rows(1e-3, 1e-5, 1e-8), "en")
    assert verdict.startswith("**TTFT rises with the prompt:**") and "TPOT: " in verdict
    # exact data: the cost model gives back its terms, with no error
    assert "**TTFT ≈ 1.00 ± 0.00 ms + 10.00 ± 0.00 µs per prompt token + 10.00 ± 0.00 ns per pair of tokens**" \
        in details
    assert "**TPOT ≈ 1.50 ± 0.00 ms + 2.00 ± 0.00 µs per cached token**" in details
    assert details.startswith("Fitted to all 15 runs")
    # a straight line through the same curve would put the fixed cost below zero: the details say why
    convex = _prompt_rows(1e-4, 1e-6, 1e-7)
    assert stats.summary("prompt-length", convex)["ttft_line_fixed_s"] == pytest.approx(-0.000892)
    assert lessons.describe("prompt-length", convex, "en")[1].endswith(
        "\n\n" + t("latency.prompt_line", "en", line_fixed="−892.0 µs"))
    assert t("latency.prompt_line", "en").split("{")[0] not in details  # above zero: nothing to explain


def test_the_batch_sweep_states_its_ratios():
    rows = [{"batch": 1, "tpot_s": 0.010, "tokens_per_s": 100.0, "kv_bytes": 1024, "kv_formula_bytes": 1024},
            {"batch": 4, "tpot_s": 0.012, "tokens_per_s": 4 / 0.012, "kv_bytes": 4096, "kv_formula_bytes": 4096}]
    verdict, details = lessons.describe("batch", rows, "en")
    assert verdict == ("From B = 1 to B = 4: TPOT ×1.20, tokens/s ×3.33, KV cache ×4 (4.00 KiB measured from the "
                       "tensors; formula 4.00 KiB).") and details == ""


def test_the_dtype_sweep_folds_the_bytes_on_a_projector():
    rows = [{"dtype": "float32", "supported": True, "ttft_s": 0.02, "tpot_s": 0.005, "weight_bytes": 4 * 2**20,
             "kv_bytes": 2048, "error": ""},
            {"dtype": "float16", "supported": False, "ttft_s": None, "tpot_s": None, "weight_bytes": None,
             "kv_bytes": None, "error": "no kernel"}]
    verdict, details = lessons.describe("dtype", rows, "en")
    assert verdict == ("- **float32**: TTFT 20.00 ms, TPOT 5.00 ms; weights 4.00 MiB, KV cache 2.00 KiB\n"
                       "- **float16**: not supported here (no kernel)")
    assert details == t("latency.dtype_note", "en")
    verdict, details = lessons.describe("dtype", rows, "en", lecture=True)
    assert verdict.splitlines()[0] == "- **float32**: TTFT 20.00 ms, TPOT 5.00 ms"
    assert details.startswith("- **float32**: TTFT 20.00 ms, TPOT 5.00 ms; weights")


def test_the_table_names_columns_in_the_readers_language_and_times_in_ms():
    rows = [{"mode": "cache", "context_tokens": 8, "input_tokens": 1, "repeats": 2, "seconds": 0.0012345,
             "seconds_min": 0.001, "seconds_max": 0.0015, "runs": [{}, {}]}]
    (en,) = lessons.table_rows("cache", rows, "en")
    assert en == {"mode": t("latency.cchart_cache", "en"), "context (tokens)": 8, "tokens fed": 1, "runs": 2,
                  "step (ms)": 1.234, "step (ms), fastest": 1.0, "step (ms), slowest": 1.5}
    (ko,) = lessons.table_rows("cache", rows, "ko")
    assert list(ko) == ["방식", "컨텍스트 (토큰)", "입력한 토큰", "실행 횟수", "스텝 (ms)", "스텝 (ms), 가장 빠름",
                        "스텝 (ms), 가장 느림"]
    (batch,) = lessons.table_rows("batch", [{"batch": 2, "tpot_s": 0.01, "tokens_per_s": 200.0}], "en")
    assert batch["tokens/s"] == 200.0 and batch["TPOT (ms)"] == 10.0  # a rate is not a time


def test_the_roofline_bound_of_llama_3_8b_on_an_h100():
    view = lessons.roof_view(LLAMA, H100, "bfloat16", "bfloat16", 4096, 1)
    # (16.06 GB of weights + 0.54 GB of KV) / 3.35 TB/s
    assert view.decode.memory_s == pytest.approx((2 * 8_030_261_248 + 536_870_912) / 3.35e12)
    assert "= **4.95 ms**" in lessons.decode_text(view, "en")
    cards = lessons.bound_cards(view, "en")
    assert [c.label for c in cards] == [t(f"latency.{k}", "en") for k in ("m_tpot", "m_prefill", "m_compute_batch",
                                                                          "m_fits")]
    assert cards[0].value == "4.95 ms" and cards[0].notes == [(t("latency.limit_memory", "en"), True)]
    assert cards[3].value == f"{view.plan.max_requests:,}" and view.plan.max_requests > 0 and cards[3].alert is None
    assert view.fits == view.plan.max_requests
    batches = view.curve_batches()
    assert batches[0] == 1 and batches[-1] >= max(1024, 2 * view.fits) and batches == sorted(set(batches))
    assert all(b & (b - 1) == 0 for b in batches)  # powers of two (the batch chosen, 1, is one)
    assert 4096 in view.kv_tokens() and view.kv_tokens()[0] == 128 and view.kv_tokens()[-1] == 2**20
    assert lessons.roof_view(LLAMA, H100, "bfloat16", "bfloat16", 4096, 3).curve_batches().count(3) == 1


def test_cards_at_the_inputs_limits_read_truthfully():
    slow = lessons.edited_hardware(H100, lessons.preset_memory_gib(H100), 3.35, 0.01)  # 0.01 TFLOP/s
    cards = lessons.bound_cards(lessons.roof_view(LLAMA, slow, "bfloat16", "bfloat16", 4096, 1), "en")
    assert cards[2].value == "1"
    assert any(text.startswith("compute-bound from the first request") and not short for text, short in cards[2].notes)
    huge = lessons.roof_view(LLAMA, H100, "bfloat16", "bfloat16", 10_000_000, 1)
    assert huge.plan is None and "131072" in huge.plan_error.message("en")
    cards = lessons.bound_cards(huge, "en")
    assert cards[3].value == "unknown" and "131072" in cards[3].notes[0][0] and cards[3].notes[0][1]
    assert cards[1].value.endswith((" h", " min", " days"))  # a prefill of 10M tokens: hours, never ms
    tiny = lessons.edited_hardware(H100, 0.1, 3.35, 989.0)
    cards = lessons.bound_cards(lessons.roof_view(LLAMA, tiny, "bfloat16", "bfloat16", 4096, 1), "en")
    assert cards[3].value == "0" and cards[3].alert[0] == "error" and "do not fit in this memory" in cards[3].alert[1]


def test_hardware_as_typed_keeps_the_presets_exact_bytes():
    same = lessons.edited_hardware(H100, lessons.preset_memory_gib(H100), 3.35, 989.0)
    assert same.memory_bytes == H100.memory_bytes and same.name == "H100 SXM"
    assert same.bandwidth_bytes_per_s == pytest.approx(3.35e12) and same.peak_flops == pytest.approx(989e12)
    assert lessons.edited_hardware(H100, 40.0, 3.35, 989.0).memory_bytes == 40 * 2**30
    assert lessons.edited_hardware(H100, None, 3.35, 989.0).memory_bytes is None
    sources = lessons.hardware_sources(H100, "en")
    assert sources.splitlines()[0].startswith("- **memory:** ") and len(sources.splitlines()) == 3


def test_the_roofline_offers_dense_presets_and_the_model_in_use():
    models = lessons.roofline_models(LLAMA)
    assert "Llama-3.1-8B" in models and not any(s.is_moe for s in models.values())
    assert set(models) == {n for n, s in PRESETS.items() if not s.is_moe} | {LLAMA.name}


def test_a_block_format_the_heads_do_not_fit_is_refused():
    """llama.cpp's q8_0 packs 32 values per block: a d_head of 16 is not whole blocks, so nothing is sized."""
    cfg = DecoderConfig(n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_ff=128, max_seq_len=128)
    spec = native_spec(cfg, random_name(cfg))
    assert spec.d_head == 16
    with pytest.raises(InputError, match="whole blocks|blocks"):
        lessons.roof_view(spec, H100, "bfloat16", "q8_0", 4096, 1)
    assert lessons.roof_view(spec, H100, "bfloat16", "bfloat16", 64, 1).decode.seconds > 0
