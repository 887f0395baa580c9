"""Reusing Past K/V and Home under AppTest: real generations, numbers read from the Plotly specs."""
import json
import re
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from kvviz.engine.config import DecoderConfig
from tests.pages.pagetest import grid_html

ROOT = Path(__file__).resolve().parents[2]
PAGE = "pages/1_Reusing_Past_KV.py"  # reached from the entrypoint, so sidebar links resolve
HOME = str(ROOT / "app.py")
SMALL = DecoderConfig(n_layers=3, d_model=64, n_heads=4, n_kv_heads=2, d_ff=96, vocab_size=256, max_seq_len=128)
PROMPT = "Hello KV"  # 8 byte tokens with the custom-shape model's ByteTokenizer


def _page(lang: str = "en", *, lecture: bool = False, shape: DecoderConfig = SMALL) -> AppTest:
    at = AppTest.from_file(HOME, default_timeout=60)
    at.query_params["lang"] = lang
    if lecture:
        at.query_params["lecture"] = "1"
    at.session_state["kv_model"] = "random"
    at.session_state["kv_shape"] = shape
    at.run()
    at.switch_page(PAGE).run()
    return at


def _chart(at: AppTest, key: str) -> dict:
    charts = [c for c in at.get("plotly_chart") if c.proto.id.endswith("-" + key) or c.proto.id == key]
    assert charts, f"no chart {key}"
    return json.loads(charts[0].proto.spec)


def click_step(at: AppTest, clicks: int = 1) -> AppTest:
    """The stepper sends its log of presses (a browser sends the same): `clicks` more Step presses at once."""
    served = at.session_state["reuse_served"]
    at.session_state["reuse_stepper"] = {"events": [[served + i + 1, "step"] for i in range(clicks)]}
    return at.run()


def open_tab(at: AppTest, name: str) -> AppTest:
    """Picks a tab in the tab row (its value is the tab's name, whatever the language)."""
    at.session_state["reuse_tab"] = name
    return at.run()


def _grid_rows(at: AppTest) -> dict[str, list[tuple[str, int, int]]]:
    """The cache grid's rows as drawn: row name -> [(kind, first position, last position)]."""
    html = grid_html(at)[0]
    rows = {}
    for name, body in re.findall(r'data-row="([^"]+)" data-cached="\d+"(.*?)(?=class="kv-row"|$)', html, flags=re.S):
        rows[name] = [(k, int(a), int(b)) for k, a, b in
                      re.findall(r'data-kind="(\w+)" data-from="(\d+)" data-to="(\d+)"', body)]
    return rows


def _prefill_and_step(at: AppTest, steps: int) -> AppTest:
    at.text_area(key="_w_reuse_prompt").set_value(PROMPT)
    at.button(key="reuse_btn_prefill").click().run()
    for _ in range(steps):
        click_step(at)
    assert not at.exception
    return at


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_home_and_page_run(lang):
    home = AppTest.from_file(HOME, default_timeout=60)
    home.query_params["lang"] = lang
    home.run()
    assert not home.exception
    assert len(home.get("graphviz_chart")) == 1
    at = _page(lang)
    assert not at.exception
    assert at.title[0].value == ("과거 K/V 재사용" if lang == "ko" else "Reusing Past K/V")
    _prefill_and_step(at, 1)


