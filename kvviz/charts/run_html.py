"""A run as one self-contained HTML file: a run record (kvviz.lessons.run_record) in, a document out that replays it
step by step with a slider, Play and the arrow keys, offline (Plotly's JavaScript inlined, no server, no network).

Every picture is drawn by the function the page draws it with (kvviz.charts.decode, speculative, paged, and the
lessons' strips): per step the HTML pieces and figures are made here, in Python, and the player only swaps them. The
run record itself is embedded whole as JSON (`<script type="application/json" id="kvviz-run">`), so a reader (or a
test) gets the run's own numbers back out of the file; the drawn pieces go in a second block (`id="kvviz-view"`).
"""
from __future__ import annotations

import html
import json
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

import plotly.graph_objects as go

from kvviz.charts import decode as decode_charts
from kvviz.charts import paged as paged_charts
from kvviz.charts import speculative as spec_charts
from kvviz.engine.tokenizer import chip_labels
from kvviz.errors import InputError
from kvviz.i18n import t
from kvviz.lessons import decode_view, spec_view
from kvviz.lessons.run_record import FORMAT

# What one file holds at most: past these a browser takes seconds per step and the file tens of MB.
MAX_STEPS = 1024
MAX_ATTENTION_VALUES = 3_000_000  # attention weights (steps × layers × heads × positions), ~8 bytes each in JSON


def size_of(record: dict) -> tuple[int, int]:
    """(steps, attention values) of a run record."""
    values = sum(len(layer) * len(layer[0]) for step in record.get("attention") or () if step
                 for layer in step if layer)
    return len(record["steps"]), values


def decode_size(n_layers: int, n_heads: int, n_prompt: int, n_new: int, *, attention: bool = True
                ) -> tuple[int, int]:
    """(steps, attention values) a decode run of n_new tokens will record: pass s's query attends n_prompt + s
    positions in every layer and head. Known before the run, so a refusal comes before anything is computed."""
    keys = n_new * n_prompt + n_new * (n_new - 1) // 2
    return n_new, n_layers * n_heads * keys if attention else 0


def check_size(n_steps: int, attention_values: int = 0) -> None:
    """Refuse a run too large for one file (InputError, said in the page's language), before anything is built."""
    if n_steps > MAX_STEPS or attention_values > MAX_ATTENTION_VALUES:
        raise InputError("run_html.too_large", steps=n_steps, values=f"{attention_values:,}", max_steps=MAX_STEPS,
                         max_values=f"{MAX_ATTENTION_VALUES:,}")


def run_html(record: dict, lang: str = "en") -> str:
    """The whole document for a run record, its words in `lang`."""
    if record.get("kvviz_run") != FORMAT or not record.get("steps"):
        raise InputError("run_html.nothing_ran")
    check_size(*size_of(record))
    view = _VIEWS[record["kind"]](record, lang)
    return _document(record, view, lang)


# ---- per kind: the frames (one per step) and the whole-run figures ------------------------------------------------
def _ns(step: dict) -> SimpleNamespace:
    return SimpleNamespace(**step)


def _fig(fig: go.Figure) -> dict:
    return json.loads(fig.to_json())


