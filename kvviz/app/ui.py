"""The one kvviz module that imports streamlit: page setup, the shared sidebar, session state.

Shared settings live under non-widget keys (`kv_*`) in st.session_state, because Streamlit drops a
widget's state when the user switches page; each widget is re-seeded from them on every page.
"""
from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import streamlit as st
from streamlit import runtime
from streamlit.errors import StreamlitSecretNotFoundError
from streamlit.runtime.scriptrunner import get_script_run_ctx

from kvviz.app import hosted
from kvviz.app.hosted import HostedCaps
from kvviz.app.url_state import int_in, one_of
from kvviz.engine.backends.hf_policy import SECRET_ALLOWLIST, SECRET_MAX_PARAMS, HFPolicy, policy_from
from kvviz.engine.config import DecoderConfig
from kvviz.engine.device_names import DTYPE_NAMES, likely_devices
from kvviz.engine.shape import check_custom_shape, native_spec, random_name, shipped_spec
from kvviz.errors import InputError
from kvviz.i18n import LANG_NAMES, LANGS, t
from kvviz.kv.formula import KVSpec, kv_footprint
from kvviz.units import format_binary

# torch (~1 s to import) is imported when a model is first needed, not before the first page is drawn.
# One intra-op thread per forward pass in the app server. It serves several sessions at once (each in its own
# thread, each pass releasing the GIL), and a decode pass of a small model is too short to gain from a second
# thread: OpenMP teams that outnumber the cores spin-wait on each other. Measured on the 2-core machine under
# load: 39 ms/token with 1 thread against 590-680 ms/token with 2 (bench/load_sessions.py reports the server's
# own step times). KVVIZ_TORCH_THREADS=N overrides, e.g. on a large machine serving one big model.
_threads = os.environ.get("KVVIZ_TORCH_THREADS", "1")
SERVER_TORCH_THREADS = int(_threads) if _threads.isdigit() and int(_threads) > 0 else 1

if TYPE_CHECKING:  # pandas alone takes ~0.5-1.6 s to import: not on the path to the first page drawn
    import pandas as pd
    import plotly.graph_objects as go

    from kvviz.engine.backends.base import Backend

ROOT = Path(__file__).resolve().parents[2]  # the app's folder: app.py and pages/

MODELS = ("tiny", "random", "hf")
DEFAULTS = {
    "kv_lang": "en",
    "kv_model": "tiny",
    "kv_hf_model": "",  # a local directory or hub id, with model "hf"
    "kv_dtype": "float32",
    "kv_device": "cpu",
    # A custom shape starts with the shipped tokenizer's vocabulary, so its random model reads words, not bytes.
    "kv_shape": DecoderConfig(vocab_size=shipped_spec().vocab_size),
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
    ("pages/7_Serving_Engine.py", "nav.serving"),
    ("pages/8_Compressing_the_Cache.py", "nav.compress"),
    ("pages/9_Paged_Blocks.py", "nav.paged"),
)

T = TypeVar("T")
LECTURE_SEED = 0  # lecture mode pins every seed, so a demo repeats exactly on the projector
# Plotly's toolbar always shown, its camera button saving a PNG at twice the screen resolution.
PLOTLY_CONFIG = {"displayModeBar": True, "displaylogo": False, "toImageButtonOptions": {"format": "png", "scale": 2}}
# Streamlit sizes its text in rem: a larger root font enlarges every label, paragraph and widget.
LECTURE_CSS = """<style>
html { font-size: 22px; }
[data-testid='stMainBlockContainer'] { max-width: 100%; padding: 4rem 3rem 2rem 3rem; }
[data-testid='stMainBlockContainer'] h1 { font-size: 2.2rem; padding-top: 0; }
</style>"""  # at 1280×720 the default 6rem top padding (4rem clears the fixed header) and a 2.75rem title took a third

