"""The one kvviz module that imports streamlit: page setup, the shared sidebar, session state.

Shared settings live under non-widget keys (`kv_*`) in st.session_state, because Streamlit drops a
widget's state when the user switches page; each widget is re-seeded from them on every page.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import streamlit as st
from streamlit import runtime
from streamlit.runtime.scriptrunner import get_script_run_ctx

from . import hosted

from .backends.base import Backend
from .config import DecoderConfig
from .device import DTYPES, available_devices
from .errors import InputError
from .hosted import HostedCaps
from .i18n import LANG_NAMES, LANGS, t
from .loading import load_backend
from .memory import dtype_bytes, format_binary
from .sessions import REGISTRY

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
    hosted: HostedCaps | None = None  # the caps in force on a hosted demo, None elsewhere


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
    if "kv_lang_from_url" not in st.session_state:  # a session's first run only: later the radio decides
        st.session_state.kv_lang_from_url = True
        if query_lang in LANGS:
            st.session_state.kv_lang = query_lang  # a shared link opens in its language


def hosted_caps() -> HostedCaps | None:
    """Hosted-demo caps from the environment or .streamlit/secrets.toml; None when not hosted."""
    # st.secrets raises when no secrets.toml exists: probe for the file first.
    secrets = st.secrets if st.secrets.load_if_toml_exists() else {}
    try:
        return hosted.load_caps(os.environ, secrets)
    except InputError as exc:
        show_error(exc)
        return HostedCaps()  # a misconfigured host still gets the default caps, never none


def _check_link() -> None:
    """A malformed shared link (?lang=xx&lecture=banana) is said, not obeyed; the settings stay."""
    bad_lang = st.query_params.get("lang")
    if bad_lang is not None and bad_lang not in LANGS:
        st.warning(tr("hosted.bad_link", name="lang", value=bad_lang, choices=", ".join(LANGS)))
    if st.query_params.get("lecture") not in (None, "0", "1"):
        st.warning(tr("hosted.bad_link", name="lecture", value=st.query_params["lecture"], choices="0, 1"))
        del st.query_params["lecture"]


def _track_session(caps: HostedCaps | None) -> None:
    """On a hosted demo: note this session's activity and free the caches of sessions left idle."""
    ctx = get_script_run_ctx()
    if caps is None or ctx is None or not runtime.exists():
        return
    now = time.monotonic()
    REGISTRY.sweep(now, caps.idle_timeout_s, _session_state_of)
    if REGISTRY.pop_freed(ctx.session_id):
        st.info(tr("hosted.idle_freed", minutes=f"{caps.idle_timeout_s / 60:g}"))
    REGISTRY.touch(ctx.session_id, now)


def _session_state_of(session_id: str):  # noqa: ANN202 - Streamlit's SessionState, or None
    """A connected session's state (None once it disconnected or closed: Streamlit frees those)."""
    session = runtime.get_instance().get_app_session(session_id)
    return session.session_state if session is not None else None


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
    _check_link()
    caps = hosted_caps()
    _track_session(caps)
    with st.sidebar:
        for path, key in NAV:
            if (ROOT / path).exists():
                st.page_link(path, label=t(key, lang()))
        _persisted(st.radio, "kv_lang", t("common.language", lang()), options=LANGS,
                   format_func=LANG_NAMES.get, horizontal=True)
        if lang() != st.query_params.get("lang", "en"):
            st.query_params["lang"] = lang()
        models = MODELS if caps is None or caps.hf_allow else tuple(m for m in MODELS if m != "hf")
        if st.session_state.kv_model not in models:
            st.session_state.kv_model = DEFAULTS["kv_model"]
        _persisted(st.selectbox, "kv_model", tr("common.model"), options=models,
                   format_func=lambda m, lg=lang(): t(f"common.model_{m}", lg))  # bound now: AppTest calls it later
        if st.session_state.kv_model == "random":
            _shape_controls(caps)
        elif st.session_state.kv_model == "hf" and caps is not None:
            # A hosted demo offers its allow-list only: no free text, so no file-system paths.
            if st.session_state.kv_hf_model not in caps.hf_allow:
                st.session_state.kv_hf_model = caps.hf_allow[0]
            _persisted(st.selectbox, "kv_hf_model", tr("common.hf_model"), options=caps.hf_allow)
        elif st.session_state.kv_model == "hf":
            _persisted(st.text_input, "kv_hf_model", tr("common.hf_model"))
        _persisted(st.selectbox, "kv_dtype", tr("common.dtype"), options=list(DTYPES))
        devices = available_devices()
        if st.session_state.kv_device not in devices:
            missing = InputError("no_device", name=st.session_state.kv_device)
            st.warning(tr("hosted.device_reset", error=missing.message(lang())))
            st.session_state.kv_device = "cpu"
        _persisted(st.selectbox, "kv_device", tr("common.device"), options=devices)
        if caps is not None:
            st.caption(tr("hosted.sidebar_caption", max_layers=caps.max_layers, max_d_model=caps.max_d_model,
                          max_new_tokens=caps.max_new_tokens, max_batch=caps.max_batch,
                          kv_budget=format_binary(caps.kv_budget_bytes)))
    s = st.session_state
    return Settings(lang(), s.kv_model, s.kv_dtype, s.kv_device, s.kv_shape, s.kv_hf_model, s.kv_lecture, caps)