def test_prefill_then_three_steps():
    at = _prefill_and_step(_page(), 3)
    gen = at.session_state["reuse_gen"]
    n_prompt = len(PROMPT.encode())
    # Engine convention: the prefill pass already emits token 1, so prefill + 3 steps = 4 generated
    # tokens, and the cache holds the prompt plus the 3 tokens fed back in (the newest is not fed yet).
    assert gen.n_generated == 4
    assert [len(e.cache_lengths) for e in gen.events] == [SMALL.n_layers] * 4

    rows = _grid_rows(at)
    assert list(rows) == [f"L{i} {kv}" for i in range(SMALL.n_layers) for kv in "KV"]  # every row labelled
    for row in rows.values():  # prefill grey, steps 1-2 blue, the newest step orange: one new column per step
        assert row == [("prefill", 0, n_prompt - 1), ("step", n_prompt, n_prompt + 1),
                       ("newest", n_prompt + 2, n_prompt + 2)]

    # Bytes: live bytes measured from the tensors equal the formula after every pass.
    assert not at.get("plotly_chart")  # the default tab draws no Plotly chart: a step redraws HTML only
    open_tab(at, "bytes")
    by = _chart(at, "reuse_bytes")["data"]
    live, formula = by[1]["y"], by[2]["y"]
    assert live == formula
    assert live[-1] == 2 * SMALL.n_layers * (n_prompt + 3) * SMALL.n_kv_heads * 16 * 4

    open_tab(at, "attention")
    attn = _chart(at, "reuse_attn")["data"][0]
    rows = np.array(attn["z"], dtype=float)
    assert rows.shape == (SMALL.n_heads, n_prompt + 3)
    np.testing.assert_allclose(rows.sum(axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(rows, gen.events[-1].attention[0], atol=1e-6)  # layer 0 is shown first

    # The K heatmap shows the real cached keys of layer 0, KV head 0: one row per cached position.
    open_tab(at, "values")
    kv = np.array(_chart(at, "reuse_kv")["data"][0]["z"], dtype=float)
    k, _ = gen.backend.layer_kv(gen.cache, 0)
    np.testing.assert_allclose(kv, k[0, 0].numpy(), atol=1e-6)

    # Cumulative attention scores counted from the passes lie on the analytic curves.
    open_tab(at, "work")
    cum = _chart(at, "reuse_cum_work")["data"]
    lh = SMALL.n_layers * SMALL.n_heads
    assert cum[3]["x"] == [n_prompt, n_prompt + 1, n_prompt + 2, n_prompt + 3]
    assert cum[3]["y"][-1] == lh * (n_prompt + 3) * (n_prompt + 4) // 2
    assert cum[2]["y"][-1] == lh * sum(t * (t + 1) // 2 for t in range(n_prompt, n_prompt + 4))

    # The live equivalence check: cached and recomputed logits agree and pick the same token.
    assert not at.session_state["reuse_checks"]  # not computed while its tab is closed
    open_tab(at, "check")
    delta, tok_cached, tok_fresh = next(iter(at.session_state["reuse_checks"].values()))
    assert delta < 1e-4 and tok_cached == tok_fresh
    assert any("within the rounding tolerance" in s.value for s in at.success)  # a verdict states its tolerance


def test_layer_switch_uses_the_captured_rows():
    at = _prefill_and_step(_page(), 2)
    gen = at.session_state["reuse_gen"]
    n_events = len(gen.events)
    open_tab(at, "attention")
    at.selectbox(key="reuse_attn_layer").set_value(2).run()
    rows = np.array(_chart(at, "reuse_attn")["data"][0]["z"], dtype=float)
    np.testing.assert_allclose(rows, gen.events[-1].attention[2], atol=1e-6)
    assert len(at.session_state["reuse_gen"].events) == n_events  # switching layers runs no model pass


def test_invalid_head_split_keeps_the_generation():
    at = _prefill_and_step(_page(), 2)
    gen = at.session_state["reuse_gen"]
    tokens = list(gen.token_ids)
    at.number_input(key="_w_kv_heads").set_value(3).run()  # 4 query heads cannot split over 3 KV heads
    assert not at.exception
    assert any("divisible" in e.value for e in at.error)
    assert at.session_state["reuse_gen"] is gen and gen.token_ids == tokens
    assert not at.warning  # the model did not change, so the generation is still current
    click_step(at)
    assert gen.n_generated == 4


def test_new_model_marks_the_generation_stale():
    at = _prefill_and_step(_page(), 1)
    gen = at.session_state["reuse_gen"]
    tokens = list(gen.token_ids)
    at.number_input(key="_w_layers").set_value(2).run()
    assert not at.exception
    assert any("the custom shape changed" in w.value for w in at.warning)
    served = at.session_state["reuse_served"]
    click_step(at)  # a Step on a stale generation does nothing
    assert at.session_state["reuse_gen"].token_ids == tokens and at.session_state["reuse_served"] == served + 1
    assert at.session_state["reuse_gen"].token_ids == tokens
    at.button(key="reuse_btn_prefill").click().run()  # a new generation on the new model: current again
    assert not at.warning
    fresh = at.session_state["reuse_gen"]
    assert fresh is not gen and len(fresh.events[0].cache_lengths) == 2
    click_step(at)
    assert fresh.n_generated == 2
    at.button(key="reuse_btn_reset").click().run()
    assert at.session_state["reuse_gen"] is None and not at.warning


def test_empty_prompt_is_a_clear_message():
    at = _page("ko")
    at.text_area(key="_w_reuse_prompt").set_value("   ")
    at.button(key="reuse_btn_prefill").click().run()
    assert not at.exception
    assert at.error and "프롬프트" in at.error[0].value
    assert at.session_state["reuse_gen"] is None


def test_rapid_clicks_each_give_one_token():
    """Clicks that reach the server together (Streamlit would merge st.button triggers) are all served."""
    at = _prefill_and_step(_page(), 0)
    gen = at.session_state["reuse_gen"]
    click_step(at, 7)  # seven clicks arrived before the server picked up the first
    assert gen.n_generated == 1 + 7
    click_step(at, 1)
    assert gen.n_generated == 1 + 8
    at.run()  # a rerun without a click (a widget change, a timer) serves nothing
    assert gen.n_generated == 1 + 8


def test_clicks_past_the_end_are_dropped():
    at = _page()
    at.number_input(key="_w_reuse_max_new").set_value(3).run()
    _prefill_and_step(at, 0)
    click_step(at, 10)
    gen = at.session_state["reuse_gen"]
    assert gen.done and gen.n_generated == 3
    assert at.session_state["reuse_served"] == at.session_state["reuse_stepper"]["events"][-1][0]


def test_prompt_length_and_speed_survive_another_page():
    at = _page()
    at.text_area(key="_w_reuse_prompt").set_value("Keep me")
    at.number_input(key="_w_reuse_max_new").set_value(7)
    at.slider(key="_w_reuse_speed").set_value(6.0)
    at.button(key="reuse_btn_prefill").click().run()
    at.switch_page("pages/3_Memory_Footprint.py").run()
    at.switch_page(PAGE).run()
    assert not at.exception
    assert at.text_area(key="_w_reuse_prompt").value == "Keep me"
    assert at.number_input(key="_w_reuse_max_new").value == 7
    assert at.slider(key="_w_reuse_speed").value == 6.0
    gen = at.session_state["reuse_gen"]
    assert gen.max_new_tokens == 7 and len(gen.prompt_ids) == len(b"Keep me")  # the box matches the tokens


def test_sidebar_change_while_playing_stops_and_says_what_changed():
    at = _prefill_and_step(_page(), 1)
    at.button(key="reuse_btn_play").click().run()
    assert at.session_state["reuse_playing"]
    at.selectbox(key="_w_kv_dtype").set_value("bfloat16").run()
    assert not at.exception
    assert not at.session_state["reuse_playing"]
    assert [b.label for b in at.button if b.key in ("reuse_btn_play", "reuse_btn_pause")] == ["Play"]
    assert not at.button(key="reuse_btn_prefill").disabled
    warning = " ".join(w.value for w in at.warning)
    assert "the dtype changed" in warning and "the model" not in warning.split("changed")[0]
    at.selectbox(key="_w_kv_dtype").set_value("float32").run()  # back to the generation's settings
    assert not at.session_state["reuse_playing"]  # no replay by itself
    assert not at.warning


def test_says_how_many_new_tokens_fit_in_the_context():
    at = _page()
    at.text_area(key="_w_reuse_prompt").set_value("x" * (SMALL.max_seq_len - 5))
    at.number_input(key="_w_reuse_max_new").set_value(24)
    at.button(key="reuse_btn_prefill").click().run()
    assert at.session_state["reuse_gen"].max_new_tokens == 5
    assert any("The context holds 128 tokens: only 5 new tokens fit" in w.value for w in at.warning)


@pytest.fixture
def hosted(monkeypatch):
    monkeypatch.setenv("KVVIZ_HOSTED", "1")
    monkeypatch.setenv("KVVIZ_MAX_NEW_TOKENS", "16")


def test_hosted_new_token_cap(hosted):
    at = _page()
    at.number_input(key="_w_reuse_max_new").set_value(100).run()  # past the cap: refused, with the cap named
    assert any("1 … 16" in e.value for e in at.error)
    at.text_area(key="_w_reuse_prompt").set_value(PROMPT)
    at.button(key="reuse_btn_prefill").click().run()
    assert not at.exception
    assert at.session_state["reuse_gen"].max_new_tokens == 16  # the default, 24, lowered to the cap


def test_hosted_kv_budget_refuses_before_prefill(hosted, monkeypatch):
    monkeypatch.setenv("KVVIZ_KV_BUDGET_BYTES", "2000")
    at = _page()
    at.text_area(key="_w_reuse_prompt").set_value(PROMPT)
    at.button(key="reuse_btn_prefill").click().run()
    assert not at.exception
    assert at.session_state["reuse_gen"] is None
    assert any("KV" in e.value for e in at.error)


def test_lecture_mode_keeps_settings_behind_one_button():
    at = AppTest.from_file(HOME, default_timeout=60)
    at.query_params["lecture"] = "1"
    at.session_state["kv_model"] = "random"
    at.session_state["kv_shape"] = SMALL
    at.run()
    at.switch_page(PAGE).run()
    _prefill_and_step(at, 2)
    assert not at.exception
    assert at.session_state["reuse_gen"].n_generated == 3


def press(at: AppTest, *actions: str) -> AppTest:
    """Presses that reached the server together, in the order they were made (the stepper's log)."""
    served = at.session_state["reuse_served"]
    at.session_state["reuse_stepper"] = {"events": [[served + i + 1, a] for i, a in enumerate(actions)]}
    return at.run()


@pytest.mark.parametrize("presses, generated", [
    (("prefill", "reset", "prefill", "reset", "step"), None),  # issue 29 #6: ended with a fresh generation
    (("prefill", "step", "step"), 3),
    (("prefill", "reset", "prefill", "step"), 2),
    (("reset", "prefill", "step", "reset", "prefill"), 1),
])
def test_fast_presses_are_applied_once_each_in_order(presses, generated):
    at = _page()
    at.text_area(key="_w_reuse_prompt").set_value(PROMPT).run()
    press(at, *presses)
    assert not at.exception
    gen = at.session_state["reuse_gen"]
    assert (gen.n_generated if gen is not None else None) == generated
    at.run()  # a rerun without a press (a widget change, a timer) applies nothing again
    gen = at.session_state["reuse_gen"]
    assert (gen.n_generated if gen is not None else None) == generated


def _row(at: AppTest) -> dict:
    """The row of buttons as drawn: Prefill, Play and Download, disabled or not (Pause drawn instead of Play)."""
    def disabled(key: str) -> bool | None:
        buttons = [b for b in at.button if b.key == key]
        return buttons[0].disabled if buttons else None

    download = [b for b in at.get("download_button") if b.proto.id.endswith("-reuse_download")][0].proto
    return {"prefill": disabled("reuse_btn_prefill"), "play": disabled("reuse_btn_play"),
            "pause": disabled("reuse_btn_pause"), "download": download.disabled}


def test_the_row_shows_what_the_served_presses_left():
    """The row of buttons shows what the presses served in the same run left: Prefill, a Step, the run's last step
    (Play has nothing left to play), Reset, Play (Pause, no Prefill). Each press comes through the stepper's log,
    as a browser sends it, and is served in the live view's fragment before the row is drawn."""
    at = _page()
    at.text_area(key="_w_reuse_prompt").set_value(PROMPT).run()
    at.number_input(key="_w_reuse_max_new").set_value(3).run()
    assert _row(at) == {"prefill": False, "play": True, "pause": None, "download": True}
    press(at, "prefill")
    assert _row(at) == {"prefill": False, "play": False, "pause": None, "download": False}
    press(at, "step")
    assert at.session_state["reuse_gen"].n_generated == 2 and not at.session_state["reuse_gen"].done
    assert _row(at) == {"prefill": False, "play": False, "pause": None, "download": False}
    press(at, "step")  # the last of 3 tokens: Play has nothing left to play
    assert at.session_state["reuse_gen"].done
    assert _row(at) == {"prefill": False, "play": True, "pause": None, "download": False}
    press(at, "reset")
    assert at.session_state["reuse_gen"] is None
    assert _row(at) == {"prefill": False, "play": True, "pause": None, "download": True}
    press(at, "prefill", "play")
    assert _row(at)["prefill"] is True and _row(at)["pause"] is False  # playing: Pause, and no Prefill
    assert not at.exception


def test_play_and_pause_keys_in_order():
    at = _prefill_and_step(_page(), 0)
    press(at, "toggle_play", "toggle_play", "step")  # P, P, Space: played, paused, then one step
    assert not at.session_state["reuse_playing"] and at.session_state["reuse_gen"].n_generated == 2
    press(at, "play")
    playing_at = at.session_state["reuse_gen"].n_generated
    assert at.session_state["reuse_playing"] and playing_at >= 3  # Play's first beat
    at.session_state["reuse_play_next"] = float("inf")  # no beat due in the next run
    press(at, "step")  # Step is off while playing
    assert at.session_state["reuse_gen"].n_generated == playing_at


def test_a_late_play_tick_shows_one_token_and_says_it_is_behind():
    """Issue 29 #6: Play under load jumped 7 tokens in one redraw with no notice."""
    import time

    at = _prefill_and_step(_page(), 0)
    press(at, "play")
    before = at.session_state["reuse_gen"].n_generated  # Play's first beat (a slow machine may add one more)
    at.session_state["reuse_play_next"] = time.monotonic() - 2.0  # ticks stalled for 2 s (8 beats at 4/s)
    at.run()
    assert at.session_state["reuse_gen"].n_generated == before + 1  # one token, not a burst
    assert any("falling behind" in w.value for w in at.warning)


DEEP = DecoderConfig(n_layers=30, d_model=64, n_heads=4, n_kv_heads=2, d_ff=96, vocab_size=256, max_seq_len=128)


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_lecture_grid_of_a_deep_model_shows_the_layers_that_fit_and_says_which(lang):
    """Issue 38.5: in lecture mode the Cache growth idea drew all 60 K/V rows of a 30-layer model (SmolLM2: 1,903 px
    on a 720 px screen). Now the layers charts.decode.grid_layers chooses, at full height, the title naming them; on a
    page every layer, the title unchanged."""
    from kvviz.i18n import t

    at = _prefill_and_step(_page(lang, lecture=True, shape=DEEP), 2)
    rows = _grid_rows(at)
    assert list(rows) == [f"L{i} {kv}" for i in (0, 10, 19, 29) for kv in ("K", "V")]
    n = at.session_state["reuse_gen"].events[-1].cache_lengths[0]
    html = grid_html(at)[0]
    title = t("common.grid_layers", lang, title=t("reuse.growth_chart", lang, n=n), shown="0, 10, 19, 29", n=30)
    assert f">{title}</div>" in html
    assert all(segs[-1][2] == n - 1 for segs in rows.values())


def _download(at: AppTest, key: str):  # noqa: ANN202 - the download button's proto
    buttons = [b for b in at.get("download_button") if b.proto.id.endswith("-" + key) or b.proto.id == key]
    assert buttons, f"no download button {key}"
    return buttons[0].proto


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_download_this_run_waits_for_a_run_then_offers_it(lang):
    from kvviz.i18n import t

    at = _page(lang)
    before = _download(at, "reuse_download")
    assert before.disabled and before.help == t("run_html.download_none", lang)
    assert before.label == t("run_html.download", lang)
    _prefill_and_step(at, 2)
    after = _download(at, "reuse_download")
    assert not after.disabled and after.help == t("run_html.download_help", lang)
    assert at.session_state["reuse_gen"].n_generated == 3  # drawing the button ran nothing


def test_download_this_run_in_lecture_mode_is_the_icon_alone():
    from kvviz.app.widgets import COMPACT_LABEL
    from kvviz.i18n import t

    at = _prefill_and_step(_page("ko", lecture=True), 1)
    button = _download(at, "reuse_download")
    assert button.label == COMPACT_LABEL and not button.disabled
    assert button.help.startswith(t("run_html.download", "ko"))  # the tooltip names it


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_steps_run_on_kvvizs_c_step_and_equal_pytorchs(lang):
    """Where kvviz's C decode step runs the model, the page's decode steps run on it (its prefill on PyTorch), the
    status line says so, and the run is PyTorch's: the same tokens, logits and attention rows within float32's
    rounding tolerance, the same cached K/V."""
    import torch

    from kvviz.engine import tolerance
    from kvviz.engine.generation import Generation
    from kvviz.engine.kernels import step as step_kernel
    from kvviz.i18n import t

    at = _page(lang)
    at = _prefill_and_step(at, 3)
    gen = at.session_state["reuse_gen"]
    if (why := step_kernel.why_not(gen.backend.model)) is not None:
        pytest.skip(why)
    assert [e.compiled_mode for e in gen.events] == [None, "kernels", "kernels", "kernels"]
    status = next(c.value for c in at.caption if t("reuse.on_c_step", lang) in c.value)
    assert f"{gen.events[-1].seconds * 1e3:.1f} ms" in status  # the step it names is the one timed

    plain = Generation(gen.backend, max_new_tokens=gen.max_new_tokens, capture_attention=True)
    plain.prefill(PROMPT)
    for _ in range(3):
        plain.step()
    assert [e.compiled_mode for e in plain.events] == [None] * 4
    assert plain.generated == gen.generated
    d_model = gen.backend.spec.d_model
    diff = float((gen.last_logits - plain.last_logits).abs().max())
    assert tolerance.agreement(diff, torch.float32, tolerance.magnitude(plain.last_logits), d_model).within
    for ours, theirs in zip(gen.events[-1].attention, plain.events[-1].attention, strict=True):
        np.testing.assert_allclose(ours, theirs, atol=1e-5)
    for layer in range(gen.backend.spec.n_layers):
        for a, b in zip(gen.backend.layer_kv(gen.cache, layer), gen.backend.layer_kv(plain.cache, layer),
                        strict=True):
            assert tolerance.agreement(float((a - b).abs().max()), torch.float32, tolerance.magnitude(b),
                                       d_model).within


def test_a_model_the_c_step_cannot_run_steps_on_pytorch_and_says_nothing_of_it():
    """A head size off the C step's vector width (12): the steps run on PyTorch's forward, as every other page's,
    and the status line names no C step."""
    from kvviz.i18n import t

    shape = DecoderConfig(n_layers=2, d_model=48, n_heads=4, n_kv_heads=2, d_ff=96, vocab_size=256, max_seq_len=64)
    at = _prefill_and_step(_page(shape=shape), 2)
    gen = at.session_state["reuse_gen"]
    assert [e.compiled_mode for e in gen.events] == [None] * 3 and gen.n_generated == 3
    assert not [c for c in at.caption if t("reuse.on_c_step", "en") in c.value]
