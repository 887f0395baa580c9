"""A model name is sorted into its kind once (resolve_model), then loaded: each kind named, a directory's config.json
read once however it is then loaded, and names that are no model refused by name."""
import json
from pathlib import Path

import pytest

from kvviz.engine import loading
from kvviz.engine.loading import SOURCE_KINDS, load_backend, resolve_model
from kvviz.engine.shape import TINY_DIR, TINY_NAME
from kvviz.errors import InputError


def test_every_kind_named_once(tmp_path):
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    kinds = {name: resolve_model(name) for name in ("tiny", "random", str(TINY_DIR), str(hf), str(gguf),
                                                     " HuggingFaceTB/SmolLM2-135M ")}
    assert [s.kind for s in kinds.values()] == ["shipped", "random", "kvviz_dir", "transformers_dir", "gguf", "hub"]
    assert kinds["tiny"].title == TINY_NAME and kinds[str(TINY_DIR)].title is None
    assert kinds[str(hf)].config == {"model_type": "llama", "hidden_size": 64}  # read here, once
    assert kinds[" HuggingFaceTB/SmolLM2-135M "].name == "HuggingFaceTB/SmolLM2-135M"
    assert set(SOURCE_KINDS) == {"shipped", "random", "fetched", "gguf", "kvviz_dir", "transformers_dir", "hub"}


def test_names_that_are_no_model_are_refused(tmp_path):
    with pytest.raises(InputError) as empty:
        resolve_model(str(tmp_path))  # a directory with nothing in it
    assert empty.value.key == "hf.no_model"
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(InputError) as damaged:  # weights without their config: named by the missing file
        resolve_model(str(tmp_path))
    assert damaged.value.key == "model.missing_file"
    with pytest.raises(InputError) as blank:
        resolve_model("   ")
    assert blank.value.key == "unknown_model"


def test_config_read_once_per_load(monkeypatch):
    """Loading a kvviz directory read its config.json twice (once to sort it, once to build the decoder); the
    resolved source carries it to the loader."""
    reads = []
    read_text = Path.read_text

    def counting(self, *args, **kwargs):
        if self.name == "config.json":
            reads.append(self)
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", counting)
    backend = load_backend(str(TINY_DIR), device="cpu")
    assert backend.spec.n_layers == 4 and len(reads) == 1
    assert loading.resolve_model(str(TINY_DIR)).config == json.loads(read_text(TINY_DIR / "config.json"))
