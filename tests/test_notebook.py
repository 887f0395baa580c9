"""kvviz.Session (kvviz/notebook.py): the run's numbers are the engine's and the CLI's, its figures are the ones
Reusing Past K/V draws for the same run and carry the measured bytes and attention, and the example notebook runs
end to end offline in a real kernel (nbclient)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from kvviz import Session
from kvviz.charts.memory import GIB
from kvviz.engine import tolerance
from kvviz.errors import InputError
from kvviz.i18n import t
from kvviz.kv.formula import kv_footprint
from tests.pages.pagetest import grid_html

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def run():
    s = Session("tiny", max_new_tokens=8)
    s.prefill(PROMPT)
    s.step(4)
    return s


def test_import_kvviz_stays_torch_free_until_a_session_is_asked_for():
    probe = "import sys, kvviz; a = 'torch' in sys.modules; kvviz.Session; print(a, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["False", "True"], out.stderr[-2000:]


def test_tokens_and_bytes_equal_kvviz_generate_json():
    cli = subprocess.run([sys.executable, "-m", "kvviz", "generate", "--model", "tiny", "--prompt", PROMPT,
                          "--max-new-tokens", "8", "--device", "cpu", "--json"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0, cli.stderr[-2000:]
    expected = json.loads(cli.stdout)
    got = Session("tiny", max_new_tokens=8).run(PROMPT)
    for key in ("model", "prompt_tokens", "token_ids", "text", "cache_live_bytes", "cache_allocated_bytes",
                "formula_bytes"):
        assert got[key] == expected[key], key
    assert len(got["steps"]) == len(expected["step_seconds"]) == 8
    json.dumps(got)  # plain data: lists, numbers, strings


def test_each_pass_caches_what_the_formula_says(run):
    n = run.numbers()
    spec = run.backend.spec
    assert [s["phase"] for s in n["steps"]] == ["prefill"] + ["decode"] * 4
    for step in n["steps"]:
        cached = step["position"] + 1
        assert step["cache_lengths"] == [cached] * spec.n_layers
        assert step["cache_live_bytes"] == step["formula_bytes"] == kv_footprint(spec, cached, 1, "float32").total
    fig = run.cache_bytes()
    live, formula = fig.data[1], fig.data[2]
    assert list(live.y) == [s["cache_live_bytes"] for s in n["steps"]]
    assert list(formula.y) == [kv_footprint(spec, s["position"] + 1, 1, "float32").total for s in n["steps"]]
    assert list(fig.data[0].y) == [run.backend.cache_allocated_bytes(run.gen.cache)] * 5  # preallocated once


def test_cache_grid_says_which_pass_wrote_each_position(run):
    grid = run.cache_grid()
    n_prompt = run.numbers()["prompt_tokens"]
    assert grid.written == [[0] * n_prompt + [1, 2, 3, 4]] * run.backend.spec.n_layers
    assert f'data-positions="{n_prompt + 4}"' in grid._repr_html_()
    assert grid.html.count('class="kv-row"') == 2 * run.backend.spec.n_layers  # K and V per layer


def test_attention_row_is_the_newest_querys_row_recomputed_without_a_cache(run):
    ids = run.gen.token_ids[:-1]  # the newest token is emitted, not yet fed
    fresh = run.backend.forward(torch.tensor([ids]), None, capture_attention=True, all_logits=False).attentions
    for layer in range(run.backend.spec.n_layers):
        z = np.array(run.attention_row(layer).data[0].z)
        want = fresh[layer][0, :, -1].float().numpy()
        assert z.shape == (run.backend.spec.n_heads, len(ids))
        # probabilities (≤ 1) after sums of d_model products: the rounding the tolerance module allows
        tol = tolerance.rounding_tolerance(torch.float32, 1.0, run.backend.spec.d_model)
        assert np.abs(z - want).max() <= tol
        np.testing.assert_allclose(z.sum(axis=1), 1.0, atol=tol)  # each head's row is a distribution


def test_the_figures_are_the_ones_reusing_past_kv_draws_for_the_same_run():
    from streamlit.testing.v1 import AppTest

    from tests.pages.test_reuse import HOME, PAGE, click_step, open_tab

    at = AppTest.from_file(HOME, default_timeout=120).run()
    at.switch_page(PAGE).run()  # the default model (tiny) and 24 new tokens
    at.text_area(key="_w_reuse_prompt").set_value(PROMPT)
    at.button(key="reuse_btn_prefill").click().run()
    click_step(at, 3)
    assert not at.exception
    s = Session("tiny", max_new_tokens=24)
    s.prefill(PROMPT)
    s.step(3)
    assert s.numbers()["token_ids"] == at.session_state["reuse_gen"].generated[0]
    assert grid_html(at)[0] == s.cache_grid().html

    def page_chart(key: str) -> dict:
        return next(json.loads(c.proto.spec) for c in at.get("plotly_chart") if c.proto.id.endswith("-" + key))

    open_tab(at, "bytes")
    page, mine = page_chart("reuse_bytes"), json.loads(s.cache_bytes().to_json())
    assert page["data"] == mine["data"] and page["layout"]["title"] == mine["layout"]["title"]
    open_tab(at, "attention")  # layer 0 first, as attention_row's default
    page, mine = page_chart("reuse_attn"), json.loads(s.attention_row().to_json())
    assert page["layout"]["title"] == mine["layout"]["title"] and page["layout"]["shapes"] == mine["layout"]["shapes"]
    tol = tolerance.rounding_tolerance(torch.float32, 1.0, s.backend.spec.d_model)
    assert np.abs(np.array(page["data"][0]["z"]) - np.array(mine["data"][0]["z"])).max() <= tol


def test_memory_curves_are_the_formula(run):
    spec = run.backend.spec
    fig = run.memory(batch=2)
    curves = [d for d in fig.data if d.mode == "lines"][:-1]  # the last line is the weights
    assert [c.name for c in curves] == [t("memory.batch_label").format(batch=b) for b in (1, 2, 8, 32)]
    for batch, c in zip((1, 2, 8, 32), curves, strict=True):
        assert list(c.y) == [kv_footprint(spec, x, batch, "float32").total / GIB for x in c.x]
    assert run.numbers()["steps"][-1]["position"] + 1 in curves[0].x  # this run's context is on the axis


def test_korean_titles_and_one_line_errors():
    s = Session("tiny", max_new_tokens=2, lang="ko")
    with pytest.raises(InputError) as exc:
        s.cache_grid()
    assert exc.value.message("ko") == t("errors.prefill_first", "ko")
    s.prefill(PROMPT)
    assert s.cache_bytes().layout.title.text == t("reuse.bytes_chart", "ko")
    with pytest.raises(InputError) as exc:
        s.attention_row(layer=99)
    assert "99" in exc.value.message("ko") and "\n" not in str(exc.value)
    before = s.numbers()
    with pytest.raises(InputError) as exc:
        s.prefill("   ")
    assert exc.value.message("ko") == t("errors.empty_prompt", "ko")
    assert s.numbers() == before  # a refused prompt loses nothing
    s.step(5)  # a 2-token budget ends after one step
    assert s.done and s.numbers()["token_ids"] == s.gen.generated[0] and len(s.gen.generated[0]) == 2
    with pytest.raises(InputError, match="language"):
        Session("tiny", lang="fr")


def test_the_example_notebook_runs_end_to_end_offline():
    import nbclient
    import nbformat

    path = ROOT / "examples" / "kv_cache_walkthrough.ipynb"
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit it with outputs stripped"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    old = dict(os.environ)
    os.environ.update(env)  # the kernel inherits this process's environment
    try:
        nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                resources={"metadata": {"path": str(ROOT)}}).execute()
    finally:
        os.environ.clear()
        os.environ.update(old)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    checks = [o for o in outputs if o.output_type == "stream" and "checked:" in o.text]
    assert checks and all("True" in o.text and "False" not in o.text for o in checks), checks
    assert any("text/html" in o.get("data", {}) for o in outputs)  # the cache grid drew
    assert sum("application/vnd.plotly.v1+json" in o.get("data", {}) for o in outputs) >= 3