# Korean breaks lines between words (eojeol), not inside one: the browser's default split "토큰" across lines.
# overflow-wrap still breaks a word longer than its box, so nothing overflows.
KOREAN_CSS = """<style>
[data-testid='stAppViewContainer'] :is(p, li, h1, h2, h3, label, span, td, th, div[data-testid='stMarkdownContainer']),
[data-testid='stSidebar'] :is(p, li, label, span) { word-break: keep-all; overflow-wrap: break-word; }
</style>"""


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
    query_lang = st.query_params.get("lang")
    if "kv_lang_from_url" not in st.session_state:  # a session's first run only: later the radio decides
        st.session_state.kv_lang_from_url = True
        if query_lang in LANGS:
            st.session_state.kv_lang = query_lang  # a shared link opens in its language
    url_state("lecture", False, parse_bool, state="kv_lecture")
    url_state("model", DEFAULTS["kv_model"], one_of(MODELS), state="kv_model")


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
    # (lecture= and model= are checked by url_state)
    bad_lang = st.query_params.get("lang")
    if bad_lang is not None and bad_lang not in LANGS:
        st.warning(tr("hosted.bad_link", name="lang", value=bad_lang, choices=", ".join(LANGS)))


def _track_session(caps: HostedCaps | None) -> None:
    """On a hosted demo: note this session's activity and free the caches of sessions left idle."""
    ctx = get_script_run_ctx()
    if caps is None or ctx is None or not runtime.exists():
        return
    from kvviz.app.sessions import REGISTRY  # imports the engine (torch): only on a hosted demo

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
    _init_state()
    sidebar = "collapsed" if st.session_state.kv_lecture else "auto"  # the projector gets the whole width
    st.set_page_config(page_title=t(title_key, lang()), layout="wide", initial_sidebar_state=sidebar)
    if st.session_state.kv_lecture:
        st.html(LECTURE_CSS)
    if lang() == "ko":
        st.html(KOREAN_CSS)
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
        model_lang = lang()  # read now: AppTest calls format_func later, outside this run
        _persisted(st.selectbox, "kv_model", tr("common.model"), options=models,
                   format_func=lambda m: t(f"common.model_{m}", model_lang))
        if st.session_state.kv_model == "random":
            _shape_controls(caps)
        elif st.session_state.kv_model == "hf" and caps is not None:
            # A hosted demo offers its allow-list only: no free text, so no file-system paths.
            if st.session_state.kv_hf_model not in caps.hf_allow:
                st.session_state.kv_hf_model = caps.hf_allow[0]
            _persisted(st.selectbox, "kv_hf_model", tr("common.hf_model"), options=caps.hf_allow)
        elif st.session_state.kv_model == "hf":
            _persisted(st.text_input, "kv_hf_model", tr("common.hf_model"))
        _persisted(st.selectbox, "kv_dtype", tr("common.dtype"), options=list(DTYPE_NAMES))
        devices = likely_devices()
        if st.session_state.kv_device not in devices:
            missing = InputError("no_device", name=st.session_state.kv_device)
            st.warning(tr("hosted.device_reset", error=missing.message(lang())))
            st.session_state.kv_device = "cpu"
        _persisted(st.selectbox, "kv_device", tr("common.device"), options=devices)
        _persisted(st.toggle, "kv_lecture", tr("lecture.toggle"), help=tr("lecture.toggle_help"))
        if caps is not None:
            st.caption(tr("hosted.sidebar_caption", max_layers=caps.max_layers, max_d_model=caps.max_d_model,
                          max_params=f"{caps.max_params:,}", max_new_tokens=caps.max_new_tokens,
                          max_batch=caps.max_batch, max_sweep_points=caps.max_sweep_points,
                          kv_budget=format_binary(caps.kv_budget_bytes)))  # every cap that can refuse a request
    s = st.session_state
    return Settings(lang(), s.kv_model, s.kv_dtype, s.kv_device, s.kv_shape, s.kv_hf_model, s.kv_lecture, caps)


N = TypeVar("N", int, float)


def _number_text(x: float) -> str:
    """1,000 or 2.5 (never 1e+03 or 1000.0)."""
    return f"{int(x):,}" if float(x).is_integer() else f"{x:,.6g}"


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


@st.cache_resource(show_spinner=False, max_entries=4)
def _cached_backend(
    model: str, dtype: str, device: str, shape: DecoderConfig | None, hf_policy: HFPolicy | None = None
) -> Backend:
    # Weights are shared and read-only across sessions; each session keeps its own cache.
    import torch

    torch.set_num_threads(SERVER_TORCH_THREADS)
    if hf_policy is not None:  # the sidebar's Hugging Face choice: always the transformers backend
        from kvviz.engine.backends.hf import load_hf_backend

        return load_hf_backend(model, dtype=dtype, device=device, policy=hf_policy)
    from kvviz.engine.loading import load_backend

    return load_backend(model, dtype=dtype, device=device, shape=shape)


