"""Property-based tests (hypothesis) over the memory formula, the hardware presets and the CLI's parsing."""
import math
import re

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kvviz.cli import main
from kvviz.errors import InputError
from kvviz.kv.formats import KV_DTYPES, kv_dtype
from kvviz.kv.formula import KVSpec, kv_footprint
from kvviz.kv.hardware import HARDWARE, Hardware
from kvviz.units import format_binary
from tests.kv.kvref import textbook_bytes

sizes = st.integers(1, 4096)
bytes_per_elem = st.sampled_from(sorted({f.data_bytes for f in KV_DTYPES.values()}))
# formats without per-group scales: their bytes are the textbook product exactly
plain_dtype = st.sampled_from([name for name, f in KV_DTYPES.items() if not f.group_size])
factor = st.integers(1, 64)


# ---- memory -----------------------------------------------------------------------------------------
@given(b=sizes, layers=sizes, n=st.integers(0, 1 << 20), h=sizes, d=sizes, e=bytes_per_elem, k=factor,
       which=st.integers(0, 4))
def test_formula_is_linear_in_each_factor(b, layers, n, h, d, e, k, which):
    args = [b, layers, n, h, 2 * d]  # an even head: a whole byte of 2-bit values (kivi2) per K and V pair
    scaled = list(args)
    scaled[which] *= k
    assert textbook_bytes(*scaled, e) == k * textbook_bytes(*args, e)
    # exact integer bytes at any size (e·4 is whole for every dtype: int4 is half a byte, kivi2 a quarter)
    assert textbook_bytes(*args, e) == 2 * b * layers * n * h * 2 * d * int(e * 4) // 4


@given(b=sizes, layers=sizes, n=st.integers(0, 1 << 20), h=sizes, d=sizes, dtype=plain_dtype)
def test_intermediates_multiply_out(b, layers, n, h, d, dtype):
    m = kv_footprint(KVSpec(layers, h, h, d), n, b, dtype)
    e = KV_DTYPES[dtype].data_bytes
    assert m.per_token_per_layer == 2 * h * d * int(e * 2) // 2
    assert m.per_token == m.per_token_per_layer * layers
    assert m.per_request == m.per_token * n
    assert m.total == m.per_request * b == textbook_bytes(b, layers, n, h, d, e)


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


@given(bad=bad_size, which=st.integers(0, 4))
def test_bad_sizes_raise_input_error_and_nothing_else(bad, which):
    batch, n_layers, n_tokens, n_kv_heads, d_head = args = [1, 2, 3, 4, 8]
    if which == 2 and isinstance(bad, int) and not isinstance(bad, bool) and bad == 0:
        return  # an empty cache (n_tokens = 0) is valid
    args[which] = bad
    batch, n_layers, n_tokens, n_kv_heads, d_head = args
    with pytest.raises(InputError):
        kv_footprint(KVSpec(n_layers, 4, n_kv_heads, d_head), n_tokens, batch, "bfloat16")


@given(st.text(max_size=12).filter(lambda s: s.removeprefix("torch.") not in KV_DTYPES))
def test_unknown_kv_dtype_is_an_input_error(name):
    with pytest.raises(InputError, match="choose one of"):
        kv_dtype(name)


# ---- hardware presets --------------------------------------------------------------------------------
@given(st.sampled_from(sorted(HARDWARE)), st.floats(0.1, 10))
def test_presets_are_consistent(name, k):
    hw = HARDWARE[name]
    assert hw.name == name
    assert hw.memory_bytes is None or (isinstance(hw.memory_bytes, int) and hw.memory_bytes >= 10**9)
    assert hw.bandwidth_source and hw.flops_source and (hw.memory_bytes is None or hw.memory_source)
    assert hw.bandwidth_bytes_per_s > 0 and hw.peak_flops > 0
    assert math.isclose(hw.ridge_flops_per_byte * hw.bandwidth_bytes_per_s, hw.peak_flops)
    assert 1 <= hw.ridge_flops_per_byte <= 1000  # FLOP per byte: every real accelerator sits in this band
    faster = Hardware(name, hw.bandwidth_bytes_per_s * k, hw.peak_flops, hw.memory_bytes)
    assert math.isclose(faster.ridge_flops_per_byte, hw.ridge_flops_per_byte / k)  # more bandwidth, lower ridge


def test_preset_names_are_unique_and_frozen():
    hw = next(iter(HARDWARE.values()))
    with pytest.raises(AttributeError):
        hw.peak_flops = 0  # presets are shared by every page: nobody may edit one in place


