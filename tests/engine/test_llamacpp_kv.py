"""kvviz's KV formula against the KV buffer llama.cpp allocates: llama-server is started once per configuration
(SmolLM2's own GGUF and the shipped model exported as GGUF; several -c, -np, unified or not, f16/q8_0/q4_0) and its
start-up log read; kvviz.kv.llamacpp's cells and kvviz.kv.formula's bytes must equal it to the log's precision."""
from dataclasses import replace

import pytest

from kvviz.engine import fetch
from kvviz.engine.export import export_gguf
from kvviz.engine.loading import load_backend
from kvviz.engine.shape import fetched_spec, shipped_spec
from kvviz.errors import InputError
from kvviz.kv.formats import KV_DTYPES
from kvviz.kv.formula import KVSpec, kv_footprint
from kvviz.kv.llamacpp import llamacpp_cells, llamacpp_kv
from kvviz.serving.llamacpp import KVCacheLog, kv_cache_log

MIB = 2**20


def test_block_formats_are_ggmls():
    # ggml/src/ggml-common.h: block_q8_0 = fp16 d + 32 int8 (34 B), block_q4_0 = fp16 d + 16 B of nibbles (18 B)
    assert KV_DTYPES["q8_0"].vector_bytes(32) == 34 and KV_DTYPES["q4_0"].vector_bytes(32) == 18
    assert KV_DTYPES["q8_0"].vector_bytes(128) == 4 * 34 and KV_DTYPES["q4_0"].vector_bytes(64) == 2 * 18
    with pytest.raises(InputError, match="not whole blocks"):  # d_head 24: llama.cpp refuses, see the server test
        kv_footprint(KVSpec(4, 4, 2, 24), 10, 1, "q8_0")


@pytest.mark.parametrize("n_ctx, n_par, unified, expected", [
    (4096, 2, False, (4096, 2048, 2)),  # the issue's run
    (1000, 3, False, (1536, 512, 3)),  # 1000 → 1024; 1024/3 = 341 → 512 per stream; n_ctx becomes 3 · 512
    (1000, 3, True, (1024, 1024, 1)),  # unified: one stream of all cells
    (100, 1, False, (256, 256, 1)),
    (0, 2, False, (8192, 4096, 2)),  # 0: the model's n_ctx_train (8192 here)
])
def test_cells_as_llama_context_pads_them(n_ctx, n_par, unified, expected):
    assert llamacpp_cells(n_ctx, n_par, unified=unified, n_ctx_train=8192) == expected


def test_issue_log_reproduced_without_a_server():
    # "llama_kv_cache: size = 47.81 MiB (2048 cells, 30 layers, 2/2 seqs), K (q8_0): 23.91 MiB, V (q8_0): 23.91 MiB"
    kv = llamacpp_kv(KVSpec(30, 9, 3, 64, max_context=8192), 4096, 2, "q8_0")
    assert (kv.cells, kv.n_streams) == (2048, 2)
    assert kv.k_bytes == kv.v_bytes == 30 * 2 * 2048 * 3 * 2 * 34  # layers · streams · cells · heads · blocks · 34
    assert (round(kv.total_bytes / MIB, 2), round(kv.k_bytes / MIB, 2)) == (47.81, 23.91)


def test_differences_read_to_the_logs_precision():
    kv = llamacpp_kv(KVSpec(30, 9, 3, 64, max_context=8192), 4096, 2, "q8_0")
    log = KVCacheLog(n_ctx=4096, cells=2048, n_layers=30, n_seq_max=2, n_streams=2, type_k="q8_0", type_v="q8_0",
                     total_mib=47.81, k_mib=23.91, v_mib=23.91, buffer_mib=47.81)  # the issue's log line
    assert log.differences(kv) == []
    more = log.differences(replace(kv, k_bytes=kv.k_bytes + 10 * 2**10))  # 10 KiB more: 23.9160 MiB prints 23.92
    assert more == ["size MiB: logged 47.81, kvviz 47.82", "K MiB: logged 23.91, kvviz 23.92",
                    "buffer MiB: logged 47.81, kvviz 47.82"]
    assert log.differences(replace(kv, cells=1024)) == ["cells: logged 2048, kvviz 1024"]


def test_bad_llamacpp_inputs():
    spec = KVSpec(30, 9, 3, 64, max_context=8192)
    with pytest.raises(InputError, match="unknown KV dtype q5_1"):
        llamacpp_kv(spec, 4096, 2, "q5_1")
    with pytest.raises(InputError):
        llamacpp_cells(4096, 0)
    with pytest.raises(InputError, match="llama.cpp's MLA cache"):
        llamacpp_kv(KVSpec(4, 4, 4, 64, kv_lora_rank=128, qk_rope_head_dim=32), 4096, 1)


# ---- against the real server ------------------------------------------------------------------------------
needs_server = pytest.mark.llama_server  # waits for a build in progress, else skips (tests/conftest.py)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    backend = load_backend("tiny", device="cpu")
    return export_gguf(backend.model, backend.tokenizer, tmp_path_factory.mktemp("gguf") / "kvviz-tiny.gguf",
                       name="kvviz-tiny")


def assert_log_is_the_formula(log: KVCacheLog | str, spec: KVSpec, n_ctx: int, n_par: int, cache_type: str,
                              unified: bool) -> None:
    assert isinstance(log, KVCacheLog), log
    assert log.n_layers == spec.n_layers
    assert log.differences(llamacpp_kv(spec, n_ctx, n_par, cache_type, unified=unified)) == []


SMOLLM2_RUNS = [  # (-c, -np, cache type, unified)
    (4096, 2, "q8_0", False),  # the issue's run
    (2048, 1, "f16", False),
    (1000, 3, "q4_0", False),  # padded per stream to 512 cells
    (3000, 4, "f16", True),  # one unified stream of 3072 cells
]


@needs_server
@pytest.mark.parametrize("n_ctx, n_par, cache_type, unified", SMOLLM2_RUNS)
def test_smollm2_kv_buffer_equals_the_formula(smollm2_dir, n_ctx, n_par, cache_type, unified):
    log = kv_cache_log(fetch.gguf_path("smollm2"), ctx_size=n_ctx, n_parallel=n_par, cache_type=cache_type,
                       unified=unified)
    assert_log_is_the_formula(log, fetched_spec("smollm2"), n_ctx, n_par, cache_type, unified)


@needs_server
@pytest.mark.parametrize("n_ctx, n_par, unified", [(2048, 4, False), (1000, 3, False), (512, 2, True)])
def test_tiny_kv_buffer_equals_the_formula(tiny_gguf, n_ctx, n_par, unified):
    log = kv_cache_log(tiny_gguf, ctx_size=n_ctx, n_parallel=n_par, cache_type="f16", unified=unified)
    assert_log_is_the_formula(log, shipped_spec(), n_ctx, n_par, "f16", unified)


@needs_server
@pytest.mark.parametrize("cache_type", ["q8_0", "q4_0"])
def test_block_formats_refused_for_the_tiny_head_by_both(tiny_gguf, cache_type):
    """The shipped model's d_head 24 is not whole 32-value blocks: llama.cpp will not start, kvviz will not size it."""
    spec = shipped_spec()
    assert spec.d_head % 32
    refused = kv_cache_log(tiny_gguf, ctx_size=512, n_parallel=1, cache_type=cache_type)
    assert refused == f"cache type {cache_type} with block size 32 does not divide n_embd_head_k={spec.d_head}"
    with pytest.raises(InputError, match="not whole blocks"):
        llamacpp_kv(spec, 512, 1, cache_type)