def secrets_dict() -> dict[str, Any]:
    """.streamlit/secrets.toml as a plain dict ({} when there is none)."""
    try:
        return dict(st.secrets) if st.secrets.load_if_toml_exists() else {}
    except (FileNotFoundError, StreamlitSecretNotFoundError):
        return {}


def hf_policy(caps: HostedCaps | None = None) -> HFPolicy:
    """The deployment's limits on Hugging Face models: environment variables, else .streamlit/secrets.toml;
    on a hosted demo its allow-list and parameter cap apply too (checked before any weights are read)."""
    try:
        secrets = {k: st.secrets[k] for k in (SECRET_ALLOWLIST, SECRET_MAX_PARAMS) if k in st.secrets}
    except (FileNotFoundError, StreamlitSecretNotFoundError):
        secrets = {}
    policy = policy_from(os.environ, secrets)
    if caps is None:
        return policy
    allow = caps.hf_allow if policy.allowlist is None else tuple(m for m in policy.allowlist if m in caps.hf_allow)
    cap = caps.max_params if policy.max_params is None else min(policy.max_params, caps.max_params)
    return HFPolicy(allowlist=allow, max_params=cap)


def get_backend(settings: Settings) -> Backend | None:
    """The shared model for these settings, or None after showing why it could not load.

    A Hugging Face model that failed to load is remembered for the session with its error: every rerun of every
    page would otherwise try again (an offline hub lookup takes ~20 s) until the user changes the choice.
    """
    if settings.model == "hf" and not settings.hf_model.strip():
        st.info(tr("hf.enter_model"))
        return None
    attempt = (settings.hf_model.strip(), settings.dtype, settings.device, settings.hosted)
    failed = st.session_state.get("kv_hf_failed")
    if settings.model == "hf" and failed is not None and failed[0] == attempt:
        _load_error(failed[1])
        st.caption(tr("hf.failed_remembered"))
        return None
    try:
        shape = settings.shape if settings.model == "random" else None
        _check_hosted_model(settings)
        if settings.model == "hf":
            backend = _cached_backend(settings.hf_model.strip(), settings.dtype, settings.device, None,
                                      hf_policy(settings.hosted))
        else:
            backend = _cached_backend(settings.model, settings.dtype, settings.device, shape)
        if settings.hosted is not None:
            hosted.check_params(backend.spec.n_params, settings.hosted)
        return backend
    except (InputError, ValueError, FileNotFoundError, OSError) as exc:
        if settings.model == "hf":
            st.session_state.kv_hf_failed = (attempt, exc)
        _load_error(exc)
        return None


def _load_error(exc: Exception) -> None:
    st.error(tr("common.load_error", error=exc.message(lang()) if isinstance(exc, InputError) else exc))


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
    hosted.check_request(settings.hosted, backend.spec, batch=batch, prompt_tokens=prompt_tokens,
                         max_new_tokens=max_new_tokens, dtype=settings.dtype)


def check_sweep(settings: Settings, n_points: int) -> None:
    """Call before a sweep: on a hosted demo, refuse more points than the cap."""
    if settings.hosted is not None:
        hosted.check_sweep(n_points, settings.hosted)


def settings_spec(settings: Settings) -> KVSpec | None:
    """The chosen native model's description without loading it (no weights, no torch); None for a Hugging
    Face model, whose description comes with loading it (get_backend)."""
    if settings.model == "tiny":
        return shipped_spec()
    if settings.model == "random":
        return native_spec(settings.shape, random_name(settings.shape))
    return None


_preload = threading.Lock()
_preloaded = False


def preload_engine() -> None:
    """Once per process, after the first page is drawn: import torch and the engine in the background, so the
    first page that runs a model does not wait the ~1 s import (a page asking earlier waits on the import lock,
    never imports twice)."""
    global _preloaded
    with _preload:
        if _preloaded:
            return
        _preloaded = True

    def work() -> None:
        import kvviz.engine.generation  # noqa: F401 - torch, the model, the cache
        import kvviz.engine.loading  # noqa: F401 - the backends

    threading.Thread(target=work, name="kvviz-preload", daemon=True).start()


def model_caption(a: KVSpec) -> None:
    st.caption(tr("common.model_info", name=a.name, layers=a.n_layers, heads=a.n_heads, kv_heads=a.n_kv_heads,
                  kind=a.attention_kind, d_head=a.d_head, params=f"{a.n_params:,}"))


