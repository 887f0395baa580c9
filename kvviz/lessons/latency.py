"""What the Latency & Capacity page says, computed without streamlit or torch (its first screen loads no model):
durations as people read them (`fmt_time`, `fmt_cost`, `fmt_interval`, `fmt_duration`, `fmt_count`), a finished
sweep's verdict and details (`describe`) and its results table in the reader's words (`table_rows`); the roofline
tab's models (`roofline_models`), the accelerator as typed (`edited_hardware`, `hardware_sources`), its bounds and
what fits (`RoofView`, `roof_view`) and the sentence and four cards that state them (`decode_text`, `Card`,
`bound_cards`). Every text is in the language given; kvviz.app.views.latency draws it."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kvviz.engine import sweep_stats as stats
from kvviz.errors import InputError
from kvviz.i18n import t
from kvviz.kv.capacity import CapacityPlan, plan_capacity
from kvviz.kv.formula import KVSpec
from kvviz.kv.hardware import Hardware
from kvviz.kv.presets import PRESETS
from kvviz.kv.roofline import PassBound, Roofline
from kvviz.units import format_binary, format_ms


# ---- numbers as people read them -------------------------------------------------------------------------
def fmt_time(seconds: float | None, se: float | None = None) -> str:
    """A duration in the unit that suits it (ms, µs, ns), with its standard error in the same unit."""
    if seconds is None:
        return "—"
    scale, unit = next(((s, u) for s, u in ((1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns")) if abs(seconds) >= s),
                       (1e-9, "ns"))
    digits = 2 if abs(seconds) / scale < 100 else 1
    value = f"{seconds / scale:.{digits}f}".replace("-", "−")
    return f"{value} {unit}" if se is None else f"{value} ± {se / scale:.{digits}f} {unit}"


def fmt_cost(lang: str, *terms: tuple[str, float | None, float | None]) -> str:
    """A fitted cost as its terms, each (locale term, seconds, standard error): "1.3 ms + 42 µs per token − 0.2 ns
    per pair" (a negative term is subtracted, never printed as "+ −")."""
    out = []
    for i, (term, value, se) in enumerate(terms):
        text = t(f"latency.term_{term}", lang, value=fmt_time(abs(value) if i and value is not None else value, se))
        out.append(text if i == 0 else ("− " if value is not None and value < 0 else "+ ") + text)
    return " ".join(out)


def fmt_interval(ci: Sequence[float] | None) -> str:
    return "—" if ci is None else f"{fmt_time(ci[0])} … {fmt_time(ci[1])}"


def fmt_duration(seconds: float | None, lang: str) -> str:
    """Milliseconds up to a second, then s, min, h, days: a bound of hours never prints as '26668357.15 ms'."""
    if seconds is None:
        return "—"
    for unit, size in (("days", 86_400), ("h", 3_600), ("min", 60), ("s", 1)):
        if seconds >= size:
            return (f"{seconds / size:,.2f} {unit}" if unit != "days"
                    else f"{seconds / size:,.1f} {t('latency.days', lang)}")
    return f"{seconds * 1e3:.2f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.2f} µs"


def fmt_count(value: float) -> str:
    """A count that may be fractional: grouped digits, and significant digits below 10 (never a bare '0')."""
    return f"{value:,.0f}" if value >= 10 else f"{value:.2g}"


# ---- a finished sweep in words -------------------------------------------------------------------------------
def describe(kind: str, rows: Sequence[dict], lang: str, *, lecture: bool = False) -> tuple[str, str]:
    """(verdict, details) of a sweep's rows: the verdict beside the chart, the fitted costs and totals under it."""
    return _DESCRIBE[kind](rows, lang, lecture)


def _describe_prompt(rows: Sequence[dict], lang: str, lecture: bool) -> tuple[str, str]:
    s = stats.summary("prompt-length", rows)
    verdict = t(f"latency.prompt_{s['ttft_verdict']}", lang, runs=s["n_runs"]) + " " + t(
        "latency.prompt_tpot", lang, verdict=t(f"latency.trend_{s['tpot_verdict']}", lang))
    details = t("latency.prompt_model", lang, runs=s["n_runs"],
                ttft=fmt_cost(lang, ("fixed", s["ttft_fixed_s"], s["ttft_fixed_s_se"]),
                              ("per_prompt_token", s["ttft_s_per_token"], s["ttft_s_per_token_se"]),
                              ("per_pair", s["ttft_s_per_token_pair"], s["ttft_s_per_token_pair_se"])),
                tpot=fmt_cost(lang, ("fixed", s["tpot_fixed_s"], s["tpot_fixed_s_se"]),
                              ("per_cached_token", s["tpot_s_per_token"], s["tpot_s_per_token_se"])))
    line = s["ttft_line_fixed_s"]
    if line is not None and line < 0:  # why an ordinary straight line would print a negative fixed cost
        details += "\n\n" + t("latency.prompt_line", lang, line_fixed=fmt_time(line))
    return verdict, details


