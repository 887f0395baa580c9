"""A run exported as one HTML file carries the run's own numbers: read back out of the file, they equal what
`generate --json` printed for the same run (token ids, exact bytes, timings to the last bit), the attention rows the
engine captured (to the stated rounding), and a speculative and a paged run's events. Too large a run and a run that
never started are refused with a message in both languages, and the CLI refuses before it runs."""
import json

import numpy as np
import pytest

from kvviz.charts.run_html import MAX_ATTENTION_VALUES, check_size, decode_size, read_run, run_html, size_of
from kvviz.cli import main
from kvviz.engine.generation import Generation
from kvviz.engine.loading import load_backend
from kvviz.errors import InputError
from kvviz.lessons.run_record import ATTENTION_DIGITS, decode_record, paged_record, spec_record

# A prompt that holds the end of a script block: the embedded JSON must not end there.
PROMPT = "The cache </script><b>grows"


@pytest.fixture(scope="module")
def tiny():
    return load_backend("tiny", device="cpu")


def test_generate_html_holds_the_numbers_generate_json_printed(tmp_path, capsys):
    path = tmp_path / "run.html"
    assert main(["generate", "--prompt", PROMPT, "--max-new-tokens", "8", "--json", "--html", str(path)]) == 0
    printed = json.loads(capsys.readouterr().out)
    document = path.read_text(encoding="utf-8")
    run = read_run(document)
    for key in ("token_ids", "text", "prompt_tokens", "ttft_s", "tpot_s", "step_seconds", "cache_live_bytes",
                "cache_allocated_bytes", "formula_bytes", "use_cache"):
        assert run[key] == printed[key], key
    assert (run["model"]["name"], run["model"]["dtype"], run["model"]["device"]) == (
        printed["model"], printed["dtype"], printed["device"])
    # The prompt's "</script>" came back whole, and ends no block: every closing tag closes a script block.
    assert run["settings"]["prompt"] == PROMPT and document.count("</script>") == document.count("<script")
    # Every pass: its bytes and seconds as the run measured them, the formula's terms multiplying to its bytes.
    assert [s["seconds"] for s in run["steps"]] == printed["step_seconds"]
    for step in run["steps"]:
        f = step["formula"]
        assert f["batch"] * f["token_layers"] * f["per_token_per_layer"] == f["total"] == step["formula_bytes"]
        assert step["live_bytes"] == step["formula_bytes"]  # the shipped model's cache: no padding
    # The newest query's attention: per layer one row per query head over every position so far, each summing to 1.
    spec = run["model"]
    for step, rows in zip(run["steps"], run["attention"], strict=True):
        assert len(rows) == spec["n_layers"]
        a = np.asarray(rows)
        assert a.shape == (spec["n_layers"], spec["n_heads"], step["position"] + 1)
        assert np.allclose(a.sum(-1), 1, atol=spec["n_heads"] * 10.0 ** -ATTENTION_DIGITS * step["position"])
    # The drawn pieces say the same numbers: the last step's bytes line in the view block.
    view = json.loads(document.split('id="kvviz-view">', 1)[1].split("</script>", 1)[0])
    assert f"{printed['cache_live_bytes']:,} B" in view["frames"][-1]["html"]["bytes_text"]
    assert len(view["frames"]) == len(printed["step_seconds"])
    # Self-contained: Plotly inlined, no script or stylesheet loaded from elsewhere (the browser test runs it offline).
    assert "<script src" not in document and "<link" not in document and "Plotly" in document


def test_the_attention_in_the_file_is_the_engines_own(tiny):
    gen = Generation(tiny, max_new_tokens=5, capture_attention=True)
    gen.run("Past keys and values")
    document = run_html(decode_record(gen, {"prompt": "Past keys and values"}), "ko")
    assert '<html lang="ko">' in document  # a Korean file says it is Korean (WCAG 3.1.1)
    run = read_run(document)
    for event, rows in zip(gen.events, run["attention"], strict=True):
        for layer, a in enumerate(event.attention):
            assert np.array_equal(np.asarray(rows[layer]), a.round(ATTENTION_DIGITS))
    assert [s["token_id"] for s in run["steps"]] == gen.generated[0]
    assert [s["cache_lengths"] for s in run["steps"]] == [e.cache_lengths for e in gen.events]


