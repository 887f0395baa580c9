"""What the Moving the Cache page computes from its runs, without streamlit or plotly (and without torch at import):
the chunk sizes a model's context allows (`chunk_sizes`), why a request's loaded prefix ends where it does
(`reason_text`), the tables of the requests (`request_rows`), of the tiers (`tier_rows`), of the break-even
(`break_even`, `break_even_rows`, `link_sources`) and of the handoff (`handoff_steps`, `handoff_rows`,
`calc_line`, `calc_rows`), each in the language asked for; and one handoff run on either engine (`run_handoff`)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from kvviz.i18n import t
from kvviz.kv.formula import KVSpec
from kvviz.kv.hardware import LINKS, Hardware
from kvviz.kv.transfer import HandoffBytes, LoadVsRecompute
from kvviz.units import format_binary

CHUNK_SIZES = (16, 32, 64, 128, 256)  # 256: LMCache's default
PHASES = ("prefill", "save", "transfer", "restore", "decode")  # the handoff's steps, in order


def chunk_sizes(max_context: int) -> list[int]:
    """The chunk sizes whose longest scripted prompt (2 chunks, a quarter chunk and 3 question tokens) and its
    first token fit the model's context; the smallest when none does (OffloadDemo then says why)."""
    return [s for s in CHUNK_SIZES if 2 * s + s // 4 + 4 < max_context] or [CHUNK_SIZES[0]]


def reason_text(miss: Mapping, lang: str) -> str:
    """Why the store's prefix ended where it did (a StoreMiss as its dict), in words."""
    tier = t(f"moving.tier_{miss['tier']}", lang) if miss.get("tier") else ""
    return t(f"moving.reason_{miss['reason']}", lang, token=miss["token"], changed_at=miss.get("changed_at"),
             tier=tier, request=miss.get("request") or "?")


def request_rows(results: Sequence[Mapping], lang: str) -> list[dict]:
    """One row per served request (OffloadDemo.results): where its tokens came from, why, and what it cost."""
    def col(name: str) -> str:
        return t(f"moving.col_{name}", lang)

    return [{
        col("request"): f"{r['request']}. {t('moving.kind_' + r['kind'], lang)}",
        col("prompt"): r["prompt_tokens"],
        col("memory"): r["tokens_by_tier"]["memory"],
        col("disk"): r["tokens_by_tier"]["disk"],
        col("computed"): r["tokens_by_tier"]["computed"],
        col("why"): reason_text(r["miss_reason"], lang),
        col("ttft"): f"{r['ttft_s'] * 1e3:.1f}",
        col("ttft_recompute"): f"{r['ttft_recompute_s'] * 1e3:.1f}",
        col("bytes"): sum(r["bytes_loaded"].values()),
        col("load"): f"{sum(r['load_s'].values()) * 1e3:.2f}",
        col("recompute"): "—" if r["recompute_s"] is None else f"{r['recompute_s'] * 1e3:.1f}",
        col("logits"): t("moving.equal" if r["logits_equal_up_to_rounding"] else "moving.not_equal", lang,
                         diff=f"{r['max_abs_logit_diff']:.1e}", tol=f"{r['logit_rounding_tolerance']:.1e}"),
    } for r in results]


def tier_rows(tiers: Sequence, lang: str) -> list[dict]:
    """One row per TierCost: the same tokens loaded from the tier and recomputed, medians (lowest–highest)."""
    def col(name: str) -> str:
        return t(f"moving.col_{name}", lang)

    return [{
        col("tier"): t(f"moving.tier_{c.tier}", lang), col("tokens"): c.tokens, col("bytes"): f"{c.bytes:,}",
        col("file_bytes"): f"{c.file_bytes:,}" if c.file_bytes else "—",
        col("load"): f"{c.load_s.median * 1e3:.2f} ({c.load_s.low * 1e3:.2f}–{c.load_s.high * 1e3:.2f})",
        col("recompute"): f"{c.recompute_s.median * 1e3:.1f} ({c.recompute_s.low * 1e3:.1f}–"
                          f"{c.recompute_s.high * 1e3:.1f})",
        col("ratio"): f"{c.load_over_recompute:.3f}",
    } for c in tiers]


def break_even(spec: KVSpec, hw: Hardware, links: Sequence[str], kv_dtype: str, tp: int,
               max_tokens: int) -> tuple[dict[str, list[dict]], dict[str, int | None]]:
    """Per link: loading vs recomputing from 1 to max_tokens, and the length from which loading wins (None:
    never within max_tokens). An unknown parameter count or a bad tp raises InputError."""
    cases = {name: LoadVsRecompute(spec, hw, LINKS[name], kv_dtype, tp=tp) for name in links}
    return ({name: case.curve(max_tokens) for name, case in cases.items()},
            {name: case.break_even_tokens(max_tokens) for name, case in cases.items()})


def break_even_rows(even: Mapping[str, int | None], max_tokens: int, lang: str) -> list[dict]:
    rows = []
    for name, n in even.items():
        verdict = (t("moving.never", lang, max=f"{max_tokens:,}") if n is None else t("moving.always", lang)
                   if n == 1 else f"{n:,}")
        rows.append({t("moving.col_link", lang): name,
                     t("moving.col_bandwidth", lang): f"{LINKS[name].bandwidth_bytes_per_s / 1e9:g} GB/s",
                     t("moving.col_break_even", lang): verdict})
    return rows


def link_sources(names: Sequence[str]) -> str:
    """Each link's bandwidth source, one Markdown item each."""
    return "\n".join(f"- **{name}**: {LINKS[name].bandwidth_source}" for name in names)


def handoff_steps(results: Mapping[str, Mapping], lang: str) -> list[dict]:
    """The handoff timeline's bars: per engine (named with the bytes it moved) its five steps, in seconds (a step
    an engine does not time is 0)."""
    steps = []
    for engine, r in results.items():
        name = f"{t(f'moving.engine_{engine}', lang)} · {format_binary(r['bytes'])}"
        first = r["first_decode_s"] if engine == "kvviz" else r["decode_prompt_s"]
        seconds = (r["prefill_s"], r["save_s"], r["transfer_s"], r["restore_s"], first)
        for phase, s in zip(PHASES, seconds, strict=True):
            steps.append({"engine": name, "phase": phase, "seconds": s or 0.0,
                          "text": format_binary(r["bytes"]) if phase == "transfer" else ""})
    return steps


def handoff_rows(results: Mapping[str, Mapping], lang: str) -> list[dict]:
    def col(name: str) -> str:
        return t(f"moving.col_{name}", lang)

    return [{
        col("engine"): t(f"moving.engine_{engine}", lang), col("prompt"): r["prompt_tokens"],
        col("moved"): r["bytes"], col("bytes"): r["kv_bytes"], col("formula"): r["formula_bytes"],
        col("header"): r["header_bytes"], col("save"): f"{r['save_s'] * 1e3:.2f}",
        col("transfer"): f"{r['transfer_s'] * 1e3:.2f}", col("restore"): f"{r['restore_s'] * 1e3:.2f}",
        col("tokens_equal"): t("moving.yes" if r["tokens_equal_single"] else "moving.no", lang),
    } for engine, r in results.items()]


def calc_line(model: str, calc: HandoffBytes, lang: str) -> str:
    """The calculator's sentence: one prompt's K/V per rank and in all, and whether each rank holds a copy."""
    line = t("moving.calc_line", lang, model=model, n=calc.n_tokens, tp=calc.tp, per_rank=format_binary(calc.per_rank),
             total=format_binary(calc.total), heads=calc.kv_heads_per_rank)
    return line + (" " + t("moving.replicated", lang) if calc.replicated else "")


def calc_rows(calc: HandoffBytes, lang: str) -> list[dict]:
    """Per link, the handoff's time in ms with each rank on its own link and with all ranks sharing one."""
    return [{
        t("moving.col_link", lang): name,
        t("moving.col_per_rank", lang): f"{calc.seconds(link) * 1e3:.3f}",
        t("moving.col_shared", lang): f"{calc.seconds(link, shared_link=True) * 1e3:.3f}",
    } for name, link in LINKS.items()]


def run_handoff(engine: str, backend, model: str, n_prompt: int, n_new: int,  # noqa: ANN001 - a NativeBackend
                workdir: Path) -> dict:
    """One prefill→decode handoff of an n_prompt-token prompt, on kvviz's two worker processes or on two
    llama-servers (the shipped model exported into `workdir` first, a fetched model's own GGUF otherwise)."""
    from kvviz.engine.paged.demo import shared_prefix_ids

    ids = shared_prefix_ids(backend.tokenizer, n_prompt)
    if engine == "kvviz":
        from kvviz.engine.offload.handoff import run_handoff as kvviz_handoff

        return kvviz_handoff(backend, model, ids, n_new)
    from kvviz.serving.handoff import handoff_gguf, llamacpp_handoff

    return llamacpp_handoff(handoff_gguf(model, backend, workdir), backend.spec, ids, n_new, workdir=workdir)