def _describe_cache(rows: Sequence[dict], lang: str, lecture: bool) -> tuple[str, str]:
    s = stats.summary("cache", rows)
    c, u = s["cache"], s["no_cache"]
    trends = {m: t(f"latency.trend_{s[m]['verdict']}", lang) for m in ("cache", "no_cache")}
    verdict = t(f"latency.cache_{s['verdict']}", lang, cache=trends["cache"], no_cache=trends["no_cache"])
    falling = t("latency.cache_falling", lang) if "falling" in (c["verdict"], u["verdict"]) else ""
    if falling and not lecture:
        verdict += " " + falling
    first, last = s["contexts"]
    details = t("latency.cache_model", lang, runs=c["n_runs"], first=first, last=last,
                cache=fmt_cost(lang, ("fixed", c["step_fixed_s"], c["step_fixed_s_se"]),
                               ("per_cached_token", c["step_s_per_token"], c["step_s_per_token_se"])),
                no_cache=fmt_cost(lang, ("fixed", u["step_fixed_s"], u["step_fixed_s_se"]),
                                  ("per_token", u["step_s_per_token"], u["step_s_per_token_se"]),
                                  ("per_pair", u["step_s_per_token_pair"], u["step_s_per_token_pair_se"])),
                c_rise=fmt_time(c["rise_s"]), c_ci=fmt_interval(c["rise_ci95_s"]),
                u_rise=fmt_time(u["rise_s"]), u_ci=fmt_interval(u["rise_ci95_s"]))
    if falling and lecture:  # on a projector the verdict stays one line: the warning leads the folded details
        details = falling + "\n\n" + details
    if c["total_s"] and u["total_s"]:
        details += "\n\n" + t("latency.cache_total", lang, first=first, last=last, cache=f"{c['total_s']:.2f} s",
                              no_cache=f"{u['total_s']:.2f} s", ratio=f"{u['total_s'] / c['total_s']:.1f}")
    return verdict, details


def _describe_batch(rows: Sequence[dict], lang: str, lecture: bool) -> tuple[str, str]:
    first, last = rows[0], rows[-1]
    return t("latency.batch_result", lang, b0=first["batch"], b1=last["batch"],
             tpot_ratio=f"{last['tpot_s'] / first['tpot_s']:.2f}",
             tps_ratio=f"{last['tokens_per_s'] / first['tokens_per_s']:.2f}",
             kv_ratio=f"{last['kv_bytes'] / first['kv_bytes']:.0f}",
             kv=format_binary(last["kv_bytes"]), formula=format_binary(last["kv_formula_bytes"])), ""


def _describe_dtype(rows: Sequence[dict], lang: str, lecture: bool) -> tuple[str, str]:
    def listed(key: str) -> str:
        return "\n".join("- " + (t(key, lang, dtype=r["dtype"], ttft=format_ms(r["ttft_s"]),
                                   tpot=format_ms(r["tpot_s"]), weights=format_binary(r["weight_bytes"]),
                                   kv=format_binary(r["kv_bytes"]))
                                 if r["supported"] else t("latency.dtype_unsupported", lang, dtype=r["dtype"],
                                                          error=r["error"])) for r in rows)

    if lecture:  # the times beside the chart; the bytes folded under them
        return listed("latency.dtype_times"), listed("latency.dtype_row") + "\n\n" + t("latency.dtype_note", lang)
    return listed("latency.dtype_row"), t("latency.dtype_note", lang)


_DESCRIBE = {"prompt-length": _describe_prompt, "cache": _describe_cache, "batch": _describe_batch,
             "dtype": _describe_dtype}