# ---- shareable links, export, lecture mode ------------------------------------------------------------
persisted = _persisted  # public name for pages: a widget seeded from, and saved to, a session key


def parse_bool(raw: str) -> bool:
    if raw.lower() in ("1", "true", "yes", "on"):
        return True
    if raw.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(raw)


def _url_text(value: Any) -> str:
    return ("1" if value else "0") if isinstance(value, bool) else str(value)


def url_state(key: str, default: T, parse: Callable[[str], T] = str, *, state: str | None = None) -> str:
    """Keep a setting in the link: seeded from `?key=` once per session, then mirrored back on every run.

    Returns the session_state key that holds the value (`state`, or `kv_url_<key>`); give it to
    `persisted(widget, state_key, label, ...)`. A value equal to `default` is left out of the URL.
    A value the parser rejects is dropped with a warning and the default kept.
    """
    state = state or f"kv_url_{key}"
    read: set[str] = st.session_state.setdefault("_kv_url_read", set())
    if state not in read:
        read.add(state)  # the link is read when it is opened; afterwards the widgets lead
        raw = st.query_params.get(key)
        if raw is not None:
            try:
                st.session_state[state] = parse(raw)
            except (ValueError, InputError):
                st.warning(tr("lecture.bad_url_param", name=key, value=raw))
    st.session_state.setdefault(state, default)
    value = st.session_state[state]
    if value == default:
        if key in st.query_params:
            del st.query_params[key]
    elif st.query_params.get(key) != _url_text(value):
        st.query_params[key] = _url_text(value)
    return state


def chart(fig: go.Figure, key: str) -> None:
    """A Plotly chart with its toolbar on (PNG download named after `key`).

    theme=None: the figure's own layout (charts.base.style: lecture type sizes, room for the toolbar) is what
    shows; Streamlit's theme would override its fonts and margins.
    """
    config = {**PLOTLY_CONFIG, "toImageButtonOptions": {**PLOTLY_CONFIG["toImageButtonOptions"], "filename": key}}
    st.plotly_chart(fig, key=key, config=config, width="stretch", theme=None)


def table(df: pd.DataFrame, key: str, *, prose: bool = False) -> None:
    """A table and a button that downloads it as CSV (UTF-8 with BOM, so spreadsheets read Korean).

    `prose`: cells of sentences, shown as a static table that wraps them instead of a scrolling grid.
    """
    if prose:
        st.table(df, hide_index=True)
    else:
        st.dataframe(df, hide_index=True, width="stretch")
    st.download_button(tr("lecture.download_csv"), df.to_csv(index=False).encode("utf-8-sig"),
                       file_name=f"{key}.csv", mime="text/csv", key=f"{key}_csv")


def lecture_head(widths: tuple[int, int] = (3, 1)) -> tuple[Any, Any]:
    """Where the introduction and the settings go: in lecture mode one row of two columns of these widths (so the
    demo's controls and the idea fit one screen); otherwise wherever the page is when each is entered."""
    if not st.session_state.get("kv_lecture"):
        return contextlib.nullcontext(), contextlib.nullcontext()
    intro, settings = st.columns(list(widths), vertical_alignment="center")
    return intro, settings


def intro_box() -> Any:
    """Where a page's introduction goes: on the page, or in lecture mode folded away (the presenter says it)."""
    return st.expander(tr("lecture.about")) if st.session_state.get("kv_lecture") else st.container()


def settings_box(label: str | None = None, *, border: bool = False) -> Any:
    """Where a page's settings go: on the page, or in lecture mode behind one button (`label`, or "Settings"), so
    that one screen holds the controls a demo clicks and the idea on screen."""
    if st.session_state.get("kv_lecture"):
        return st.popover(label or tr("lecture.settings"), icon=":material/tune:")
    return st.container(border=border)