def _shape_controls(caps: HostedCaps | None = None) -> None:
    shape: DecoderConfig = st.session_state.kv_shape
    c1, c2 = st.columns(2)
    layers = c1.number_input(tr("common.layers"), 1, 48, shape.n_layers, key="_w_layers")
    d_model = c2.number_input(tr("common.d_model"), 16, 4096, shape.d_model, step=16, key="_w_d_model")
    heads = c1.number_input(tr("common.heads"), 1, 64, shape.n_heads, key="_w_heads")
    kv_heads = c2.number_input(tr("common.kv_heads"), 1, 64, shape.n_kv_heads, key="_w_kv_heads")
    d_head = st.number_input(tr("common.d_head"), 2, 256, shape.d_head, step=2, key="_w_d_head")
    try:
        new = DecoderConfig(n_layers=int(layers), d_model=int(d_model), n_heads=int(heads),
                            n_kv_heads=int(kv_heads), d_head=int(d_head), d_ff=int(d_model) * 8 // 3 // 16 * 16 or 16)
        if caps is not None:
            hosted.check_shape(new, caps)
        hosted.check_weights_fit(new, int(dtype_bytes(st.session_state.kv_dtype)), hosted.available_memory_bytes())
    except InputError as exc:
        # Keep the last valid shape (and the generation built on it); say what is wrong.
        st.error(tr("common.invalid_shape", error=exc.message(lang())))
        return
    st.session_state.kv_shape = new
    st.caption(tr("common.shape_caption", kind=new.attention_kind, n_heads=new.n_heads,
                  n_kv_heads=new.n_kv_heads, group=new.group_size))


@st.cache_resource(show_spinner=False, max_entries=4)
def _cached_backend(model: str, dtype: str, device: str, shape: DecoderConfig | None) -> Backend:
    # Weights are shared and read-only across sessions; each session keeps its own cache.
    return load_backend(model, dtype=dtype, device=device, shape=shape)


def get_backend(settings: Settings) -> Backend | None:
    """The shared model for these settings, or None after showing why it could not load."""
    try:
        shape = settings.shape if settings.model == "random" else None
        _check_hosted_model(settings)
        backend = _cached_backend(settings.model, settings.dtype, settings.device, shape)
        if settings.hosted is not None:
            hosted.check_params(backend.arch.n_params, settings.hosted)
        return backend
    except (InputError, ValueError, FileNotFoundError) as exc:
        st.error(tr("common.load_error", error=exc.message(lang()) if isinstance(exc, InputError) else exc))
        return None


def _check_hosted_model(settings: Settings) -> None:
    """On a hosted demo, refuse a model before loading it: allow-listed hub ids, shapes within the caps."""
    if settings.hosted is None:
        return
    if settings.model == "hf":
        hosted.check_hf_model(settings.hf_model, settings.hosted)
    elif settings.model == "random":
        hosted.check_shape(settings.shape, settings.hosted)


def limit(settings: Settings, cap: str, default: int) -> int:
    """A widget's upper bound: `default`, lowered to the hosted cap of that name (e.g. "max_new_tokens")."""
    return default if settings.hosted is None else min(default, getattr(settings.hosted, cap))


def check_request(settings: Settings, backend: Backend, *, batch: int, prompt_tokens: int, max_new_tokens: int) -> None:
    """Call before prefill: on a hosted demo, refuse a request past the batch, token or per-session KV caps."""
    if settings.hosted is None:
        return
    a = backend.arch
    hosted.check_request(settings.hosted, batch=batch, prompt_tokens=prompt_tokens, max_new_tokens=max_new_tokens,
                         n_layers=a.n_layers, n_kv_heads=a.n_kv_heads, d_head=a.d_head, dtype=settings.dtype)


def check_sweep(settings: Settings, n_points: int) -> None:
    """Call before a sweep: on a hosted demo, refuse more points than the cap."""
    if settings.hosted is not None:
        hosted.check_sweep(n_points, settings.hosted)


def model_caption(backend: Backend) -> None:
    a = backend.arch
    st.caption(tr("common.model_info", name=a.name, layers=a.n_layers, heads=a.n_heads, kv_heads=a.n_kv_heads,
                  kind=a.attention_kind, d_head=a.d_head, params=f"{a.n_params:,}"))