def table_rows(kind: str, rows: Sequence[dict], lang: str) -> list[dict]:
    """The rows as the reader reads them: columns named in `lang`, times in ms, modes translated."""

    def header(column: str) -> str:
        for end, word in (("_min_s", "min"), ("_max_s", "max"), ("_min", "min"), ("_max", "max")):
            if column.endswith(end):
                base = column.removesuffix(end) + ("_s" if end.endswith("_s") else "")
                return t(f"latency.col_{word}", lang, name=t(f"latency.col_{base}", lang))
        return t(f"latency.col_{column}", lang)

    def cell(column: str, value: object) -> object:
        if column == "mode":
            return t(f"latency.cchart_{value}", lang)
        is_time = column.endswith("_s") or column.startswith("seconds")
        return round(value * 1e3, 3) if is_time and column != "tokens_per_s" and value is not None else value

    return [{header(c): cell(c, r.get(c)) for c in stats.COLUMNS[kind]} for r in rows]


# ---- the roofline tab --------------------------------------------------------------------------------------
def roofline_models(spec: KVSpec) -> dict[str, KVSpec]:
    """The Memory page's presets (experts excepted: a token reads only its experts) and the model in use."""
    return {**{n: s for n, s in PRESETS.items() if not s.is_moe}, spec.name: spec}


def preset_memory_gib(preset: Hardware) -> float | None:
    """The preset's memory as its box shows it (GiB, 2 decimals); None where unknown."""
    return None if preset.memory_bytes is None else round(preset.memory_bytes / 2**30, 2)


def edited_hardware(preset: Hardware, memory_gib: float | None, bandwidth_tb: float, peak_tf: float) -> Hardware:
    """The accelerator as typed over its preset: the preset's exact bytes while the box still shows its rounded GiB."""
    exact = preset.memory_bytes is not None and memory_gib == preset_memory_gib(preset)
    memory = preset.memory_bytes if exact else None if memory_gib is None else round(memory_gib * 2**30)
    return Hardware(preset.name, bandwidth_tb * 1e12, peak_tf * 1e12, memory)


def hardware_sources(preset: Hardware, lang: str) -> str:
    """Where the preset's three numbers come from, as a markdown list."""
    return "\n".join(f"- **{t(f'latency.source_{k}', lang)}:** {text}" for k, text in (
        ("memory", preset.memory_source or t("latency.unknown", lang)), ("bandwidth", preset.bandwidth_source),
        ("flops", preset.flops_source)))


@dataclass(frozen=True)
class RoofView:
    """One model on one accelerator at a context and batch: its bounds, where compute takes over, what fits."""

    roof: Roofline
    hw: Hardware
    n_context: int
    batch: int
    plan: CapacityPlan | None  # None: the memory is unknown, or the planner refused (plan_error says why)
    plan_error: InputError | None = None

    @property
    def decode(self) -> PassBound:
        return self.roof.decode_bound(batch=self.batch, n_context=self.n_context)

    @property
    def prefill(self) -> PassBound:
        return self.roof.prefill_bound(n_prompt=self.n_context)

    @property
    def compute_batch(self) -> float | None:
        """The batch where decode turns compute-bound at this context (None: never)."""
        return self.roof.compute_bound_batch(n_context=self.n_context)

    @property
    def crossing(self) -> int | None:
        """The context where this batch's KV cache weighs as much as the weights (None: never)."""
        return self.roof.kv_equals_weights_tokens(batch=self.batch)

    @property
    def kv_request_bytes(self) -> float:
        return self.roof.kv_bytes(self.n_context)

    @property
    def fits(self) -> int:
        return self.plan.max_requests if self.plan is not None else 0

    def curve_batches(self) -> list[int]:
        """Powers of two past every marker (compute batch, what fits, 1,024), and the batch chosen."""
        top = max(1024, 2 * self.fits, int(2 * (self.compute_batch or 0)))
        return sorted({int(round(b)) for b in [2**i for i in range(0, top.bit_length() + 1)] + [self.batch]})

    def kv_tokens(self) -> list[int]:
        """128 to 1,048,576 tokens in powers of two, and the context chosen."""
        return sorted({2**i for i in range(7, 21)} | {self.n_context})