def ideas(titles: Sequence[str], key: str) -> list[int]:
    """Which sections a page renders: all of them, or in lecture mode one idea per screen (kept in `?idea=`).

    In lecture mode a stepper heads the page: previous / next buttons around a bar naming every idea, so a
    presenter moves through the page one screen at a time (the choice is in the link, so a slide can be shared).
    """
    if not st.session_state.get("kv_lecture"):
        return list(range(len(titles)))
    state = url_state("idea", 1, int_in(1, len(titles)), state=f"kv_idea_{key}")

    def move(by: int) -> None:
        st.session_state[state] = min(max(st.session_state[state] + by, 1), len(titles))

    back, bar, forward = st.columns([1, 12, 1], vertical_alignment="bottom")
    back.button("←", key=f"kv_idea_back_{key}", on_click=move, args=(-1,), disabled=st.session_state[state] == 1,
                help=tr("lecture.previous"), width="stretch")
    forward.button("→", key=f"kv_idea_next_{key}", on_click=move, args=(1,),
                   disabled=st.session_state[state] == len(titles), help=tr("lecture.next"), width="stretch")
    with bar:
        persisted(st.segmented_control, state, tr("lecture.idea"), options=range(1, len(titles) + 1),
                  format_func=lambda i: f"{i}. {titles[i - 1]}", required=True, width="stretch")
    return [st.session_state[state] - 1]


def demo_seed(seed: int) -> int:
    """The seed a demo uses: the user's, or in lecture mode the fixed one."""
    return LECTURE_SEED if st.session_state.get("kv_lecture") else seed


def link_to(path: str) -> None:
    """A translated link to another page of the app, if that page exists."""
    labels = dict(NAV)
    if path in labels and (ROOT / path).exists():
        st.page_link(path, label=tr(labels[path]), icon=":material/arrow_forward:")


def number_in_range(where: Any, label: str, low: float, high: float, default: float | None, key: str, *,
                    whole: bool = True, **kwargs: Any) -> Any:
    """A number box whose bounds are checked here, not by the widget: a value outside [low, high] is refused with a
    message that names the box and the range, and the last valid value (`default` before any) is used.

    Streamlit's own min/max are left off on purpose: with them the browser keeps an out-of-range entry in the box
    while the app silently goes on with the previous value. An emptied box keeps the last valid value; with
    `default=None` (an optional number, such as a prediction or an unknown memory size) it returns None until a
    valid value is entered. Other keyword arguments go to st.number_input.
    """
    valid_key = f"_valid_{key}"
    valid = st.session_state.get(valid_key, default)
    if valid is not None and not low <= valid <= high:  # the range itself changed (another model): start again
        valid = None if default is None else min(max(default, low), high)
    if valid is not None:
        st.session_state.setdefault(key, int(valid) if whole else float(valid))
    elif key not in st.session_state:
        kwargs["value"] = None  # an optional number starts empty
    kwargs.setdefault("step", 1 if whole else None)
    value = where.number_input(label, key=key, **kwargs)
    if value is None:
        return valid
    if not low <= value <= high or (whole and value != int(value)):
        kept = "" if valid is None else tr("common.out_of_range_kept", kept=_number_text(valid))
        where.error(tr("common.out_of_range", name=label, value=_number_text(value), low=_number_text(low),
                       high=_number_text(high), kept=kept))
        return valid
    st.session_state[valid_key] = int(value) if whole else float(value)
    return st.session_state[valid_key]


def noise_indicator(model: Callable[[], Backend | None], key: str) -> None:
    """How noisy this machine is right now: the CPU load always, and on request the spread of identical passes
    (of the model `model()` gives: it is loaded then, so the page draws this without torch)."""
    from kvviz.engine.machine import cpu_load

    state = f"_noise_{key}"

    def probe() -> None:  # in the callback: before anything of the rerun is drawn
        from kvviz.engine.timing import noise_probe

        backend = model()
        if backend is not None:
            st.session_state[state] = noise_probe(backend)

    c1, c2 = st.columns([5, 1])
    noise = st.session_state.get(state)
    load = cpu_load()
    load_text = tr("timing.load", load=f"{load[0]:.1f}", cores=load[1]) if load else tr("timing.load_unknown")
    if noise is None:
        c1.caption(tr("timing.noise_idle", load=load_text))
    else:
        c1.caption(tr(f"timing.noise_{noise.level}", load=load_text, n=noise.n_passes,
                      p50=f"{noise.p50_s * 1e3:.2f} ms", p90=f"{noise.p90_s * 1e3:.2f} ms",
                      ratio=f"{noise.p90_over_p50:.2f}"))
    c2.button(tr("timing.check_noise"), on_click=probe, key=f"{state}_button", help=tr("timing.check_noise_help"))
