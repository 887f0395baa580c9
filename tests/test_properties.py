"""Property-based tests (hypothesis) over the memory formula, the hardware presets and the CLI's parsing."""
import math
import re

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kvviz.cli import main
from kvviz.errors import InputError
from kvviz.kv.formula import KV_DTYPE_BYTES, dtype_bytes, kv_cache_bytes, kv_memory
from kvviz.kv.hardware import HARDWARE, Hardware
from kvviz.units import format_binary

sizes = st.integers(1, 4096)
bytes_per_elem = st.sampled_from(sorted(set(KV_DTYPE_BYTES.values())))
factor = st.integers(1, 64)


# ---- memory -----------------------------------------------------------------------------------------
@given(b=sizes, l=sizes, n=st.integers(0, 1 << 20), h=sizes, d=sizes, e=bytes_per_elem, k=factor,
       which=st.integers(0, 4))
def test_formula_is_linear_in_each_factor(b, l, n, h, d, e, k, which):
    args = [b, l, n, h, d]
    scaled = list(args)
    scaled[which] *= k
    assert kv_cache_bytes(*scaled, e) == k * kv_cache_bytes(*args, e)
    # exact integer bytes at any size (e·2 is whole for every dtype: int4 is half a byte)
    assert kv_cache_bytes(*args, e) == 2 * b * l * n * h * d * int(e * 2) // 2


@given(b=sizes, l=sizes, n=st.integers(0, 1 << 20), h=sizes, d=sizes, e=bytes_per_elem)
def test_intermediates_multiply_out(b, l, n, h, d, e):
    m = kv_memory(b, l, n, h, d, e)
    assert m.per_token_per_layer == 2 * h * d * int(e * 2) // 2
    assert m.per_token == m.per_token_per_layer * l
    assert m.per_request == m.per_token * n
    assert m.total == m.per_request * b == kv_cache_bytes(b, l, n, h, d, e)


UNITS = {"B": 0, "KiB": 1, "MiB": 2, "GiB": 3, "TiB": 4, "PiB": 5}


@given(st.integers(0, 1 << 60))
def test_format_binary_round_trips_within_rounding(n):
    text = format_binary(n)
    value, unit = re.fullmatch(r"(\d{1,3}(?:,\d\d\d)*(?:\.\d\d)?) (B|KiB|MiB|GiB|TiB|PiB)", text).groups()
    value = value.replace(",", "")
    scale = 1024 ** UNITS[unit]
    assert abs(float(value) * scale - n) <= 0.005 * scale + 0.5  # two decimals (whole bytes for B)
    if unit != "PiB":
        assert float(value) < 1024 or value == "1024.00"  # the largest unit under 1024, up to rounding
    if unit != "B":
        assert n >= scale  # never a smaller unit than the number warrants


bad_size = st.one_of(
    st.integers(max_value=0), st.floats(max_value=0), st.just(math.nan), st.just(math.inf), st.just(-math.inf),
    st.none(), st.text(max_size=5), st.booleans(),
)


@given(bad=bad_size, which=st.integers(0, 5))
def test_bad_sizes_raise_input_error_and_nothing_else(bad, which):
    args = [1, 2, 3, 4, 8, 2]
    if which == 2 and isinstance(bad, int) and not isinstance(bad, bool) and bad == 0:
        return  # an empty cache (n_tokens = 0) is valid
    args[which] = bad
    with pytest.raises(InputError):
        kv_cache_bytes(*args)
    with pytest.raises(InputError):
        kv_memory(*args)


@given(st.text(max_size=12).filter(lambda s: s not in KV_DTYPE_BYTES))
def test_unknown_kv_dtype_is_an_input_error(name):
    with pytest.raises(InputError, match="choose one of"):
        dtype_bytes(name)


# ---- hardware presets --------------------------------------------------------------------------------
@given(st.sampled_from(sorted(HARDWARE)), st.floats(0.1, 10))
def test_presets_are_consistent(name, k):
    hw = HARDWARE[name]
    assert hw.name == name
    assert isinstance(hw.memory_bytes, int) and hw.memory_bytes >= 10**9
    assert hw.bandwidth_bytes_per_s > 0 and hw.peak_flops > 0
    assert math.isclose(hw.ridge_flops_per_byte * hw.bandwidth_bytes_per_s, hw.peak_flops)
    assert 1 <= hw.ridge_flops_per_byte <= 1000  # FLOP per byte: every real accelerator sits in this band
    faster = Hardware(name, hw.memory_bytes, hw.bandwidth_bytes_per_s * k, hw.peak_flops)
    assert math.isclose(faster.ridge_flops_per_byte, hw.ridge_flops_per_byte / k)  # more bandwidth, lower ridge


def test_preset_names_are_unique_and_frozen():
    hw = next(iter(HARDWARE.values()))
    with pytest.raises(AttributeError):
        hw.peak_flops = 0  # presets are shared by every page: nobody may edit one in place


# ---- the CLI's argument parsing -------------------------------------------------------------------------
FLAGS = ["--prompt", "--model", "--max-new-tokens", "--no-cache", "--dtype", "--device", "--seed", "--temperature",
         "--top-k", "--batch", "--json", "--layers", "--heads", "--kv-heads", "--d-head", "--d-model", "--d-ff",
         "--vocab-size", "--max-seq-len", "--preset", "--kv-dtype", "--tokens", "--head-dim", "--config"]
VALUES = st.one_of(
    st.integers(-5, 300).map(str), st.floats(allow_nan=True).map(str),
    st.sampled_from(["float32", "bfloat16", "int3", "cuda", "mps", "auto", "cpu", "random", "tiny", "", " ", "한국어",
                     "🙂", "a\nb", "\x00", "../x", "org/model"]),
    st.text(max_size=8).filter(lambda s: not s.startswith("-")),  # "-h" would be --help, which exits by design
)
TOKENS = st.one_of(st.sampled_from(FLAGS), VALUES)
# generate runs a model: end its argv with a tiny shape so any valid combination finishes in milliseconds
SMALL = ["--max-new-tokens", "2", "--layers", "1", "--d-model", "32", "--heads", "2", "--kv-heads", "1",
         "--d-head", "16", "--d-ff", "32", "--vocab-size", "256", "--max-seq-len", "64"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(command=st.sampled_from(["generate", "memory", "presets", "export-hf", "", "bogus"]),
       rest=st.lists(TOKENS, max_size=8))
@example(command="generate", rest=["--prompt", "x", "--model", "a\nb"])  # a newline in a name: still one line
@example(command="generate", rest=["--prompt", "🙂 한국어", "--model", "random"])
@example(command="memory", rest=["--layers", "nan", "--kv-heads", "1", "--head-dim", "1"])
def test_cli_exits_0_or_2_with_one_line_errors(capsys, command, rest):
    argv = ([command] if command else []) + rest + (SMALL if command == "generate" else [])
    code = main(argv)
    out, err = capsys.readouterr()
    assert code in (0, 2)
    if code == 2:
        assert err.startswith("kvviz: error: ") and err.count("\n") == 1, err
    else:
        assert out and not err


def test_help_exits_zero(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0 and "generate" in capsys.readouterr().out
