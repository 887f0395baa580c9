"""The one kvviz module that imports streamlit: page setup, the shared sidebar, session state.

Shared settings live under non-widget keys (`kv_*`) in st.session_state, because Streamlit drops a
widget's state when the user switches page; each widget is re-seeded from them on every page.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import streamlit as st

from .backends.base import Backend
from .config import DecoderConfig
from .device import DTYPES, available_devices
from .errors import InputError
from .i18n import LANG_NAMES, LANGS, t
from .loading import load_backend
from .memory import dtype_bytes, kv_cache_bytes
from .shape import check_custom_shape, parameter_count

ROOT = Path(__file__).resolve().parents[1]  # the app's folder: app.py and pages/

MODELS = ("tiny", "random", "hf")
DEFAULTS = {
    "kv_lang": "en",
    "kv_model": "random",  # flips to "tiny" once the shipped model lands
    "kv_hf_model": "",  # a local directory or hub id, with model "hf"
    "kv_dtype": "float32",
    "kv_device": "cpu",
    "kv_shape": DecoderConfig(),
    "kv_lecture": False,
}

# Our own translated navigation (Streamlit's automatic one shows English file names): path, title key.
NAV = (
    ("app.py", "nav.home"),
    ("pages/1_Reusing_Past_KV.py", "nav.reuse"),
    ("pages/2_Prefill_and_Decode.py", "nav.prefill_decode"),
    ("pages/3_Memory_Footprint.py", "nav.memory"),
    ("pages/4_Latency_and_Capacity.py", "nav.latency"),
    ("pages/5_Training_Prefill_Decode.py", "nav.training"),
    ("pages/6_Check.py", "nav.check"),
)


@dataclass(frozen=True)
class Settings:
    lang: str
    model: str  # tiny | random | hf
    dtype: str
    device: str
    shape: DecoderConfig
    hf_model: str = ""
    lecture: bool = False


def lang() -> str:
    return st.session_state.get("kv_lang", "en")


def tr(key: str, **values: object) -> str:
    """Translate a locale key into the session's language."""
    return t(key, lang(), **values)


def show_error(exc: Exception) -> None:
    """A clear message in the user's language, never a traceback."""
    st.error(exc.message(lang()) if isinstance(exc, InputError) else str(exc))


def _init_state() -> None:
    for key, value in DEFAULTS.items():
        st.session_state.setdefault(key, value)
    if st.query_params.get("lecture") == "1":
        st.session_state.kv_lecture = True
    query_lang = st.query_params.get("lang")
    if query_lang in LANGS and "kv_lang_from_url" not in st.session_state:
        st.session_state.kv_lang = query_lang  # a shared link opens in its language, once
        st.session_state.kv_lang_from_url = True


def _persisted(widget, key: str, label: str, **kwargs):  # noqa: ANN001, ANN202 - any st widget
    """A widget whose value survives page switches: seeded from and written back to `key`."""
    st.session_state["_w_" + key] = st.session_state[key]

    def save() -> None:
        st.session_state[key] = st.session_state["_w_" + key]

    return widget(label, key="_w_" + key, on_change=save, **kwargs)