def test_speculative_and_paged_runs_read_back(tiny):
    from kvviz.engine.paged.demo import shared_prefix_ids, suffix_ids
    from kvviz.engine.paged.scheduler import PagedEngine
    from kvviz.engine.spec.decoding import SpeculativeGeneration
    from kvviz.engine.spec.drafts import EarlyExitDraft

    spec = SpeculativeGeneration(tiny, EarlyExitDraft(2), k=3, max_new_tokens=10)
    spec.run("one two three one two three one two")
    run = read_run(run_html(spec_record(spec, {"method": "early-exit", "k": 3}), "en"))
    assert run["token_ids"] == spec.generated and run["shared_layers"] == 2
    for step, e in zip(run["steps"], spec.events, strict=True):
        assert (step["drafted"], step["accepted"], step["rolled_back"], step["peak_live_bytes"], step["live_bytes"],
                step["seconds"], step["verify_seconds"]) == (e.drafted, e.accepted, e.rolled_back, e.peak_live_bytes,
                                                              e.live_bytes, e.seconds, e.verify_seconds)
    engine = PagedEngine(tiny.model, 10, 8, record_views=True)
    for i in range(3):
        engine.add(shared_prefix_ids(tiny.tokenizer, 16) + suffix_ids(tiny.model.cfg.vocab_size, 4, i), 3, "shared")
    engine.run()
    run = read_run(run_html(paged_record(engine, {"block_size": 8}, model_name=tiny.spec.name), "ko"))
    assert [s["report"]["seconds"] for s in run["steps"]] == [r.seconds for r in engine.reports]
    assert [s["pool"]["used"] for s in run["steps"]] == [h.used for h in engine.history]
    # Step 0 admitted all three; the later two hit the first one's two full blocks of the shared prefix.
    first = run["steps"][0]["requests"]
    assert [r["cached_tokens"] for r in first] == [0, 16, 16]
    assert run["steps"][-1]["pool"]["used"] == 0


def test_a_run_that_never_started_is_refused_in_both_languages(tiny):
    with pytest.raises(InputError) as exc:
        decode_record(Generation(tiny, max_new_tokens=3))
    assert "prefill" in exc.value.message("en") and "프리필" in exc.value.message("ko")


def test_too_large_a_run_is_refused_before_it_runs(tiny, capsys, tmp_path):
    steps, values = decode_size(4, 8, 10, 600)
    assert (steps, values) == (600, 4 * 8 * (600 * 10 + 600 * 599 // 2))
    with pytest.raises(InputError) as exc:
        check_size(steps, values)
    assert f"{MAX_ATTENTION_VALUES:,}" in exc.value.message("en") and "너무 큽니다" in exc.value.message("ko")
    path = tmp_path / "big.html"
    code = main(["generate", "--prompt", "a long run", "--max-new-tokens", "600", "--json", "--html", str(path)])
    err = capsys.readouterr()
    assert code == 2 and not path.exists() and err.out == ""
    assert err.err.count("\n") == 1 and "too large" in err.err
    # The size a record reports is what it holds, and its prediction before the run matched it.
    gen = Generation(tiny, max_new_tokens=4, capture_attention=True)
    gen.run("Past keys and values")
    spec = tiny.spec
    assert size_of(decode_record(gen)) == decode_size(spec.n_layers, spec.n_heads, len(gen.prompt_ids), 4)


def test_a_file_that_cannot_be_written_loses_no_run(tmp_path, capsys):
    path = tmp_path / "no such folder" / "run.html"
    code = main(["generate", "--prompt", "Past keys", "--max-new-tokens", "3", "--json", "--html", str(path)])
    out = capsys.readouterr()
    assert code == 1 and not path.exists()
    assert len(json.loads(out.out)["token_ids"]) == 3  # the run's result, printed whole
    assert out.err.count("\n") == 1 and "--html" in out.err and "No such file" in out.err
