"""What the Moving the Cache page computes, without streamlit: the chunk sizes a context allows, the requests' and
tiers' tables from a real OffloadDemo, the break-even per link, the handoff's timeline and the per-rank calculator."""
import pytest

from kvviz.engine.config import DecoderConfig
from kvviz.engine.loading import load_backend, random_backend
from kvviz.engine.offload.serve import SCRIPT, OffloadDemo, tier_costs
from kvviz.errors import InputError
from kvviz.i18n import t
from kvviz.kv.hardware import HARDWARE, LINKS
from kvviz.kv.presets import PRESETS
from kvviz.kv.transfer import LoadVsRecompute, handoff_bytes
from kvviz.lessons import moving
from kvviz.units import format_binary

needs_server = pytest.mark.llama_server  # waits for a build in progress, else skips (tests/conftest.py)
SHAPE = DecoderConfig(n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_ff=128, vocab_size=300, max_seq_len=100)


@pytest.fixture(scope="module")
def small():
    return random_backend(SHAPE, seed=3)


@pytest.fixture(scope="module")
def demo(small, tmp_path_factory):
    d = OffloadDemo(small, tmp_path_factory.mktemp("offload") / "store", chunk_size=16, repeats=1)
    for _ in range(3):  # first, shared, changed
        d.advance()
    return d


def test_chunk_sizes_are_those_whose_prompts_fit_the_context(small, tmp_path):
    assert moving.chunk_sizes(100) == [16, 32]  # 64: 2·64 + 16 + 4 > 100
    assert moving.chunk_sizes(2048) == list(moving.CHUNK_SIZES)
    assert moving.chunk_sizes(20) == [16]  # none fits: the smallest, and the demo says why
    d = OffloadDemo(small, tmp_path / "a", chunk_size=32, repeats=1)
    assert max(len(d.prompt(i)) for i in range(len(SCRIPT))) + 1 < SHAPE.max_seq_len
    with pytest.raises(InputError, match="chunk"):
        OffloadDemo(small, tmp_path / "b", chunk_size=64, repeats=1)


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_request_rows_say_where_each_token_came_from(demo, lang):
    rows = moving.request_rows(demo.results, lang)

    def column(name: str) -> list:
        return [r[t(f"moving.col_{name}", lang)] for r in rows]

    assert column("request") == [f"{i}. {t('moving.kind_' + k, lang)}" for i, (k, _, _) in enumerate(SCRIPT[:3], 1)]
    assert column("memory") == [0, 32, 16] and column("disk") == [0, 0, 0]
    assert column("computed") == [p - m for p, m in zip(column("prompt"), column("memory"), strict=True)]
    # the changed prompt (token 24, in the chunk 16..31): computed from 16
    assert column("why")[2] == t("moving.reason_prompt_changed", lang, token=16, changed_at=24, tier="", request="?")
    assert column("why")[2] == moving.reason_text(demo.results[2]["miss_reason"], lang)
    assert column("bytes")[1] == 2 * demo.chunk_bytes and column("recompute")[0] == "—"
    equal = t("moving.equal", lang, diff="", tol="").split("(")[0]
    assert all(v.startswith(equal) for v in column("logits"))


def test_tier_rows_state_the_measured_ratio(small, tmp_path):
    costs = tier_costs(small, tmp_path, n_chunks=2, chunk_size=16, repeats=1)
    rows = moving.tier_rows(costs, "en")
    assert [r["tier"] for r in rows] == ["CPU memory", "disk"]
    assert [r["tokens"] for r in rows] == [32, 32]
    assert rows[0]["bytes on disk"] == "—" and int(rows[1]["bytes on disk"].replace(",", "")) > costs[1].bytes
    assert [r["load ÷ recompute"] for r in rows] == [f"{c.load_s.median / c.recompute_s.median:.3f}" for c in costs]


