"""The CLI contract: --json output, one-line errors with a non-zero exit."""
import json
import subprocess
import sys

import pytest

from kvviz.cli import main

SHAPE = ["--model", "random", "--layers", "2", "--d-model", "64", "--heads", "4", "--kv-heads", "2",
         "--vocab-size", "300"]


def test_generate_json(capsys):
    assert main(["generate", "--prompt", "hi there", "--max-new-tokens", "5", "--json", *SHAPE]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["token_ids"]) == 5 and len(out["step_seconds"]) == 5
    assert out["prompt_tokens"] == 8
    # 2 layers · (8 + 4) positions · 2 KV heads · d_head 16 · 4 bytes · K and V
    assert out["cache_live_bytes"] == out["formula_bytes"] == 2 * 2 * 12 * 2 * 16 * 4
    assert out["ttft_s"] > 0 and out["tpot_s"] > 0


def test_no_cache_gives_same_tokens(capsys):
    main(["generate", "--prompt", "same", "--max-new-tokens", "6", "--json", *SHAPE])
    cached = json.loads(capsys.readouterr().out)
    main(["generate", "--prompt", "same", "--max-new-tokens", "6", "--json", "--no-cache", *SHAPE])
    recomputed = json.loads(capsys.readouterr().out)
    assert cached["token_ids"] == recomputed["token_ids"]
    assert recomputed["cache_live_bytes"] == 0


def test_memory_json(capsys):
    assert main(["memory", "--layers", "32", "--kv-heads", "32", "--head-dim", "128", "--tokens", "4096",
                 "--batch", "32", "--kv-dtype", "bfloat16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["per_token_per_layer"], out["per_token"], out["per_request"], out["total"]) == (
        16384, 524288, 2 * 1024**3, 64 * 1024**3)


@pytest.mark.parametrize(
    "argv, words",
    [
        (["generate", "--prompt", "", *SHAPE], "prompt is empty"),
        (["generate", "--prompt", "x" * 2000, *SHAPE], "context holds"),
        (["generate", "--prompt", "x", "--model", "random", "--heads", "8", "--kv-heads", "3"], "divisible"),
        (["generate", "--prompt", "x", "--dtype", "int3", *SHAPE], "invalid choice"),
        (["generate", "--prompt", "x", "--max-new-tokens", "0", *SHAPE], "positive"),
        (["memory", "--layers", "2"], "--kv-heads"),
        (["memory", "--layers", "-2", "--kv-heads", "1", "--head-dim", "8"], "positive"),
    ],
)
def test_bad_arguments_one_line(argv, words, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "\n" not in err and err.startswith("kvviz: error:")


def test_cuda_without_gpu_one_line_no_traceback():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    proc = subprocess.run([sys.executable, "-m", "kvviz", "generate", "--prompt", "x", "--device", "cuda", *SHAPE],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_generate_refuses_what_cannot_fit_in_the_context(capsys):
    """Issue 12 item 11: never stop silently at the context limit with exit 0."""
    assert main(["generate", "--prompt", "The cache", "--max-new-tokens", "100000000"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "at most" in err and "new tokens fit" in err


def test_capacity_cli_errors_are_one_line(capsys):
    assert main(["capacity", "--preset", "Llama-3.1-8B"]) == 2  # no GPU given
    assert main(["capacity", "--preset", "Llama-3.1-8B", "--gpu", "Apple M3 Max (40-core GPU)"]) == 2
    assert main(["capacity", "--preset", "DeepSeek-V3", "--gpu", "H200", "--tp", "3"]) == 2
    errors = capsys.readouterr().err.splitlines()
    assert len(errors) == 3 and all(e.startswith("kvviz: error: ") for e in errors)
    assert "memory size is not known" in errors[1] and "split evenly" in errors[2]
def test_generate_reports_steady_state_after_a_warm_up(capsys):
    """Issue 13: a fresh process's first passes pay one-off costs; TPOT is reported after an untimed warm-up."""
    assert main(["generate", "--prompt", "hi there", "--max-new-tokens", "4", *SHAPE]) == 0
    assert "steady state, after an untimed warm-up pass" in capsys.readouterr().out
    main(["generate", "--prompt", "hi there", "--max-new-tokens", "4", "--json", *SHAPE])
    warm = json.loads(capsys.readouterr().out)
    main(["generate", "--prompt", "hi there", "--max-new-tokens", "4", "--json", "--no-warm-up", *SHAPE])
    cold = json.loads(capsys.readouterr().out)
    assert warm["warm_up"] is True and cold["warm_up"] is False
    assert warm["token_ids"] == cold["token_ids"]  # the warm-up changes timings only, never the tokens
