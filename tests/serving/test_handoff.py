"""Which GGUF the llama.cpp handoff loads, chosen in one place for the CLI and the Moving the Cache page: a .gguf
file as given, the shipped model exported with the weights the backend holds, a fetched model's own; any other
model refused with one line in both languages."""
from pathlib import Path

import pytest

from kvviz.cli import main
from kvviz.engine import fetch
from kvviz.engine.loading import load_backend
from kvviz.errors import InputError
from kvviz.i18n import t
from kvviz.serving.handoff import handoff_gguf


def test_each_kind_of_model_gets_its_gguf(tmp_path):
    tiny = load_backend("tiny", device="cpu")
    assert handoff_gguf("own.gguf", tiny, tmp_path) == Path("own.gguf")
    exported = handoff_gguf("tiny", tiny, tmp_path)
    assert exported == tmp_path / "tiny.gguf" and exported.read_bytes()[:4] == b"GGUF"
    for name in fetch.MODELS:  # the fetched file, or the message that says how to fetch it
        if fetch.is_fetched(name):
            assert handoff_gguf(name, tiny, tmp_path) == fetch.gguf_path(name)
        else:
            with pytest.raises(InputError, match="fetch-model"):
                handoff_gguf(name, tiny, tmp_path)
    with pytest.raises(InputError) as refused:
        handoff_gguf("random", tiny, tmp_path)
    assert refused.value.key == "handoff_gguf"
    assert "random" in refused.value.message("ko") and "random" in refused.value.message("en")
    assert refused.value.message("ko") == t("errors.handoff_gguf", "ko", name="random", choices=", ".join(fetch.MODELS))


@pytest.mark.llama_server  # waits for a build in progress, else skips (tests/conftest.py)
def test_the_cli_refuses_a_model_without_a_gguf_in_one_line(capsys):
    assert main(["handoff", "--engine", "llamacpp", "--model", "random", "--prompt-tokens", "20"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "random" in err and ".gguf" in err
