"""The Serving Engine page headless (AppTest): both languages, hosted allow-list, bad URLs, kept results.
The page against a real llama-server, during and after a sweep, is in tests/browser/test_serving_browser.py."""
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from kvviz.serving.llamacpp import free_port

HOME, PAGE = str(Path(__file__).resolve().parents[2] / "app.py"), "pages/7_Serving_Engine.py"


def _page(lang: str = "en") -> AppTest:
    """The page opened from Home, as a visitor reaches it (page links need the app's entry point)."""
    at = AppTest.from_file(HOME, default_timeout=60)
    at.session_state["kv_lang"] = lang
    at.run()
    return at.switch_page(PAGE)


@pytest.mark.parametrize("lang,title", [("en", "Serving Engine"), ("ko", "서빙 엔진")])
def test_page_runs_in_both_languages(lang, title):
    at = _page(lang)
    at.run()
    assert not at.exception
    assert at.title[0].value == title
    assert len(at.text_input(key="serving_api_key").value or "") == 0
    assert at.text_input(key="serving_api_key").proto.type == at.text_input(key="serving_api_key").proto.PASSWORD


@pytest.mark.parametrize("lang,needle", [("en", "cannot reach"), ("ko", "연결할 수 없습니다")])
def test_unreachable_server_message(lang, needle):
    at = _page(lang)
    at.run()
    at.text_input(key="serving_url").set_value(f"http://127.0.0.1:{free_port()}").run()
    at.button[0].click().run()  # Connect
    assert not at.exception
    assert any(needle in e.value for e in at.error)


def test_bad_url_message():
    at = _page()
    at.run()
    at.text_input(key="serving_url").set_value("localhost").run()
    at.button[0].click().run()
    assert any("is not a server address" in e.value for e in at.error)


def test_hosted_without_allowlist_offers_nothing(monkeypatch):
    monkeypatch.setenv("KVVIZ_HOSTED", "1")
    monkeypatch.delenv("KVVIZ_SERVE_ALLOW", raising=False)
    at = _page()
    at.run()
    assert not at.exception
    assert any("no server allow-list" in e.value for e in at.error)
    assert not [w for w in at.text_input if w.key == "serving_url"]


def test_hosted_picks_from_the_allowlist_only(monkeypatch):
    monkeypatch.setenv("KVVIZ_HOSTED", "1")
    monkeypatch.setenv("KVVIZ_SERVE_ALLOW", "http://127.0.0.1:1,http://127.0.0.1:2/v1")
    monkeypatch.setenv("KVVIZ_SERVE_API_KEY", "sk-NEVER-SHOWN")
    at = _page()
    at.run()
    assert not at.exception
    assert not [w for w in at.text_input if w.key == "serving_url"]  # no free-form URL
    assert at.selectbox(key="serving_url").options == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    assert not [w for w in at.text_input if w.key == "serving_api_key"]  # the deployment's key, no field
    everything = " ".join(str(e.value) for e in [*at.caption, *at.markdown, *at.error, *at.info])
    assert "NEVER-SHOWN" not in everything
    at.button[0].click().run()
    assert any("cannot reach http://127.0.0.1:1" in e.value for e in at.error)
    assert "NEVER-SHOWN" not in " ".join(e.value for e in at.error)


def test_not_openai_server_message_in_korean(tmp_path):
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    class Handler(SimpleHTTPRequestHandler):
        def __init__(self, *a, **kw):
            super().__init__(*a, directory=str(tmp_path), **kw)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        at = _page("ko")
        at.run()
        at.text_input(key="serving_url").set_value(f"http://127.0.0.1:{httpd.server_address[1]}").run()
        at.button[0].click().run()
        assert not at.exception
        assert any("OpenAI 호환 서버처럼 응답하지 않습니다" in e.value for e in at.error)
    finally:
        httpd.shutdown()


def test_roofline_bound_beside_a_known_shape():
    """Issue 15: beside the measurements, kvviz's own bound for the same shape on the GPU the user names."""
    from kvviz.engine.loading import load_backend
    from kvviz.kv.hardware import HARDWARE
    from kvviz.kv.roofline import Roofline

    at = _page()
    at.session_state["serving_conn"] = {"url": "http://127.0.0.1:8080", "models": ["kvviz-tiny"], "engine": "llama.cpp",
                                   "block_size": None}  # what a connection to the exported model leaves behind
    at.run()
    assert not at.exception, at.exception
    assert all(s.key != "serving_gpu" for s in at.selectbox)  # llama-server does not report its KV dtype: no bound yet
    at.selectbox(key="serving_kv_dtype_kvviz-tiny").set_value("float16").run()
    at.selectbox(key="serving_gpu").set_value("L4").run()
    n = int(at.number_input(key="serving_prompt").value + at.number_input(key="serving_max_tokens").value // 2)
    bound = Roofline(load_backend("tiny").spec, HARDWARE["L4"], kv_dtype="float16").decode_bound(batch=1, n_context=n)
    assert any(f"TPOT ≥ **{bound.seconds * 1e3:.3g} ms**" in c.value and "on L4" in c.value for c in at.caption)


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_an_unknown_model_shape_is_unknown_until_picked(lang):
    """A served model kvviz cannot place shows no KV bytes (never a default shape); picking the preset it runs
    gives that preset's bytes per token and bound, said to come from the pick."""
    from kvviz.i18n import t
    from kvviz.kv.formula import kv_footprint
    from kvviz.kv.presets import PRESETS

    at = _page(lang)
    at.session_state["serving_conn"] = {"url": "http://127.0.0.1:8080", "models": ["my-finetune"], "engine": "vllm",
                                   "block_size": 16, "kv_dtype": None}  # vLLM with --kv-cache-dtype auto
    at.run()
    assert not at.exception, at.exception
    shape = at.selectbox(key="serving_shape_my-finetune")
    assert shape.value is None and list(shape.options)[0] == "Llama-2-7B"  # the presets only: nothing was found
    assert all(s.key != "serving_gpu" for s in at.selectbox)  # no bound for an unknown shape
    assert any(t("serving.kv_unknown", lang, model="my-finetune") == c.value for c in at.caption)
    shape.set_value("Mistral-7B").run()
    assert any(t("serving.kv_dtype_unknown", lang, shape="Mistral-7B") == c.value for c in at.caption)
    at.selectbox(key="serving_kv_dtype_my-finetune").set_value("bfloat16").run()
    per_token = kv_footprint(PRESETS["Mistral-7B"], 1, 1, "bfloat16").per_token
    assert per_token == 2 * 32 * 8 * 128 * 2  # 2 (K, V) · 32 layers · 8 KV heads · d_head 128 · 2 bytes
    assert any(f"{per_token:,} B" in c.value and "Mistral-7B" in c.value for c in at.caption)
    assert any(s.key == "serving_gpu" for s in at.selectbox)  # the bound, for the picked shape
