"""Which prompt positions NVIDIA's kvpress keeps, per layer and KV head: run in the venv of
scripts/install_kvpress_ref.sh (kvpress needs an older transformers than kvviz), by
tests/compression/test_kvpress_parity.py.

    python scripts/kvpress_kept.py MODEL_DIR IDS_JSON PRESS:RATIO[:KEY=VALUE...] ...

MODEL_DIR is a transformers directory, IDS_JSON the prompt ids, each PRESS a kvpress class (StreamingLLMPress,
SnapKVPress, KnormPress) with its compression_ratio and integer parameters. Prints JSON: {"kvpress": version,
"transformers": version, "kept": {spec: [layer][head] sorted positions}}. The positions are the top-k of the
press's own score() (what ScorerPress.compress keeps), checked against the keys the press left in the cache.
"""
import json
import sys
from importlib.metadata import version

import kvpress
import torch
from kvpress.utils import compute_n_kept
from transformers import AutoModelForCausalLM, DynamicCache


def kept_positions(model, ids: torch.Tensor, full: DynamicCache, spec: str) -> list:  # noqa: ANN001
    press_name, ratio, *extra = spec.split(":")
    params = {k: int(v) for k, v in (e.split("=", 1) for e in extra)}
    press = getattr(kvpress, press_name)(compression_ratio=float(ratio), **params)
    scores: dict[int, torch.Tensor] = {}
    score = press.score

    def recorded(module, *args, **kwargs):  # noqa: ANN001, ANN202
        s = score(module, *args, **kwargs)
        scores[module.layer_idx] = s
        return s

    press.score = recorded
    cache = DynamicCache()
    with torch.no_grad(), press(model):
        model(ids, past_key_values=cache)
    kept = []
    for layer in range(len(cache.layers)):
        n_kept = compute_n_kept(ids.shape[1], float(ratio))
        index = scores[layer].topk(n_kept, dim=-1).indices  # ScorerPress.compress's selection
        expect = full.layers[layer].keys.gather(2, index.unsqueeze(-1).expand(-1, -1, -1, model.config.head_dim))
        if not torch.equal(cache.layers[layer].keys, expect):
            raise SystemExit(f"layer {layer}: the cache does not hold the keys at the recorded positions")
        kept.append(index[0].sort(dim=-1).values.tolist())
    return kept


def main(argv: list[str]) -> None:
    model_dir, ids_json, *specs = argv
    ids = torch.tensor([json.loads(ids_json)])
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        full = DynamicCache()
        model(ids, past_key_values=full)  # the uncompressed keys, to check what each press kept
    kept = {spec: kept_positions(model, ids, full, spec) for spec in specs}
    print(json.dumps({"kvpress": version("kvpress"), "transformers": version("transformers"), "kept": kept}))


if __name__ == "__main__":
    main(sys.argv[1:])
