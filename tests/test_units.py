"""Byte sizes as shown everywhere: half-up rounding on the exact value, digit grouping, PiB, decimal beside binary."""
import pytest

from kvviz.lessons import quiz
from kvviz.units import format_binary, format_decimal


@pytest.mark.parametrize("n_bytes, text", [
    (0, "0 B"), (1, "1 B"), (0.5, "0.5 B"), (1000, "1,000 B"), (1023, "1,023 B"), (1024, "1.00 KiB"),
    (1152, "1.13 KiB"),  # 1.125 exactly: half-up, where float formatting gives 1.12
    (64 * 1024**3, "64.00 GiB"), (1024**5, "1.00 PiB"),
    (15258789062.5 * 1024**4, "14,901,161.19 PiB"),  # grouped, in PiB, never "15258789062.50 TiB"
    (-2048, "-2.00 KiB"),
])
def test_format_binary(n_bytes, text):
    assert format_binary(n_bytes) == text


@pytest.mark.parametrize("n_bytes, text", [
    (999, "999 B"), (1125, "1.13 kB"), (64 * 1024**3, "68.72 GB"), (2 * 10**15, "2.00 PB"),
    (10**21, "1,000,000.00 PB"),
])
def test_format_decimal(n_bytes, text):
    assert format_decimal(n_bytes) == text


def test_check_quotes_gb_as_the_calculator_rounds():
    total = quiz.cache_size_memory().total
    assert format_decimal(total) == "68.72 GB" == quiz.explain_values()["total_gb"]


@pytest.mark.parametrize("args, kwargs, text", [
    ((0.01234,), {"scale": 1e3, "unit": "ms"}, "12.3 ms"), ((None,), {"scale": 1e3, "unit": "ms"}, "—"),
    ((2.0, 2), {}, "2.00"), ((None, 2), {}, "—"), ((0.0,), {}, "0.0"), ((0.00049, 2), {"scale": 1e3}, "0.49"),
])
def test_format_fixed_says_unknown_for_none(args, kwargs, text):
    from kvviz.units import format_fixed

    assert format_fixed(*args, **kwargs) == text
