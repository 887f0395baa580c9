"""`kvviz memory` with --preset / --config and `kvviz presets`: every intermediate, one-line errors."""

import json

import pytest

from kvviz.cli import main
from tests.kv.test_formula import DEEPSEEK_V3_CONFIG, GEMMA2_CONFIG


def run_json(argv, capsys):
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_memory_json_intermediates_for_a_preset(capsys):
    out = run_json(["memory", "--preset", "Llama-3.1-8B", "--tokens", "4096", "--batch", "32"], capsys)
    assert out["per_token_per_layer"] == 2 * 8 * 128 * 2
    assert out["per_token"] == 128 * 1024
    assert out["per_request"] == 4096 * 128 * 1024
    assert out["total"] == 32 * 4096 * 128 * 1024 == 16 * 1024**3
    assert out["n_params"] == 8_030_261_248 and out["weight_bytes"] == 16_060_522_496
    assert out["kind"] == "GQA" and out["model"] == "Llama-3.1-8B"


def test_memory_json_custom_shape_keeps_the_old_keys(capsys):
    out = run_json(
        [
            "memory",
            "--layers",
            "32",
            "--kv-heads",
            "8",
            "--head-dim",
            "128",
            "--tokens",
            "4096",
            "--batch",
            "32",
            "--kv-dtype",
            "int8",
        ],
        capsys,
    )
    assert out["per_token_per_layer"] == 2048 + 64  # int8 data + fp16 scales of 64-value groups
    assert out["scale_bytes_per_token_per_layer"] == 64
    assert out["total"] == 32 * 4096 * 32 * 2112
    assert "kind" not in out  # query heads are unknown for a bare shape


@pytest.mark.parametrize("preset, config", [("Gemma-2-9B", GEMMA2_CONFIG), ("DeepSeek-V3", DEEPSEEK_V3_CONFIG)])
def test_config_file_equals_preset(tmp_path, capsys, preset, config):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    args = ["--tokens", "10000", "--batch", "2"]
    from_file = run_json(["memory", "--config", str(path), *args], capsys)
    from_preset = run_json(["memory", "--preset", preset, *args], capsys)
    keys = ("per_token_per_layer", "per_token", "cached_token_layers", "per_request", "total", "kind")
    assert {k: from_file[k] for k in keys} == {k: from_preset[k] for k in keys}
    if preset == "DeepSeek-V3":
        assert from_file["per_token"] == 61 * 576 * 2 and from_file["kind"] == "MLA"
        assert from_file["n_params"] is None and from_file["params_source"] == "unknown"  # MoE: never a default
        assert from_file["weight_bytes"] is None
    else:
        assert from_file["per_token"] == 336 * 1024
        assert from_file["params_source"] == "estimated" and from_preset["params_source"] == "counted"


def test_presets_json(capsys):
    rows = {p["name"]: p for p in run_json(["presets"], capsys)["presets"]}
    assert len(rows) >= 11
    assert rows["Qwen2.5-7B"]["bf16_bytes_per_token"] == 56 * 1024
    assert rows["Mistral-7B"]["sliding_window"] == 4096
    assert rows["Gemma-2-9B"]["d_head"] == 256 != rows["Gemma-2-9B"]["d_model"] // rows["Gemma-2-9B"]["n_heads"]
    assert rows["Falcon-7B"]["kind"] == "MQA" and rows["DeepSeek-V3"]["kind"] == "MLA"
    assert all(p["n_params"] > 0 for p in rows.values())


def test_memory_text_output(capsys):
    assert main(["memory", "--preset", "Gemma-2-9B", "--tokens", "8192"]) == 0
    out = capsys.readouterr().out
    assert "window 4096 on 21 layers" in out and "336.00 KiB" in out and "GiB" in out


@pytest.mark.parametrize(
    "argv, words",
    [
        (["memory", "--preset", "Llama-9"], "Unknown preset"),
        (["memory", "--preset", "GPT-2", "--layers", "3"], "one of --preset"),
        (["memory", "--config", "/no/such/config.json"], "No config.json"),
        (["memory", "--preset", "GPT-2", "--tokens", "0"], "positive"),
        (["memory", "--preset", "GPT-2", "--batch", "-3"], "positive"),
    ],
)
def test_memory_bad_arguments_one_line(argv, words, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "\n" not in err


def test_bad_config_file_one_line(tmp_path, capsys):
    bad = tmp_path / "config.json"
    bad.write_text("{oops")
    assert main(["memory", "--config", str(bad)]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    bad.write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 4}))
    assert main(["memory", "--config", str(bad)]) == 2
    assert "num_hidden_layers" in capsys.readouterr().err
