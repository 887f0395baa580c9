"""The model a page runs, and what a hosted demo allows it to run:

- `get_backend()`: the shared model for the sidebar's settings (weights cached across sessions, read-only), or
  None after saying why it could not load; `settings_spec()` describes a native model without loading it, and
  `model_spec()` gives any model's description for a page's first screen (loading only a Hugging Face model);
  `model_caption()` names it under a page's title; `shipped_for_hf()` runs the shipped model on a page that needs
  kvviz's own decoder; `preload_engine()` imports torch in the background;
  `loading_engine()` is where a page that needs the model for its first idea imports the engine and loads it, after
  its title, introduction and idea stepper are drawn (a page opened directly shows them at once); `c_step()` is
  kvviz's C decode step for Reusing Past K/V's steps where it runs the model (the other pages time PyTorch's);
- `hosted_caps()`, `secrets_dict()`, `hf_policy()`: the deployment's limits, from the environment or
  .streamlit/secrets.toml;
- `limit()`, `check_request()`, `check_sweep()`: a hosted demo's caps on a widget's bound, a request, a sweep.
"""
from __future__ import annotations

import dataclasses
import os
import threading
from typing import TYPE_CHECKING, Any

import streamlit as st
from streamlit.errors import StreamlitSecretNotFoundError

from kvviz.app import hosted
from kvviz.app.hosted import HostedCaps
from kvviz.app.language import lang, show_error, tr
from kvviz.engine import fetch
from kvviz.engine.backends.hf_policy import SECRET_ALLOWLIST, SECRET_MAX_PARAMS, HFPolicy, policy_from
from kvviz.engine.config import DecoderConfig
from kvviz.engine.shape import fetched_spec, native_spec, random_name, shipped_spec
from kvviz.errors import InputError
from kvviz.kv.formula import KVSpec

# torch (~1 s to import) is imported when a model is first needed, not before the first page is drawn.
# One intra-op thread per forward pass in the app server. It serves several sessions at once (each in its own
# thread, each pass releasing the GIL), and a decode pass of a small model is too short to gain from a second
# thread: OpenMP teams that outnumber the cores spin-wait on each other. Measured on the 2-core machine under
# load: 39 ms/token with 1 thread against 590-680 ms/token with 2 (bench/load_sessions.py reports the server's
# own step times). KVVIZ_TORCH_THREADS=N overrides, e.g. on a large machine serving one big model.
_threads = os.environ.get("KVVIZ_TORCH_THREADS", "1")
SERVER_TORCH_THREADS = int(_threads) if _threads.isdigit() and int(_threads) > 0 else 1
# KVVIZ_COMPILE=1: kvviz's decoder runs its decode step compiled by torch.compile (kvviz.engine.compiled), compiled
# once per loaded model by the first page that needs it (a spinner, then a caption with what it cost). Off by default:
# on a 2-core machine the first compile takes tens of seconds to minutes (docs/measurements.md), longer than any page
# may wait. On a CPU the app asks for inductor's graph, not kvviz's C step (the CLI's and the benches' CPU mode): the C
# step runs one row of a float32 model, so Latency & Capacity's batch, dtype and no-cache sweeps would time some
# settings on it and the rest uncompiled, two engines in one chart (a batch sweep read B = 1 at 0.41 ms a token and
# B = 2 at 2.82). Reusing Past K/V, whose steps are one row and compare no settings, steps on the C step (c_step()).
SERVER_COMPILE = os.environ.get("KVVIZ_COMPILE", "") == "1"
_compile_lock = threading.Lock()

if TYPE_CHECKING:
    from kvviz.app.sidebar import Settings
    from kvviz.engine.backends.base import Backend
    from kvviz.engine.compiled import CompiledStep


def hosted_caps() -> HostedCaps | None:
    """Hosted-demo caps from the environment or .streamlit/secrets.toml; None when not hosted."""
    try:
        return hosted.load_caps(os.environ, secrets_dict())
    except InputError as exc:
        show_error(exc)
        return HostedCaps()  # a misconfigured host still gets the default caps, never none


@st.cache_resource(show_spinner=False, max_entries=4)
def _cached_backend(
    model: str, dtype: str, device: str, shape: DecoderConfig | None, hf_policy: HFPolicy | None = None,
    engine: str = "auto",
) -> Backend:
    # Weights are shared and read-only across sessions; each session keeps its own cache.
    import torch

    torch.set_num_threads(SERVER_TORCH_THREADS)
    from kvviz.engine.loading import load_backend

    return load_backend(model, dtype=dtype, device=device, shape=shape, hf_policy=hf_policy, engine=engine)


def secrets_dict() -> dict[str, Any]:
    """.streamlit/secrets.toml as a plain dict ({} when there is none)."""
    try:  # st.secrets raises when no secrets.toml exists: probe for the file first
        return dict(st.secrets) if st.secrets.load_if_toml_exists() else {}
    except (FileNotFoundError, StreamlitSecretNotFoundError):
        return {}


def hf_policy(caps: HostedCaps | None = None) -> HFPolicy:
    """The deployment's limits on Hugging Face models: environment variables, else .streamlit/secrets.toml;
    on a hosted demo its allow-list and parameter cap apply too (checked before any weights are read)."""
    secrets = secrets_dict()
    policy = policy_from(os.environ, {k: secrets[k] for k in (SECRET_ALLOWLIST, SECRET_MAX_PARAMS) if k in secrets})
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
                                      hf_policy(settings.hosted), settings.engine)
            _engine_caption(backend)
        else:
            backend = _cached_backend(settings.model, settings.dtype, settings.device, shape)
        if settings.hosted is not None:
            hosted.check_params(backend.spec.n_params, settings.hosted)
        if SERVER_COMPILE and backend.kind == "native":
            _compiled_step(backend)
        return backend
    except (InputError, ValueError, FileNotFoundError, OSError) as exc:
        if settings.model == "hf":
            st.session_state.kv_hf_failed = (attempt, exc)
        _load_error(exc)
        return None