def _decode_view(record: dict, lang: str) -> dict:
    tr = lambda key, **kw: t(key, lang, **kw)  # noqa: E731 - the page's tr(), in the file's language
    steps, texts, n_prompt = record["steps"], record["texts"], record["prompt_tokens"]
    events = [_ns(s) for s in steps]
    model = record["model"]
    frames, attn_titles = [], []
    for i, e in enumerate(events):
        shown = texts[: n_prompt + i + 1]  # the prompt and the tokens emitted so far
        labels = decode_view.position_labels(chip_labels(shown))
        top = [_ns(x) for x in e.top_k]
        caption = tr("reuse.top_caption", token=decode_view.visible(shown[-1]))
        pieces = {"strip": decode_view.token_strip_html(shown, n_prompt, top, caption)}
        if record["use_cache"]:
            pieces["grid"] = decode_charts.cache_grid_html(
                decode_view.written_at(events[: i + 1]), labels, title=tr("reuse.growth_chart", n=e.cache_lengths[0]),
                x_title=tr("reuse.position"), hover=tr("reuse.growth_hover"),
                legend=(tr("reuse.legend_prefill"), tr("reuse.legend_steps"), tr("reuse.legend_newest")))
            line = tr("reuse.bytes_line", live=f"{e.live_bytes:,}", formula=f"{e.formula_bytes:,}",
                      allocated=f"{e.allocated_bytes:,}")
            pieces["bytes_text"] = _p(line) + _p(_formula_line(e.formula, model, lang))
        pieces["timing"] = _p(tr("run_html.timing", ms=f"{e.seconds * 1e3:.2f}", n_in=e.n_input_tokens,
                                 phase=tr(f"run_html.phase_{e.phase}"),
                                 ttft=f"{record['ttft_s'] * 1e3:.2f}", mean=_mean_ms(record["step_seconds"][1: i + 1])))
        frames.append({"html": pieces})
        attn_titles.append(tr("reuse.attn_chart", layer="{layer}", token=decode_view.visible(shown[e.position])))
    whole = {"bytes": _fig(decode_charts.cache_bytes_figure(
        [e.index for e in events], [e.live_bytes for e in events], [e.allocated_bytes for e in events],
        [e.formula_bytes for e in events], title=tr("reuse.bytes_chart"), x_title=tr("reuse.pass"),
        y_title=tr("reuse.bytes"), names=(tr("reuse.live"), tr("reuse.allocated"), tr("reuse.formula"))))}
    attention = None
    if record.get("attention"):
        import numpy as np

        last = record["attention"][-1]
        labels = decode_view.position_labels(chip_labels(texts))
        template = decode_charts.attention_figure(
            np.asarray(last[0]), labels, decode_view.head_labels(model["n_heads"], model["n_kv_heads"]),
            decode_view.kv_head_of(model["n_heads"], model["n_kv_heads"]), title="", x_title=tr("reuse.position"))
        attention = {"template": _fig(template), "titles": attn_titles, "labels": labels,
                     "n_layers": model["n_layers"], "max_ticks": decode_charts.MAX_TICKS,
                     "help": tr("reuse.attn_help", kind=model["attention_kind"],
                                group=model["n_heads"] // model["n_kv_heads"])}
    sections = [("strip", tr("run_html.sec_tokens")), ("grid", tr("reuse.tab_growth")),
                ("bytes_text", tr("reuse.tab_bytes")), ("bytes", ""), ("attention", tr("reuse.tab_attention")),
                ("timing", tr("run_html.sec_timing"))]
    return {"frames": frames, "whole": whole, "step_x": [e.index for e in events], "attention": attention,
            "sections": sections, "step_names": [_step_name(e.phase, e.index, lang) for e in events],
            "title": tr("reuse.title")}


def _spec_view(record: dict, lang: str) -> dict:
    tr = lambda key, **kw: t(key, lang, **kw)  # noqa: E731
    steps, texts, n_prompt = record["steps"], record["texts"], record["prompt_tokens"]
    events = [_ns(s) for s in steps]
    names = {int(k): v for k, v in record["draft_texts"].items()}
    shared = record["shared_layers"]
    frames, n_out = [], 0
    for i, e in enumerate(events):
        n_out += len(e.emitted)
        shown = texts[: n_prompt + n_out]
        legend = tr(f"spec.{spec_view.strip_legend(e)}", drafted=len(e.drafted), accepted=e.accepted,
                    k1=len(e.drafted) + 1, rolled=e.rolled_back)
        grid = spec_view.cache_grid(events[: i + 1], shared)
        labels = decode_view.position_labels(chip_labels(shown[:-1] + [names[d] for d in grid.rejected_ids]))
        kinds = spec_view.grid_legend(shared)
        verdict = tr("spec.bytes_equal" if e.live_bytes == e.formula_bytes else "spec.bytes_differ")
        frames.append({"html": {
            "strip": spec_view.step_strip_html(shown, n_prompt, e, names, legend),
            "grid": decode_charts.cache_grid_html(
                grid.written, labels, title=tr("spec.grid_title", n=e.cache_lengths[0], rolled=e.rolled_back),
                x_title=tr("spec.position"), hover=tr("spec.grid_hover"),
                legend=[tr(f"spec.legend_{k}", last=shared - 1) for k in kinds], legend_kinds=kinds, kinds=grid.kinds),
            "bytes_text": _p(tr("spec.bytes_line", peak=f"{e.peak_live_bytes:,}", live=f"{e.live_bytes:,}",
                                formula=f"{e.formula_bytes:,}", allocated=f"{e.allocated_bytes:,}", verdict=verdict))
            + _p(_formula_line(e.formula, record["model"], lang)),
            "timing": _p(tr("run_html.spec_timing", ms=f"{e.seconds * 1e3:.2f}", draft=f"{e.draft_seconds * 1e3:.2f}",
                            verify=f"{e.verify_seconds * 1e3:.2f}", phase=tr(f"run_html.phase_{e.phase}"),
                            emitted=len(e.emitted))),
        }})
    whole = {"bytes": _fig(spec_charts.bytes_figure(
        [e.index for e in events], [e.peak_live_bytes for e in events], [e.live_bytes for e in events],
        [e.formula_bytes for e in events], [e.draft_live_bytes for e in events],
        {k: tr(f"spec.c_{k}") for k in spec_charts.BYTES_LABELS} | {"title": tr("spec.c_bytes_title")}))}
    sections = [("strip", tr("run_html.sec_tokens")), ("grid", tr("run_html.sec_cache")),
                ("bytes_text", tr("spec.c_bytes_title")), ("bytes", ""), ("timing", tr("run_html.sec_timing"))]
    return {"frames": frames, "whole": whole, "step_x": [e.index for e in events], "attention": None,
            "no_attention": tr("run_html.no_attention_spec"), "sections": sections,
            "step_names": [_step_name(e.phase, e.index, lang) for e in events], "title": tr("spec.title")}


def _paged_view(record: dict, lang: str) -> dict:
    tr = lambda key, **kw: t(key, lang, **kw)  # noqa: E731
    labels = {k: tr(f"paged.c_{k}") for k in paged_charts.FIGURE_LABELS}
    size = record["block_size"]
    frames = []
    for s in record["steps"]:
        blocks, requests, rep, pool = ([_ns(b) for b in s["blocks"]], [_ns(r) for r in s["requests"]],
                                       s["report"], s["pool"])
        ids = lambda xs: ", ".join(f"R{i}" for i in xs) or "—"  # noqa: E731
        frames.append({"html": {"timing": _p(tr(
            "run_html.paged_step", step=rep["step"], ran=ids(rep["scheduled"]), n_tokens=rep["n_tokens"],
            ms=f"{rep['seconds'] * 1e3:.2f}", admitted=ids(rep["admitted"]), preempted=ids(rep["preempted"]),
            finished=ids(rep["finished"]), used=pool["used"], cached=pool["cached_free"], free=pool["free"]))},
            "figs": {"tables": _fig(paged_charts.block_tables(requests, blocks, size, labels)),
                     "pool": _fig(paged_charts.pool_grid(blocks, size, labels))}})
    usage = {k: tr(f"paged.c_{k}") for k in paged_charts.USAGE_LABELS}
    history = [_ns(s["pool"]) for s in record["steps"]]
    whole = {"usage": _fig(paged_charts.pool_usage(history, usage))}
    sections = [("timing", tr("run_html.sec_step")), ("tables", ""), ("pool", ""), ("usage", "")]
    return {"frames": frames, "whole": whole, "step_x": [s["report"]["step"] for s in record["steps"]],
            "attention": None, "no_attention": tr("run_html.no_attention_paged"), "sections": sections,
            "step_names": [tr("run_html.step_paged", step=s["report"]["step"]) for s in record["steps"]],
            "title": tr("paged.title")}


_VIEWS: dict[str, Callable[[dict, str], dict]] = {"decode": _decode_view, "speculative": _spec_view,
                                                   "paged": _paged_view}


# ---- the words around the pictures ----------------------------------------------------------------------------
def _p(text: str) -> str:
    return f"<p>{html.escape(text)}</p>"


def _mean_ms(seconds: Sequence[float]) -> str:
    return f"{sum(seconds) / len(seconds) * 1e3:.2f}" if seconds else "—"


def _step_name(phase: str, index: int, lang: str) -> str:
    return t("run_html.step_prefill", lang) if phase == "prefill" else t("run_html.step_n", lang, n=index)


def _formula_line(f: dict | None, model: dict, lang: str) -> str:
    """M = B · Σ_layers n_ℓ · (2 · H_kv · d_head · bytes) with this step's numbers; the last term as the KV description
    gives it where it is not 2·H_kv·d_head (MLA, quantized scales)."""
    if not f:
        return ""
    plain = f["values_per_token_per_layer"] == 2 * model["n_kv_heads"] * model["d_head"]
    elem = f"{f['bytes_per_elem']:g}"
    per = (f"2 · {model['n_kv_heads']} · {model['d_head']} · {elem} B = {f['per_token_per_layer']:,} B" if plain
           else f"{f['per_token_per_layer']:,} B")
    return t("run_html.formula", lang, batch=f["batch"], token_layers=f"{f['token_layers']:,}", per=per,
             total=f"{f['total']:,}", n=f["n_tokens"], layers=model["n_layers"])


def _facts(record: dict, lang: str) -> str:
    """The model and the settings the run used, as a two-column table."""
    rows = []
    model = record["model"]
    for key in ("name", "engine", "n_layers", "n_heads", "n_kv_heads", "d_head", "attention_kind", "dtype",
                "device"):
        if model.get(key) is not None:
            rows.append((t(f"run_html.m_{key}", lang), model[key]))
    for key, value in record.get("settings", {}).items():
        name = t(f"run_html.s_{key}", lang)
        rows.append((key if name == f"run_html.s_{key}" else name, value))
    if record.get("prompt_tokens") is not None:
        rows.append((t("run_html.m_prompt_tokens", lang), record["prompt_tokens"]))
    if record.get("text") is not None:
        rows.append((t("run_html.m_text", lang), record["text"]))
    cells = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows)
    return f'<table class="kv-facts">{cells}</table>'


_CSS = """
body{font-family:"Noto Sans CJK KR","Noto Sans KR",system-ui,sans-serif;margin:0 auto;max-width:1200px;padding:16px;
color:#31333f}
h1{font-size:24px;margin:0 0 4px}h2{font-size:17px;margin:18px 0 6px}
.kv-sub{color:#555;margin-bottom:8px}
.kv-facts{border-collapse:collapse;font-size:13px;margin:6px 0 10px}
.kv-facts th{text-align:left;font-weight:600;padding:2px 14px 2px 0;vertical-align:top;white-space:nowrap}
.kv-facts td{padding:2px 0;white-space:pre-wrap;word-break:break-word}
.kv-player{position:sticky;top:0;background:#fff;z-index:10;padding:8px 0;border-bottom:1px solid #e6e6e6;
display:flex;align-items:center;gap:10px;flex-wrap:wrap}
.kv-player button{font-size:15px;padding:4px 12px;border:1px solid #c8ccd4;border-radius:6px;background:#f7f8fa;
cursor:pointer}
.kv-player input[type=range]{flex:1;min-width:200px}
#kv-step-name{font-weight:700;min-width:9em}
.kv-keys{color:#777;font-size:12px}
details summary{cursor:pointer;color:#555}
"""

_JS = """
(function(){
const run = JSON.parse(document.getElementById('kvviz-run').textContent);
const view = JSON.parse(document.getElementById('kvviz-view').textContent);
const n = view.frames.length, cfg = {displaylogo: false, responsive: true};
const slider = document.getElementById('kv-slider'), playBtn = document.getElementById('kv-play');
const layerSel = document.getElementById('kv-layer');
let step = 0, timer = null;
function withTemplate(f){ f.layout = f.layout || {}; f.layout.template = view.template; return f; }
const base = {};
for (const [slot, f] of Object.entries(view.whole)) {
  base[slot] = (f.layout.shapes || []).slice();
  Plotly.newPlot('kv-' + slot, f.data, withTemplate(f).layout, cfg);
}
function marker(x){ return {type: 'line', x0: x, x1: x, yref: 'paper', y0: 0, y1: 1,
  line: {color: '#ff9f1a', width: 3, dash: 'dot'}}; }
function ticks(n_keys){
  const every = Math.max(1, Math.ceil(n_keys / Math.max(1, view.attention.max_ticks))), vals = [];
  for (let i = 0; i < n_keys; i += every) vals.push(i);
  return {tickmode: 'array', tickvals: vals, ticktext: vals.map(i => view.attention.labels[i])};
}
function drawAttention(i){
  if (!view.attention) return;
  const rows = run.attention[i], l = Number(layerSel.value), el = 'kv-attention-fig';
  if (!rows) return;
  const z = rows[l], nk = z[0].length, f = JSON.parse(JSON.stringify(view.attention.template));
  f.data[0].z = z; f.data[0].x = [...Array(nk).keys()]; f.data[0].y = [...Array(z.length).keys()];
  f.data[0].zmax = Math.max(...z.map(r => Math.max(...r)));
  (f.layout.shapes || []).forEach(s => { s.x1 = nk - 0.5; });
  Object.assign(f.layout.xaxis, ticks(nk));
  f.layout.title = Object.assign(f.layout.title || {}, {text: view.attention.titles[i].replace('{layer}', l)});
  Plotly.react(el, f.data, withTemplate(f).layout, cfg);
}
function show(i){
  step = Math.max(0, Math.min(n - 1, i));
  const fr = view.frames[step];
  for (const [slot, h] of Object.entries(fr.html || {})) document.getElementById('kv-' + slot).innerHTML = h;
  for (const [slot, f] of Object.entries(fr.figs || {}))
    Plotly.react('kv-' + slot, f.data, withTemplate(f).layout, cfg);
  for (const slot of Object.keys(view.whole))
    Plotly.relayout('kv-' + slot, {shapes: base[slot].concat([marker(view.step_x[step])])});
  drawAttention(step);
  slider.value = step;
  document.getElementById('kv-step-name').textContent = view.step_names[step] + ' (' + (step + 1) + ' / ' + n + ')';
  document.body.dataset.step = step;
}
function play(on){
  if (timer) { clearInterval(timer); timer = null; }
  if (on) {
    if (step >= n - 1) show(0);
    const ms = 1000 / Number(document.getElementById('kv-speed').value);
    timer = setInterval(() => { if (step >= n - 1) { play(false); } else { show(step + 1); } }, ms);
  }
  playBtn.textContent = on ? playBtn.dataset.pause : playBtn.dataset.play;
  document.body.dataset.playing = on ? '1' : '0';
}
slider.max = n - 1;
slider.addEventListener('input', () => { play(false); show(Number(slider.value)); });
playBtn.addEventListener('click', () => play(!timer));
document.getElementById('kv-prev').addEventListener('click', () => { play(false); show(step - 1); });
document.getElementById('kv-next').addEventListener('click', () => { play(false); show(step + 1); });
if (layerSel) layerSel.addEventListener('change', () => drawAttention(step));
document.addEventListener('keydown', ev => {
  if (ev.target.tagName === 'SELECT' || ev.target.tagName === 'INPUT' && ev.target.type !== 'range') return;
  const k = {ArrowRight: () => { play(false); show(step + 1); }, ArrowLeft: () => { play(false); show(step - 1); },
             Home: () => { play(false); show(0); }, End: () => { play(false); show(n - 1); },
             ' ': () => play(!timer)}[ev.key];
  if (k) { ev.preventDefault(); k(); }
});
show(n - 1);
document.body.dataset.ready = '1';
})();
"""


def _json_block(block_id: str, data: Any) -> str:
    # "<" escaped: a token text "</script>" must not end the block (\\u003c is the same character to a JSON reader)
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")
    return f'<script type="application/json" id="{block_id}">{text}</script>'


def _document(record: dict, view: dict, lang: str) -> str:
    import plotly.offline

    tr = lambda key, **kw: t(key, lang, **kw)  # noqa: E731
    # One template for every figure (each figure's own copy dropped: it is most of a small figure's JSON).
    template = None
    figures = list(view["whole"].values()) + [f for fr in view["frames"] for f in (fr.get("figs") or {}).values()]
    if view.get("attention"):
        figures.append(view["attention"]["template"])
    for f in figures:
        template = f["layout"].pop("template", template)
    view["template"] = template
    body = []
    for slot, heading in view["sections"]:
        if heading:
            body.append(f"<h2>{html.escape(heading)}</h2>")
        if slot == "attention":
            if view["attention"]:
                options = "".join(f'<option value="{i}">{i}</option>' for i in range(view["attention"]["n_layers"]))
                body.append(f'<label>{html.escape(tr("reuse.layer"))} <select id="kv-layer">{options}</select></label>'
                            f'<div id="kv-attention-fig"></div><p class="kv-sub">'
                            f'{html.escape(view["attention"]["help"])}</p>')
            continue
        body.append(f'<div id="kv-{slot}"></div>')
    if not view.get("attention"):
        note = view.get("no_attention") or tr("run_html.no_attention")
        body.append(f'<p class="kv-sub">{html.escape(note)}</p>')
    title = tr("run_html.title", page=view["title"], model=record["model"].get("name", ""))
    return "".join([
        f'<!DOCTYPE html><html lang="{lang}"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{_CSS}</style>",
        f'<script type="text/javascript">{plotly.offline.get_plotlyjs()}</script></head><body data-step="-1">',
        f"<h1>{html.escape(title)}</h1><p class='kv-sub'>{html.escape(tr('run_html.lead'))}</p>",
        f"<details open><summary>{html.escape(tr('run_html.facts'))}</summary>{_facts(record, lang)}</details>",
        '<div class="kv-player">',
        '<button id="kv-prev" title="←">◀</button>',
        f'<button id="kv-play" data-play="▶ {html.escape(tr("run_html.play"))}" '
        f'data-pause="⏸ {html.escape(tr("run_html.pause"))}">▶ {html.escape(tr("run_html.play"))}</button>',
        '<button id="kv-next" title="→">▶</button>',
        f'<input id="kv-slider" type="range" min="0" max="0" step="1" value="0" '
        f'aria-label="{html.escape(tr("run_html.slider"))}"><span id="kv-step-name"></span>',
        f'<label>{html.escape(tr("run_html.speed"))} <select id="kv-speed">'
        + "".join(f'<option value="{v}"{" selected" if v == 2 else ""}>{v}/s</option>' for v in (0.5, 1, 2, 4, 8))
        + "</select></label>",
        f'<span class="kv-keys">{html.escape(tr("run_html.keys"))}</span></div>',
        *body,
        _json_block("kvviz-run", record),
        _json_block("kvviz-view", view),
        f"<script>{_JS}</script></body></html>",
    ])


def read_run(document: str) -> dict:
    """The run record embedded in a document written by run_html (what a test or a script reads back)."""
    start = document.index('<script type="application/json" id="kvviz-run">')
    start = document.index(">", start) + 1
    return json.loads(document[start: document.index("</script>", start)])