def test_break_even_per_link():
    spec, hw = PRESETS["Llama-3.1-8B"], HARDWARE["H100 SXM"]
    curves, even = moving.break_even(spec, hw, list(LINKS), "bfloat16", 1, spec.max_context)
    assert even["local NVMe (PCIe 4.0 x4)"] == 5136 and even["100 Gb/s network"] == 1
    assert all(c[-1]["tokens"] == spec.max_context for c in curves.values())
    nvme = LoadVsRecompute(spec, hw, LINKS["local NVMe (PCIe 4.0 x4)"])
    assert nvme.loading_wins(5136) and not nvme.loading_wins(5135)
    rows = {r["link"]: r["loading wins from"] for r in moving.break_even_rows(even, spec.max_context, "en")}
    assert rows["local NVMe (PCIe 4.0 x4)"] == "5,136" and rows["100 Gb/s network"] == "from the first token"
    old = PRESETS["Llama-2-7B"]  # MHA: recomputing still wins over 100 Gb/s at its whole context
    _, even = moving.break_even(old, hw, ["100 Gb/s network"], "bfloat16", 1, old.max_context)
    assert moving.break_even_rows(even, old.max_context, "en")[0]["loading wins from"] == "never within 4,096 tokens"
    assert moving.link_sources(["PCIe 4.0 x16"]) == f"- **PCIe 4.0 x16**: {LINKS['PCIe 4.0 x16'].bandwidth_source}"
    with pytest.raises(InputError):
        moving.break_even(spec, hw, ["PCIe 4.0 x16"], "bfloat16", 3, 100)  # 8 KV heads do not split over 3


def test_calculator_per_rank_and_in_all():
    spec = PRESETS["Llama-3.1-70B"]
    calc = handoff_bytes(spec, 64, "bfloat16", 16)
    line = moving.calc_line(spec.name, calc, "en")
    # 64 tokens · 80 layers · 2 · 1 KV head · 128 · 2 bytes per rank; 16 ranks, each a copy of one of 8 heads.
    assert "2.50 MiB per rank (1 KV head each), 40.00 MiB in all" in line and "own copy" in line
    rows = {r["link"]: r for r in moving.calc_rows(calc, "en")}
    assert set(rows) == set(LINKS)
    net = rows["100 Gb/s network"]
    assert net["each rank on its own link (ms)"] == f"{2.5 * 2**20 / 12.5e9 * 1e3:.3f}"
    assert net["all ranks over one link (ms)"] == f"{40 * 2**20 / 12.5e9 * 1e3:.3f}"


def test_handoff_over_kvviz_workers_as_the_timeline_draws_it(tmp_path):
    tiny = load_backend("tiny", device="cpu")
    r = moving.run_handoff("kvviz", tiny, "tiny", 24, 3, tmp_path)
    assert r["tokens_equal_single"] and r["prompt_tokens"] == 24
    steps = moving.handoff_steps({"kvviz": r}, "en")
    name = f"{t('moving.engine_kvviz', 'en')} · {format_binary(r['bytes'])}"
    assert [(s["engine"], s["phase"]) for s in steps] == [(name, p) for p in moving.PHASES]
    assert [s["seconds"] for s in steps] == [r["prefill_s"], r["save_s"], r["transfer_s"], r["restore_s"],
                                             r["first_decode_s"]]
    assert [s["text"] for s in steps] == ["", "", format_binary(r["bytes"]), "", ""]
    row = moving.handoff_rows({"kvviz": r}, "ko")[0]
    assert row[t("moving.col_tokens_equal", "ko")] == t("moving.yes", "ko")
    assert row[t("moving.col_bytes", "ko")] == r["formula_bytes"] == r["kv_bytes"]


@needs_server
def test_handoff_over_two_llama_servers_exports_the_shipped_model(tmp_path):
    tiny = load_backend("tiny", device="cpu")
    r = moving.run_handoff("llamacpp", tiny, "tiny", 24, 3, tmp_path)
    assert r["gguf"] == str(tmp_path / "tiny.gguf") and r["tokens_equal_single"] and r["prompt_tokens"] == 24
    both = {"kvviz": moving.run_handoff("kvviz", tiny, "tiny", 24, 3, tmp_path), "llamacpp": r}
    steps = moving.handoff_steps(both, "en")
    assert [s["seconds"] for s in steps[5:]] == [r["prefill_s"], r["save_s"], r["transfer_s"], r["restore_s"],
                                                 r["decode_prompt_s"]]  # llama.cpp's decode: its prompt's last token
    assert [row["engine"] for row in moving.handoff_rows(both, "en")] == [t("moving.engine_kvviz", "en"),
                                                                         t("moving.engine_llamacpp", "en")]