def _compiled_step(backend: Backend) -> None:
    """KVVIZ_COMPILE=1: the shared model's step compiled once (a spinner while it compiles; one session compiles,
    the others wait for it), then one sidebar caption with what the compile cost, or why steps run uncompiled."""
    step = backend.compiled
    if step is None or (not step.compiles and step.why_not is None):  # not compiled yet, or compiling now
        with st.spinner(tr("common.compiling")), _compile_lock:
            if backend.compiled is None:
                backend.compile("inductor" if backend.device.type == "cpu" else None).warm_up()
    step = backend.compiled
    if step.why_not is not None:
        st.sidebar.caption(tr("common.compile_failed", why=step.why_not))
    elif step.compiles:
        first = next(iter(step.compiles.values())).first_step_s
        st.sidebar.caption(tr("common.compiled_caption", mode=step.mode, seconds=f"{first:.1f}"))


def c_step(backend: Backend) -> CompiledStep | None:
    """kvviz's C decode step (kvviz.engine.compiled, "kernels" mode) for Reusing Past K/V's one-row steps, built once
    per machine and shared by the sessions of this model; None where it cannot run the model (not native, not a
    float32 model on an AVX2 CPU, no C compiler). Only that page steps on it: the pages that compare settings (Latency &
    Capacity's sweeps, Speculative Decoding's plain and speculative passes, Compressing the Cache's caches) time each
    setting on the backend's own step, one engine in each chart. The page's status line says which step ran."""
    if backend.kind != "native" or backend.device.type != "cpu":
        return None
    if backend.c_step is None:  # the first page that asks builds step.c (a few seconds, once per machine)
        from kvviz.engine.compiled import CompiledStep

        with _compile_lock:
            backend.c_step = backend.c_step or CompiledStep(backend.model, backend.device, "kernels")
    return backend.c_step if backend.c_step.why_not is None else None


def _engine_caption(backend: Backend) -> None:
    """Which engine runs a Hugging Face choice, and why transformers does when kvviz's decoder cannot."""
    note = getattr(backend, "native_note", None)
    if backend.kind == "native":
        st.sidebar.caption(tr("common.engine_native_caption"))
    elif note is not None:
        st.sidebar.caption(tr("common.engine_hf_caption", reason=note.message(lang())))


def _load_error(exc: Exception) -> None:
    st.error(tr("common.load_error", error=exc.message(lang()) if isinstance(exc, InputError) else exc))


def _check_hosted_model(settings: Settings) -> None:
    """On a hosted demo, refuse a model before loading it: allow-listed models, shapes within the caps."""
    if settings.hosted is None:
        return
    if settings.model == "hf":
        hosted.check_hf_model(settings.hf_model, settings.hosted)
    elif settings.model in fetch.MODELS:
        hosted.check_hf_model(settings.model, settings.hosted)
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
    if settings.model in fetch.MODELS and fetch.is_fetched(settings.model):
        return fetched_spec(settings.model)
    return None


def model_spec(settings: Settings) -> KVSpec | None:
    """The chosen model's description for a page's first screen: from its config for a native model (no weights,
    no torch: a page opened directly draws its settings at once, and loads the model when it first runs it), else
    from loading it (None, with the reason shown, when it cannot load)."""
    spec = settings_spec(settings)
    if spec is None:
        backend = get_backend(settings)
        spec = backend.spec if backend is not None else None
    return spec


_preload = threading.Lock()
_preloaded = False


def preload_engine() -> None:
    """Once per process, after the first page is drawn: import torch and the engine in the background, so the
    first page that runs a model does not wait the ~1 s import (a page asking earlier waits on the import lock,
    never imports twice). It begins when the script run that asked has ended (Streamlit runs a session's reruns on
    one thread, which then exits): called on a page's last line it held the interpreter while the run finished."""
    global _preloaded
    with _preload:
        if _preloaded:
            return
        _preloaded = True
    script = threading.current_thread()

    def work() -> None:
        if script is not threading.main_thread():  # a bare `python` call has no script run to wait for
            script.join()
        import kvviz.engine.generation  # noqa: F401 - torch, the model, the cache
        import kvviz.engine.loading  # noqa: F401 - the backends

    threading.Thread(target=work, name="kvviz-preload", daemon=True).start()


def loading_engine() -> Any:
    """Wrap a page's engine imports and its get_backend() call, placed after the title and introduction: on a
    fresh server importing torch takes ~2 s, and the page says what it waits for (the spinner shows only when the
    wait is longer than Streamlit's half-second delay, so a warm server shows nothing)."""
    return st.spinner(tr("common.loading_engine"))


def model_caption(a: KVSpec) -> None:
    st.caption(tr("common.model_info", name=a.name, layers=a.n_layers, heads=a.n_heads, kv_heads=a.n_kv_heads,
                  kind=a.attention_kind, d_head=a.d_head, params=f"{a.n_params:,}"))


def shipped_for_hf(settings: Settings, note_key: str) -> Settings:
    """The settings a page that runs inside kvviz's own decoder uses: with a Hugging Face model chosen, the note
    (`note_key`, why this page needs the native decoder) and the shipped model instead; otherwise unchanged."""
    if settings.model != "hf":
        return settings
    st.info(tr(note_key))
    return dataclasses.replace(settings, model="tiny")