# ---- the CLI's argument parsing -------------------------------------------------------------------------
FLAGS = ["--prompt", "--model", "--max-new-tokens", "--no-cache", "--dtype", "--device", "--seed", "--temperature",
         "--top-k", "--batch", "--json", "--layers", "--heads", "--kv-heads", "--d-head", "--d-model", "--d-ff",
         "--vocab-size", "--max-seq-len", "--preset", "--kv-dtype", "--tokens", "--head-dim", "--config", "--gpu",
         "--gpu-memory-gib", "--tp", "--gpu-memory-utilization", "--max-model-len", "--reserve-gib", "--params"]
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
@given(command=st.sampled_from(["generate", "memory", "capacity", "presets", "export-hf", "", "bogus"]),
       rest=st.lists(TOKENS, max_size=8))
@example(command="generate", rest=["--prompt", "x", "--model", "a\nb"])  # a newline in a name: still one line
@example(command="generate", rest=["--prompt", "🙂 한국어", "--model", "random"])
@example(command="memory", rest=["--layers", "nan", "--kv-heads", "1", "--head-dim", "1"])
@example(command="capacity", rest=["--preset", "DeepSeek-V3", "--gpu", "H200", "--tp", "3"])
@example(command="capacity", rest=["--preset", "Llama-3.1-8B", "--gpu-memory-gib", "0.5"])
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


# ---- one description, one answer: every path that reports KV bytes agrees ----------------------------------
@st.composite
def kv_specs(draw):
    layers, d_head = draw(st.integers(1, 96)), draw(st.sampled_from([16, 64, 128, 256]))
    kv = draw(st.integers(1, 16))
    group = draw(st.sampled_from([1, 2, 4, 8]))
    kind = draw(st.sampled_from(["plain", "window", "mla"]))
    extra = {}
    if kind == "window":
        extra = dict(sliding_window=draw(st.integers(2, 4096)), n_sliding_layers=draw(st.integers(1, layers)))
    elif kind == "mla":
        extra = dict(kv_lora_rank=draw(st.sampled_from([128, 512])), qk_rope_head_dim=draw(st.sampled_from([32, 64])))
    return KVSpec(layers, kv * group, kv, d_head, n_params=draw(st.integers(10**6, 10**11)), params_source="given",
                  d_model=kv * group * d_head, vocab_size=32000, **extra)


@settings(max_examples=80, deadline=None)
@given(spec=kv_specs(), dtype=st.sampled_from(list(KV_DTYPES)), n=st.integers(1, 70_000))
def test_every_path_reports_the_same_bytes(spec, dtype, n):
    from kvviz.app import hosted
    from kvviz.kv.capacity import plan_capacity
    from kvviz.kv.roofline import Roofline

    fmt = KV_DTYPES[dtype]
    if fmt.whole_blocks and spec.vectors_per_token_layer[1] % fmt.group_size:
        with pytest.raises(InputError, match="not whole blocks"):  # llama.cpp refuses it: so does every path
            kv_footprint(spec, 1, 1, dtype)
        return
    per_token = kv_footprint(spec, 1, 1, dtype).per_token  # the Memory page's figure
    total = kv_footprint(spec, n, 1, dtype).total
    plan = plan_capacity(spec, 200 * 2**30, max_model_len=n, kv_dtype_name=dtype, reserve_bytes=0)
    assert plan.kv_bytes_per_token == per_token  # the planner
    roof = Roofline(spec, HARDWARE["H100 SXM"], kv_dtype=dtype)
    assert roof.kv_bytes(1) == per_token and roof.kv_bytes(n) == total  # the roofline
    caps = hosted.HostedCaps(kv_budget_bytes=10**15)
    assert hosted.check_kv_budget(caps, spec, batch=1, n_tokens=n, dtype=dtype) == total  # the hosted budget


@settings(max_examples=12, deadline=None)
@given(kv=st.sampled_from([1, 2, 4]), dtype=st.sampled_from(["float32", "bfloat16", "float16"]))
def test_engine_live_bytes_are_the_formula(kv, dtype):
    from kvviz.engine.config import DecoderConfig
    from kvviz.engine.generation import Generation
    from kvviz.engine.loading import random_backend

    cfg = DecoderConfig(n_layers=2, d_model=64, n_heads=4, n_kv_heads=kv, d_ff=96, vocab_size=300, max_seq_len=64)
    backend = random_backend(cfg, dtype=dtype)
    event = Generation(backend, max_new_tokens=3).run([5, 6, 7, 8])[-1]
    n = event.position + 1
    assert event.live_bytes == event.formula_bytes == kv_footprint(backend.spec, n, 1, dtype).total