def page_setup(title_key: str) -> Settings:
    """Call first on every page: page config, the shared sidebar, and the settings it chose."""
    st.set_page_config(page_title=t(title_key, st.session_state.get("kv_lang", "en")), layout="wide")
    _init_state()
    with st.sidebar:
        for path, key in NAV:
            if (ROOT / path).exists():
                st.page_link(path, label=t(key, lang()))
        _persisted(st.radio, "kv_lang", t("common.language", lang()), options=LANGS,
                   format_func=LANG_NAMES.get, horizontal=True)
        if lang() != st.query_params.get("lang", "en"):
            st.query_params["lang"] = lang()
        _persisted(st.selectbox, "kv_model", tr("common.model"), options=MODELS,
                   format_func=lambda m, lang=lang(): t(f"common.model_{m}", lang))  # evaluated outside the run too (AppTest)
        if st.session_state.kv_model == "random":
            _shape_controls()
        elif st.session_state.kv_model == "hf":
            _persisted(st.text_input, "kv_hf_model", tr("common.hf_model"))
        _persisted(st.selectbox, "kv_dtype", tr("common.dtype"), options=list(DTYPES))
        devices = available_devices()
        if st.session_state.kv_device not in devices:
            st.session_state.kv_device = "cpu"
        _persisted(st.selectbox, "kv_device", tr("common.device"), options=devices)
    s = st.session_state
    return Settings(lang(), s.kv_model, s.kv_dtype, s.kv_device, s.kv_shape, s.kv_hf_model, s.kv_lecture)


def _shape_controls() -> None:
    """Custom shape: layers, query heads, KV heads (MHA/GQA/MQA), d_head, d_model; an invalid one changes nothing."""
    shape: DecoderConfig = st.session_state.kv_shape
    c1, c2 = st.columns(2)
    layers = c1.number_input(tr("common.layers"), 1, 48, shape.n_layers, key="_w_layers", help=tr("shape.help_layers"))
    d_model = c2.number_input(tr("common.d_model"), 16, 4096, shape.d_model, step=16, key="_w_d_model",
                              help=tr("shape.help_d_model"))
    heads = c1.number_input(tr("common.heads"), 1, 64, shape.n_heads, key="_w_heads", help=tr("shape.help_heads"))
    kv_heads = c2.number_input(tr("common.kv_heads"), 1, 64, shape.n_kv_heads, key="_w_kv_heads",
                               help=tr("shape.help_kv_heads"))
    d_head = st.number_input(tr("common.d_head"), 2, 256, shape.d_head, step=2, key="_w_d_head",
                             help=tr("shape.help_d_head"))
    try:
        new = check_custom_shape(DecoderConfig(
            n_layers=int(layers), d_model=int(d_model), n_heads=int(heads), n_kv_heads=int(kv_heads),
            d_head=int(d_head), d_ff=int(d_model) * 8 // 3 // 16 * 16 or 16))
    except InputError as exc:
        # Keep the last valid shape (and the generation built on it); say what is wrong.
        st.error(tr("common.invalid_shape", error=exc.message(lang())))
        return
    st.session_state.kv_shape = new
    st.caption(tr("common.shape_caption", kind=new.attention_kind, n_heads=new.n_heads,
                  n_kv_heads=new.n_kv_heads, group=new.group_size))
    per_token = kv_cache_bytes(1, new.n_layers, 1, new.n_kv_heads, new.d_head, dtype_bytes(st.session_state.kv_dtype))
    st.caption(tr("shape.kv_per_token", bytes=f"{per_token:,}", params=f"{parameter_count(new):,}"))


@st.cache_resource(show_spinner=False, max_entries=4)
def _cached_backend(model: str, dtype: str, device: str, shape: DecoderConfig | None) -> Backend:
    # Weights are shared and read-only across sessions; each session keeps its own cache.
    return load_backend(model, dtype=dtype, device=device, shape=shape)


def get_backend(settings: Settings) -> Backend | None:
    """The shared model for these settings, or None after showing why it could not load."""
    try:
        shape = settings.shape if settings.model == "random" else None
        return _cached_backend(settings.model, settings.dtype, settings.device, shape)
    except (InputError, ValueError, FileNotFoundError) as exc:
        st.error(tr("common.load_error", error=exc.message(lang()) if isinstance(exc, InputError) else exc))
        return None


def model_caption(backend: Backend) -> None:
    a = backend.arch
    st.caption(tr("common.model_info", name=a.name, layers=a.n_layers, heads=a.n_heads, kv_heads=a.n_kv_heads,
                  kind=a.attention_kind, d_head=a.d_head, params=f"{a.n_params:,}"))