def roof_view(model: KVSpec, hw: Hardware, weight_dtype: str, kv_dtype: str, n_context: int,
              batch: int) -> RoofView:
    """The bounds, with how many requests fit from the capacity planner (the same function and answer as the
    Memory page); an InputError where the roofline cannot size this KV dtype (blocks the heads do not fit)."""
    roof = Roofline(model, hw, weight_dtype, kv_dtype)
    plan, plan_error = None, None
    try:
        plan = None if hw.memory_bytes is None else plan_capacity(
            roof.spec, hw.memory_bytes, max_model_len=n_context, kv_dtype_name=kv_dtype, weight_dtype=weight_dtype,
            gpu_name=hw.name)
    except InputError as exc:  # a context past the model's, or a reserve kvviz cannot predict (MoE, MLA)
        plan_error = exc
    return RoofView(roof, hw, n_context, batch, plan, plan_error)


def decode_text(view: RoofView, lang: str) -> str:
    """The decode bound in words: the bytes one step reads over the bandwidth, against the compute."""
    decode = view.decode
    return t("latency.roof_decode", lang, weights=format_binary(view.roof.weight_bytes), batch=view.batch,
             kv=format_binary(view.kv_request_bytes), bw=f"{view.hw.bandwidth_bytes_per_s / 1e12:.3f}",
             tpot=fmt_duration(decode.memory_s, lang), compute=fmt_duration(decode.compute_s, lang),
             bound=fmt_duration(decode.seconds, lang), limit=t(f"latency.limit_{decode.limited_by}", lang))


@dataclass
class Card:
    """One card: its label and value, an alert under it (("error" | "warning", text)), and notes, each (text,
    short): a short note stays under the card on a projector, a long one is folded."""

    label: str
    value: str
    alert: tuple[str, str] | None = None
    notes: list[tuple[str, bool]] = field(default_factory=list)


def bound_cards(view: RoofView, lang: str) -> list[Card]:
    """Four cards: the TPOT and prefill bounds, the batch where compute takes over, the requests that fit."""
    b_star, hw, plan = view.compute_batch, view.hw, view.plan
    label = {k: t(f"latency.{k}", lang) for k in ("m_tpot", "m_prefill", "m_compute_batch", "m_fits")}
    tpot = Card(label["m_tpot"], fmt_duration(view.decode.seconds, lang),
                notes=[(t(f"latency.limit_{view.decode.limited_by}", lang), True)])
    prefill = Card(label["m_prefill"], fmt_duration(view.prefill.seconds, lang),
                   notes=[(t("latency.prefill_of", lang, n=f"{view.n_context:,}",
                             limit=t(f"latency.limit_{view.prefill.limited_by}", lang)), True)])
    # Below one request the batch is not a count: the ridge is so low that decode is compute-bound from B = 1.
    compute = Card(label["m_compute_batch"], "∞" if b_star is None else "1" if b_star <= 1 else fmt_count(b_star))
    ridge = t("latency.ridge", lang, ridge=fmt_count(hw.ridge_flops_per_byte))
    if b_star is None:
        compute.notes.append((t("latency.never_compute", lang), False))
    elif b_star <= 1:
        compute.notes.append((t("latency.compute_from_one", lang, batch=f"{b_star:.2g}") + " " + ridge, False))
    else:
        compute.notes.append((ridge, True))
    weights_only = view.roof.compute_bound_batch(n_context=0)  # the textbook figure: no cache reads
    if weights_only is not None:
        compute.notes.append((t("latency.weights_only_batch", lang, batch=fmt_count(weights_only)), False))
    if plan is None:
        fits = Card(label["m_fits"], t("latency.unknown", lang), notes=[(
            t("latency.memory_unknown", lang) if view.plan_error is None else view.plan_error.message(lang), True)])
    else:
        fits = Card(label["m_fits"], f"{plan.max_requests:,}")
        if not plan.weights_fit:
            fits.alert = ("error", t("latency.weights_no_fit", lang, weights=format_binary(view.roof.weight_bytes)))
        elif plan.max_requests == 0:
            fits.alert = ("warning", t("latency.request_does_not_fit", lang, kv=format_binary(view.kv_request_bytes),
                                       free=format_binary(plan.kv_budget_bytes)))
        else:
            fits.notes.append((t("latency.fits_how", lang, util=plan.gpu_memory_utilization,
                                 reserve=format_binary(plan.reserve_bytes)), False))
    crossing = view.crossing
    fits.notes.append((t("latency.crossing", lang, tokens=fmt_count(crossing), batch=view.batch) if crossing is not None
                       else t("latency.crossing_never", lang, batch=view.batch), False))
    return [tpot, prefill, compute, fits]
