"""The break-even calculator and the handoff bytes (issue 25), with the links' sources."""
import pytest

from kvviz.errors import InputError
from kvviz.kv.formula import KVSpec, kv_footprint
from kvviz.kv.hardware import HARDWARE, LINKS
from kvviz.kv.presets import get_preset
from kvviz.kv.roofline import Roofline
from kvviz.kv.transfer import LoadVsRecompute, handoff_bytes, length_grid


@pytest.mark.parametrize("spec", [KVSpec(5, 8, 2, 16), KVSpec(6, 4, 4, 8, sliding_window=7, n_sliding_layers=2),
                                  KVSpec(3, 4, 1, 8, sliding_window=2, n_sliding_layers=3)])
def test_keys_attended_closed_form_equals_the_count(spec):
    """The closed form (fast for a 128k prefill) against counting each query's keys one by one."""
    for n_past in (0, 1, 5, 9):
        for n_new in (0, 1, 2, 7, 30):
            full = spec.n_layers - spec.n_sliding_layers
            count = full * sum(n_past + i + 1 for i in range(n_new)) + spec.n_sliding_layers * sum(
                min(n_past + i + 1, spec.sliding_window) for i in range(n_new))
            assert spec.keys_attended(n_past, n_new) == count


def test_links_carry_their_sources_and_pcie_is_its_own_arithmetic():
    assert len(LINKS) == 7 and all(link.bandwidth_source.count("http") >= 1 for link in LINKS.values())
    # 16 GT/s and 32 GT/s per lane, 16 lanes, 128b/130b encoding, bits to bytes.
    assert LINKS["PCIe 4.0 x16"].bandwidth_bytes_per_s == pytest.approx(16e9 * 16 * 128 / 130 / 8, rel=1e-4)
    assert LINKS["PCIe 5.0 x16"].bandwidth_bytes_per_s == pytest.approx(32e9 * 16 * 128 / 130 / 8, rel=1e-4)
    assert LINKS["NVLink 4 (H100/H200)"].bandwidth_bytes_per_s == 900e9 / 2  # one direction of 900 GB/s
    for gbit in (100, 200, 400):
        assert LINKS[f"{gbit} Gb/s network"].bandwidth_bytes_per_s == gbit * 1e9 / 8


def test_handoff_bytes_per_rank_split_the_kv_heads_as_vllm_does():
    llama70 = get_preset("Llama-3.1-70B")  # 8 KV heads
    one = handoff_bytes(llama70, 8192)
    assert one.per_rank == one.total == kv_footprint(llama70, 8192).total == 8192 * 80 * 2 * 8 * 128 * 2
    eight = handoff_bytes(llama70, 8192, tp=8)
    assert eight.kv_heads_per_rank == 1 and not eight.replicated
    assert eight.per_rank * 8 == eight.total == one.total
    sixteen = handoff_bytes(llama70, 8192, tp=16)  # more ranks than KV heads: each rank keeps a copy
    assert sixteen.replicated and sixteen.per_rank == eight.per_rank and sixteen.total == 2 * one.total
    link = LINKS["400 Gb/s network"]
    assert eight.seconds(link) == eight.per_rank / 50e9
    assert eight.seconds(link, shared_link=True) == one.total / 50e9
    mla = handoff_bytes(get_preset("DeepSeek-V3"), 1000, tp=8)  # the latent is whole on every rank
    assert mla.replicated and mla.per_rank == kv_footprint(get_preset("DeepSeek-V3"), 1000).total


@pytest.mark.parametrize(("model", "gpu", "link", "expect"), [
    ("Llama-3.1-8B", "H100 SXM", "local NVMe (PCIe 4.0 x4)", "finite"),
    ("Llama-2-7B", "H100 SXM", "100 Gb/s network", None),
    ("Llama-3.1-70B", "H100 SXM", "100 Gb/s network", 1),
])
def test_break_even_is_where_loading_starts_to_win(model, gpu, link, expect):
    spec = get_preset(model)
    case = LoadVsRecompute(spec, HARDWARE[gpu], LINKS[link])
    n = case.break_even_tokens(spec.max_context)
    if expect is None:
        assert n is None and not case.loading_wins(spec.max_context)
        return
    if expect == 1:
        assert n == 1
    else:
        assert 1 < n < spec.max_context
        assert not case.loading_wins(n - 1)
    assert all(case.loading_wins(m) for m in range(n, min(n + 2000, spec.max_context), 97))
    assert all(case.loading_wins(m) for m in length_grid(spec.max_context) if m >= n)
    # Recompute is the roofline's compute bound: the prefill FLOPs at the datasheet rate.
    roof = Roofline(spec, HARDWARE[gpu])
    assert case.recompute_s(4096) == roof.prefill_flops(4096) / HARDWARE[gpu].peak_flops
    assert case.load_s(4096) == kv_footprint(spec, 4096).total / LINKS[link].bandwidth_bytes_per_s


def test_tensor_parallel_ranks_each_compute_and_move_their_share():
    spec = get_preset("Llama-3.1-8B")
    one = LoadVsRecompute(spec, HARDWARE["H100 SXM"], LINKS["local NVMe (PCIe 4.0 x4)"])
    four = LoadVsRecompute(spec, HARDWARE["H100 SXM"], LINKS["local NVMe (PCIe 4.0 x4)"], tp=4)
    assert four.recompute_s(1000) == pytest.approx(one.recompute_s(1000) / 4)
    assert four.load_s(1000) == pytest.approx(one.load_s(1000) / 4)
    assert four.break_even_tokens(spec.max_context) == one.break_even_tokens(spec.max_context)


def test_unknowns_are_refused_not_guessed():
    with pytest.raises(InputError):  # a MoE reads only its experts: the roofline's FLOPs are unknown
        LoadVsRecompute(get_preset("DeepSeek-V3"), HARDWARE["H100 SXM"], LINKS["PCIe 5.0 x16"])
    with pytest.raises(InputError):
        LoadVsRecompute(KVSpec(2, 4, 2, 8), HARDWARE["H100 SXM"], LINKS["PCIe 5.0 x16"])
    assert length_grid(1) == [1] and length_grid(10)[-1] == 10
