"""kvviz's eviction against NVIDIA's kvpress on the real SmolLM2: the same kept prompt positions, every layer and
KV head, where the two define the same thing with the same parameters.

kvpress (0.5.5) runs in a venv of its own (scripts/install_kvpress_ref.sh: it needs transformers < 5.3) on the
model exported to a transformers directory; scripts/kvpress_kept.py reports the positions each press keeps.
Differences of definition, which these comparisons hold fixed or leave out:
- kvpress compresses once, after the prefill (BasePress.forward_hook: only while prefilling); kvviz's window and
  StreamingLLM evict after every pass and SnapKV after the prefill only. The comparison is after the prefill.
- kvpress keeps int(n·(1 − compression_ratio)) positions (compute_n_kept); kvviz a budget: budget = that count.
- StreamingLLMPress leaves the kept keys at their original rotary angle (the paper's re-rotation needs its
  KeyRerotationPress); kvviz re-rotates them to their slots (§3.2). The kept positions are the same.
- SnapKVPress's observation window defaults to 64, kvviz's to 32 (SnapKV's init_snapkv): run here at 32. It
  averages the window's attention and the group's query heads where kvviz sums them: the same ranking.
- KnormPress (keep the keys of smallest L2 norm, arXiv:2406.11430) has no kvviz policy; it is held to the norms
  of kvviz's own cached keys, so the keys themselves agree as well.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kvviz.compression.runner import Method, run_method
from kvviz.engine.export import export_hf

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("KVVIZ_KVPRESS_VENV", ROOT / "build" / "kvpress-venv"))
PYTHON = VENV / "bin" / "python"
PROMPT = ("The keys and values of earlier tokens never change under a causal mask, so a serving engine keeps them "
          "in a paged cache and each new token only computes its own. ") * 3
RATIO = 0.5
TIE_RTOL = 1e-5  # two key norms this close are one norm (float32 products' rounding is ~1e-7 relative here)
SPECS = {"streaming": "StreamingLLMPress:0.5", "snapkv": "SnapKVPress:0.5:window_size=32", "knorm": "KnormPress:0.5"}

pytestmark = pytest.mark.skipif(
    not PYTHON.is_file(), reason="kvpress is not installed here: run scripts/install_kvpress_ref.sh (.ci/run does)")


@pytest.fixture(scope="module")
def ids(smollm2):
    return smollm2.tokenizer.encode(PROMPT)


@pytest.fixture(scope="module")
def kvpress_kept(smollm2, ids, tmp_path_factory):
    out = tmp_path_factory.mktemp("smollm2-hf")
    export_hf(smollm2.model, smollm2.tokenizer, out)
    done = subprocess.run([str(PYTHON), str(ROOT / "scripts" / "kvpress_kept.py"), str(out), json.dumps(ids),
                           *SPECS.values()], capture_output=True, text=True, timeout=1800,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["kvpress"] == "0.5.5" and result["transformers"].split(".")[:2] < ["5", "3"]
    return {name: result["kept"][spec] for name, spec in SPECS.items()}


def _kvviz_kept(backend, ids, method: str) -> list[list[list[int]]]:  # noqa: ANN001
    """kvviz's kept prompt positions after the prefill: the cache at the first decode step, less its new token."""
    budget = int(len(ids) * (1 - RATIO))
    trace = run_method(backend, [*ids, ids[0], ids[1]], len(ids), Method(method, budget), view_steps=(1,))
    return [[sorted(int(p) for p in head[:-1]) for head in layer] for layer in trace.views[1].kept]


@pytest.mark.parametrize("method", ["streaming", "snapkv"])
def test_same_kept_positions_as_kvpress(smollm2, ids, kvpress_kept, method):
    ours, theirs = _kvviz_kept(smollm2, ids, method), kvpress_kept[method]
    assert len(ours) == len(theirs) == smollm2.spec.n_layers
    budget = int(len(ids) * (1 - RATIO))
    for layer, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert all(len(h) == budget for h in a), layer
        assert a == b, (method, layer)
    if method == "streaming":  # 4 sinks, then the most recent: one choice for every head
        assert theirs[0][0] == [0, 1, 2, 3, *range(len(ids) - budget + 4, len(ids))]
    else:  # attention-chosen: the heads differ
        assert len({tuple(h) for layer in theirs for h in layer}) > 1


def test_knorm_keeps_the_smallest_key_norms_of_kvvizs_cache(smollm2, ids, kvpress_kept):
    cache = smollm2.model.new_cache(1, len(ids))
    with torch.inference_mode():
        smollm2.model(torch.tensor([ids]), cache)
    n_kept = int(len(ids) * (1 - RATIO))
    for layer, theirs in enumerate(kvpress_kept["knorm"]):
        norms = cache.keys(layer)[0].float().norm(dim=-1)  # [H_kv, n], keys after RoPE, as the HF cache holds them
        ours = (-norms).topk(n_kept, dim=-1).indices.sort(dim=-1).values.tolist()
        for head, (mine, kept) in enumerate(zip(ours, theirs, strict=True)):
            assert len(mine) == len(kept) == n_kept, (layer, head)
            # The prompt repeats, so one token's key can have the same norm at two positions: at the cut, topk keeps
            # either. A position one side keeps and the other does not must sit on the cut, within TIE_RTOL of the
            # n_kept-th smallest norm (kvviz's products and transformers' differ by rounding: ~3e-7 measured).
            cut = norms[head].sort().values[n_kept - 1]
            for p in set(mine) ^ set(kept):
                assert torch.isclose(norms[head, p], cut, rtol=TIE_RTOL, atol=0), (layer, head, p)


def test_install_script_is_in_ci():
    assert "scripts/install_kvpress_ref.sh" in (ROOT / ".ci" / "run").read_text()
    assert sys.version_info >= (3, 11)
