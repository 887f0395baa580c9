"""Decode-step time of the HF backend vs the native backend on the same weights, one run.

    python bench/hf_backend_step.py [--prompt-tokens 256] [--new-tokens 64] [--repeats 3]

The native decoder is saved as a transformers Llama directory and loaded through the HF backend, so both
run identical weights through the same engine. A step's time is the engine's own device-synchronized
`StepEvent.seconds`; the median over decode steps and repeats is reported, with ratios to native.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, models
from transformers import LlamaConfig, PreTrainedTokenizerFast

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kvviz.engine.config import DecoderConfig  # noqa: E402
from kvviz.engine.generation import Generation  # noqa: E402
from kvviz.engine.loading import load_backend, random_backend  # noqa: E402

SHAPE = DecoderConfig(n_layers=4, d_model=256, n_heads=8, n_kv_heads=2, d_ff=688, vocab_size=4096, max_seq_len=1024)


def save_as_hf(backend, path: Path) -> None:
    state = {k: v.contiguous() for k, v in backend.model.state_dict().items()}
    save_file(state, path / "model.safetensors", metadata={"format": "pt"})
    LlamaConfig(**backend.model.cfg.to_hf_dict()).save_pretrained(path)
    # The prompt is given as ids; a one-entry vocabulary is enough for the loader.
    word_level = Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>"))
    PreTrainedTokenizerFast(tokenizer_object=word_level).save_pretrained(path)


def step_seconds(backends: dict, prompt: list[int], n_new: int, repeats: int) -> dict:
    """Median decode-step seconds per (backend, capture); runs interleaved so machine load hits all alike."""
    samples: dict = {(name, capture): [] for name in backends for capture in (False, True)}
    for run in range(repeats + 1):
        for (name, capture), out in samples.items():
            gen = Generation(backends[name], max_new_tokens=n_new, capture_attention=capture, stop_at_eos=False)
            events = gen.run(prompt)
            if run:  # the first round is a warm-up
                out.extend(e.seconds for e in events[1:])
    return {key: statistics.median(values) for key, values in samples.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(2)

    native = random_backend(SHAPE, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        save_as_hf(native, Path(tmp))
        hf = load_backend(tmp, device="cpu")
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, SHAPE.vocab_size, (args.prompt_tokens,), generator=gen).tolist()

    rows = step_seconds({"native": native, "HF backend": hf}, prompt, args.new_tokens, args.repeats)
    print(f"{SHAPE.n_layers} layers, d_model {SHAPE.d_model}, {SHAPE.n_heads}/{SHAPE.n_kv_heads} heads, float32 CPU, "
          f"{torch.get_num_threads()} threads, prompt {args.prompt_tokens}, {args.new_tokens} new tokens")
    for (name, capture), s in rows.items():
        base = rows[("native", capture)]
        print(f"  {name:10s} capture {'on ' if capture else 'off'} {s * 1e3:8.3f} ms/step  ×{s / base:5.2f} of native")
    print(f"HF backend / native step time: {rows[('HF backend', False)] / rows[('native', False)]:.2f} (SDPA), "
          f"{rows[('HF backend', True)] / rows[('native', True)]:.2f} (attention rows on, eager)")


if __name__ == "__main__":
    main()
