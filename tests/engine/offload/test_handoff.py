"""Prefill→decode handoff (issue 25): two kvviz worker processes over a loopback socket, two real llama-server
processes with slot save/restore, and the llama.cpp slot file read byte by byte against kvviz's formula."""
import json
import struct

import pytest

from kvviz.cli import main
from kvviz.engine.export import export_gguf
from kvviz.engine.loading import load_backend
from kvviz.engine.paged.demo import shared_prefix_ids
from kvviz.engine.shape import fetched_spec
from kvviz.kv.formula import kv_footprint
from kvviz.serving.llamacpp_state import MAGIC, SlotFileError, read_slot_file

CLI_KEYS = {"bytes", "formula_bytes", "save_s", "transfer_s", "restore_s", "tokens_equal_single", "kv_bytes",
            "header_bytes"}


@pytest.fixture(scope="module")
def tiny():
    return load_backend("tiny", device="cpu")


def test_kvviz_workers_hand_off_over_a_socket(capsys):
    """`handoff --engine kvviz --json`: the decode worker's tokens are the single process's, the bytes the formula's."""
    assert main(["handoff", "--engine", "kvviz", "--prompt-tokens", "40", "--new-tokens", "6", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert CLI_KEYS <= set(r)
    assert r["tokens_equal_single"] and r["tokens"] == r["single_tokens"] and len(r["tokens"]) == 6
    spec = load_backend("tiny", device="cpu").spec
    assert r["kv_bytes"] == r["formula_bytes"] == kv_footprint(spec, 40, 1, "float32").total == 40 * 4 * 2 * 2 * 24 * 4
    assert r["bytes"] == r["kv_bytes"] + r["header_bytes"] and 0 < r["header_bytes"] < 1024
    assert all(r[k] > 0 for k in ("prefill_s", "save_s", "transfer_s", "restore_s"))
    calc = r["calculator"]
    assert calc["per_rank"] == r["formula_bytes"] and calc["tp"] == 1
    assert calc["seconds_per_link"]["100 Gb/s network"]["per_rank_s"] == r["formula_bytes"] / 12.5e9


def _slot_file(n_tokens: int, n_layers: int, kv_heads: int, d_head: int, *, v_trans: bool) -> bytes:
    """A slot file laid out exactly as llama.cpp writes one (see kvviz/serving/llamacpp_state.py)."""
    tokens = list(range(1, n_tokens + 1))
    packed = [-1, 1, n_tokens, *tokens, 0]
    out = struct.pack("<III", MAGIC, 3, len(packed)) + struct.pack(f"<{len(packed)}i", *packed)
    out += struct.pack("<II", 1, n_tokens)  # one stream, its cells
    for pos in range(n_tokens):
        out += struct.pack("<iIi", pos, 1, 0)
    out += struct.pack("<II", int(v_trans), n_layers)
    row = kv_heads * d_head * 2  # float16
    for _ in range(n_layers):
        out += struct.pack("<iQ", 1, row) + bytes(row * n_tokens)
    for _ in range(n_layers):
        out += (struct.pack("<iII", 1, 2, kv_heads * d_head) if v_trans else struct.pack("<iQ", 1, row))
        out += bytes(row * n_tokens)
    return out


@pytest.mark.parametrize("v_trans", [False, True])
def test_slot_file_layout_explains_the_issue_measurement(tmp_path, v_trans):
    """The issue measured a 25-token SmolLM2 slot (-c 2048 -np 1) at 577,164 bytes where f16 K/V is 576,000: the
    1,164 bytes are the file header (12), the packed prompt (4·29), the stream count and cell count (8), each
    cell's position and sequence (25·12) and each layer's K and V type and row size (8 + 60·12)."""
    spec = fetched_spec("smollm2")
    path = tmp_path / "slot.bin"
    path.write_bytes(_slot_file(25, spec.n_layers, spec.n_kv_heads, spec.d_head, v_trans=v_trans))
    f = read_slot_file(path)
    assert f.size == 577_164 and f.kv_bytes == 576_000 == kv_footprint(spec, 25, 1, "float16").total
    assert f.header_bytes == 1_164 and sum(f.parts.values()) == f.size
    assert f.tokens == list(range(1, 26)) and f.n_cells == 25 and f.kv_dtype == "float16" and f.v_trans == v_trans
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(SlotFileError):
        read_slot_file(path)


needs_server = pytest.mark.llama_server  # waits for a build in progress, else skips (tests/conftest.py)


@needs_server
def test_two_llama_servers_hand_off_a_slot(tiny, tmp_path):
    from kvviz.serving.handoff import llamacpp_handoff

    gguf = export_gguf(tiny.model, tiny.tokenizer, tmp_path / "tiny.gguf", name="kvviz-tiny")
    ids = shared_prefix_ids(tiny.tokenizer, 25)
    r = llamacpp_handoff(gguf, tiny.spec, ids, 12, workdir=tmp_path)
    assert r["tokens_equal_single"] and len(r["tokens"]) == 12
    assert r["n_saved"] == r["n_restored"] == 25 and r["file_tokens_equal_prompt"]
    assert r["bytes"] == r["file_bytes"] == r["n_read"] == sum(r["file_parts"].values())
    assert r["kv_dtype"] == "float16" and r["kv_bytes"] == r["formula_bytes"] == kv_footprint(tiny.spec, 25, 1,
                                                                                               "float16").total
    # The decode server computed only the last prompt token again (its logits), the rest came from the file.
    assert r["decode_prompt_tokens_evaluated"] == 1


@needs_server
def test_handoff_cli_on_llama_cpp(capsys):
    assert main(["handoff", "--engine", "llamacpp", "--prompt-tokens", "20", "--new-tokens", "4", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert CLI_KEYS <= set(r) and r["tokens_equal_single"] and r["kv_bytes"] == r["formula_bytes"]


def test_handoff_cli_refuses_a_missing_server(capsys):
    assert main(["handoff", "--engine", "llamacpp", "--llama-server", "/nonexistent/llama-server"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "/nonexistent/llama-server" in err