# ---- a Step button that never loses a click --------------------------------------------------------------
# st.button sends a one-shot trigger: two clicks that reach the server before it picks the first up are
# merged into one (Streamlit coalesces pending triggers), so a fast lecturer loses steps. This button sends
# a running count of its clicks instead; the newest count always wins, and the page advances one token per
# click it has not yet served. It also listens for the → and Space keys (outside text fields) and R, which
# clicks the page's Reset button (Streamlit reserves R for its own shortcuts, so `shortcut="R"` is refused).
_STEPPER_JS = """
export default function(component) {
  const { data, setStateValue, parentElement } = component;
  let btn = parentElement.querySelector('button.kv-step');
  if (!btn) {
    btn = document.createElement('button');
    btn.className = 'kv-step';
    btn.type = 'button';
    parentElement.appendChild(btn);
  }
  btn.textContent = data.label;
  btn.title = data.title;
  btn.disabled = !!data.disabled;
  btn.dataset.served = String(data.base);
  // The count only grows: after a remount (another page and back) it restarts from what the server served.
  const st = parentElement.__kv || (parentElement.__kv = { clicks: 0 });
  if (data.base > st.clicks) st.clicks = data.base;
  const send = () => {
    if (btn.disabled) return;
    st.clicks += 1;
    btn.dataset.clicks = String(st.clicks);
    setStateValue('clicks', st.clicks);
  };
  btn.onclick = send;
  const typing = (el) => el && (el.isContentEditable || ['INPUT', 'TEXTAREA', 'SELECT'].includes(el.tagName));
  const onKey = (e) => {
    if (e.ctrlKey || e.metaKey || e.altKey || typing(e.target)) return;
    if (e.key === 'ArrowRight' || e.key === ' ') {
      e.preventDefault(); e.stopImmediatePropagation(); send();
    } else if ((e.key === 'r' || e.key === 'R') && data.reset_selector) {
      const reset = document.querySelector(data.reset_selector);
      if (reset && !reset.disabled) { e.preventDefault(); e.stopImmediatePropagation(); reset.click(); }
    }
  };
  if (window.__kvStepKey) window.removeEventListener('keydown', window.__kvStepKey, true);
  window.__kvStepKey = onKey;
  window.addEventListener('keydown', onKey, true);
  return () => {
    if (window.__kvStepKey === onKey) { window.removeEventListener('keydown', onKey, true); window.__kvStepKey = null; }
  };
}
"""
_STEPPER_CSS = """
button.kv-step { font: inherit; font-size: 1rem; line-height: 1.6; padding: 0.25rem 0.75rem; min-height: 2.5rem;
  border-radius: 0.5rem; border: 1px solid rgba(49, 51, 63, 0.2); background: #fff; color: rgb(49, 51, 63);
  cursor: pointer; white-space: nowrap; }
button.kv-step:hover:not(:disabled) { border-color: #ff4b4b; color: #ff4b4b; }
button.kv-step:active:not(:disabled) { background: #ff4b4b; color: #fff; }
button.kv-step:disabled { opacity: 0.45; cursor: not-allowed; }
"""
_stepper_component = None


def _no_callback() -> None:
    """The page reads the click count on its rerun; nothing else to do when it changes."""


def stepper(label: str, *, key: str, served: int, disabled: bool, help: str = "",
            reset_key: str | None = None) -> int:
    """A Step button that returns how many times it was clicked in this session (never fewer than `served`).

    The page serves `clicks - served` steps, one token each, and keeps `served` in its own state.
    """
    global _stepper_component
    if _stepper_component is None:
        _stepper_component = st.components.v2.component("kvviz_stepper", js=_STEPPER_JS, css=_STEPPER_CSS)
    data = {"label": label, "title": help, "disabled": disabled, "base": served,
            "reset_selector": f".st-key-{reset_key} button" if reset_key else None}
    result = _stepper_component(key=key, data=data, default={"clicks": served}, width="content",
                                on_clicks_change=_no_callback)
    clicks = getattr(result, "clicks", None)
    return served if clicks is None else max(int(clicks), 0)


# ---- server-side timings for bench/ (off unless KVVIZ_TIMING_LOG names a file) -----------------------------
def record_timing(event: str, **fields: float | int | str) -> None:
    """Append one JSON line {event, session, t, **fields} to $KVVIZ_TIMING_LOG, so a benchmark can read the
    server's own time per step (not the browsers'). Nothing happens when the variable is unset."""
    path = os.environ.get("KVVIZ_TIMING_LOG")
    if not path:
        return
    import json

    ctx = get_script_run_ctx()
    line = json.dumps({"event": event, "session": ctx.session_id if ctx else None, "t": time.time(), **fields})
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
