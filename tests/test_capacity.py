"""Capacity planner and paged-vs-contiguous allocation on hand-computed cases."""

import pytest

from kvviz.errors import InputError
from kvviz.kv.capacity import compare_allocation, parse_lengths, plan_capacity
from kvviz.kv.formula import kv_footprint, weight_bytes
from kvviz.kv.hardware import HARDWARE
from kvviz.kv.presets import get_preset


def test_plan_by_hand():
    # 80 GB · 0.5 = 40 GB usable; 16 GB of weights leave 24e9 B; 128 KiB per token; 4096-token requests
    plan = plan_capacity(80 * 10**9, 0.5, 16 * 10**9, 131072, 4096)
    assert plan.usable_bytes == 40 * 10**9
    assert plan.kv_budget_bytes == 24 * 10**9
    assert plan.max_tokens == 183_105  # 24e9 / 131072 = 183105.47
    assert plan.bytes_per_request == 536_870_912  # 4096 · 128 KiB = 512 MiB
    assert plan.max_requests == 44  # 24e9 / 512 MiB = 44.7
    assert plan.weights_fit


def test_plan_llama31_8b_on_h100():
    spec = get_preset("Llama-3.1-8B")
    weights = weight_bytes(spec.n_params, "bfloat16")
    fp = kv_footprint(spec.shape, 8192, 1, "bfloat16")
    plan = plan_capacity(HARDWARE["H100 SXM"].memory_bytes, 0.9, weights, fp.per_token, 8192, fp.per_request)
    # 72e9 − 16,060,522,496 = 55,939,477,504 B; / 131072 = 426,784.3; / 1 GiB per 8192-token request = 52.1
    assert plan.kv_budget_bytes == 55_939_477_504
    assert plan.max_tokens == 426_784
    assert plan.max_requests == 52


def test_weights_that_do_not_fit():
    plan = plan_capacity(24 * 10**9, 0.9, 140 * 10**9, 1024, 100)
    assert not plan.weights_fit and plan.kv_budget_bytes == 0 and plan.max_tokens == 0 and plan.max_requests == 0


@pytest.mark.parametrize(
    "args",
    [
        (80e9, 0, 1, 1, 1),
        (80e9, 1.5, 1, 1, 1),
        (0, 0.9, 1, 1, 1),
        (80e9, 0.9, -1, 1, 1),
        (80e9, 0.9, 1, 0, 1),
        (80e9, 0.9, 1, 1, 0),
    ],
)
def test_plan_rejects_bad_inputs(args):
    with pytest.raises(InputError):
        plan_capacity(*args)


def test_paged_fragmentation_by_hand():
    # max length 128, blocks of 16, 10 B per token
    alloc = compare_allocation([1, 16, 17, 100], max_len=128, kv_bytes_per_token=10, block_size=16)
    assert alloc.live_bytes == 134 * 10
    assert alloc.contiguous_bytes == 4 * 128 * 10 and alloc.contiguous_waste_bytes == 5120 - 1340
    assert alloc.paged_blocks == 1 + 1 + 2 + 7  # ceil(n / 16)
    assert alloc.paged_bytes == 11 * 16 * 10 and alloc.paged_waste_bytes == 1760 - 1340
    assert alloc.contiguous_waste_fraction == pytest.approx(3780 / 5120)
    assert alloc.paged_waste_fraction == pytest.approx(420 / 1760)
    assert alloc.to_dict()["paged_waste_fraction"] == pytest.approx(420 / 1760)
    # a 12,800 B budget: 12800 / (128 · 10) = 10 max-length reservations; 12800 / (1760 / 4) = 29.09 → 29 paged
    assert alloc.requests_that_fit(12_800) == (10, 29)


def test_paged_waste_is_under_one_block_per_request():
    lengths = list(range(1, 300, 7))
    alloc = compare_allocation(lengths, 512, 3, 16)
    assert 0 <= alloc.paged_waste_bytes <= len(lengths) * 15 * 3
    assert alloc.paged_bytes <= alloc.contiguous_bytes


@pytest.mark.parametrize("lengths, words", [([], "at least one"), ([0], "outside"), ([129], "outside")])
def test_allocation_rejects_bad_lengths(lengths, words):
    with pytest.raises(InputError, match=words):
        compare_allocation(lengths, 128, 10)


def test_parse_lengths():
    assert parse_lengths("100, 2000 37") == [100, 2000, 37]
    with pytest.raises(InputError, match="whole numbers"):
        parse_lengths("10, ten")
