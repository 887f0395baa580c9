"""A bilingual corpus any machine with the package registries rebuilds: English and Korean prose.

English: the reStructuredText sources of the Python 3.11 documentation (tutorial, HOWTOs, FAQ, language
reference, "using", library reference) from Debian's `python3.11-doc` (PSF License Version 2), with markup
removed (roles, directives, code blocks, interactive sessions) so what is left is prose.
Korean: the Korean pages of LibreOffice's help from Debian's `libreoffice-help-ko` (MPL-2.0), keeping the
paragraphs written in Korean (many pages are partly untranslated English), plus the Constitution of the
Republic of Korea and ten bills of the National Assembly that `konlpy` 0.6.0 bundles (kolaw, kobill; Korean
statutes and bills are not protected works, Copyright Act of Korea, Article 7).

The sources are fetched with the ordinary clients (`apt-get download`, `pip download --no-deps`) into a cache
folder, then parsed here, only when the model is trained (`python -m kvviz.training`). One document per file;
documents are visited in sorted path order; every 10th document of each language (by a stable hash of its name) is
held out. The held-out split ships with the package (kvviz/assets/held_out/, with its licences: write_held_out,
shipped_held_out), so evaluating on it needs no system tool and no download: 422 kB of text, 110 kB compressed.
"""
from __future__ import annotations

import functools
import hashlib
import html
import json
import lzma
import os
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

from kvviz.engine.user_cache import cache_root

HELD_OUT_EVERY = 10
DEBS = ("python3.11-doc", "libreoffice-help-ko")
WHEEL = "konlpy==0.6.0"
LICENSES = {
    "python3.11-doc": "Python Software Foundation License Version 2",
    "libreoffice-help-ko": "Mozilla Public License 2.0 (LibreOffice help; parts Apache-2.0)",
    "konlpy": "public-domain Korean statutes and bills (Copyright Act of Korea, Art. 7), bundled in konlpy (GPL-3)",
}
# Python docs folders that are prose; c-api, distutils, extending and whatsnew are mostly API lists and changelogs.
ENGLISH_DIRS = ("tutorial", "howto", "faq", "reference", "using", "library")
ENGLISH_BYTES = 4_000_000  # a cap in sorted order; the 3.11 docs give 2.3 MB of prose, about the Korean side's tokens
DEFAULT_SOURCES = Path(os.environ.get("KVVIZ_CORPUS_SOURCES", cache_root() / "corpus-sources"))
# The held-out split as the package ships it (xz-compressed JSON), written by the training run that uses it.
HELD_OUT_FILE = Path(__file__).resolve().parents[1] / "assets" / "held_out" / "documents.json.xz"
HANGUL = re.compile(r"[\uac00-\ud7a3]")
LETTER = re.compile(r"[A-Za-z\uac00-\ud7a3]")


@dataclass(frozen=True)
class Document:
    name: str  # "en:library/os" or "ko:libreoffice/text/swriter/main0000" ...
    text: str

    @property
    def lang(self) -> str:
        return self.name.split(":", 1)[0] if ":" in self.name else "en"

    @property
    def held_out(self) -> bool:
        return is_held_out(self.name)


@dataclass(frozen=True)
class Corpus:
    source: str
    python_version: str  # kept for the training record: the version of the Python docs used
    train: list[Document]
    held_out: list[Document]
    versions: dict[str, str] = field(default_factory=dict)

    def split(self, lang: str, held_out: bool) -> list[Document]:
        return [d for d in (self.held_out if held_out else self.train) if d.lang == lang]

    def stats(self) -> dict:
        out: dict = {"source": self.source, "versions": self.versions, "licenses": LICENSES}
        for lang in ("en", "ko"):
            for split, held in (("train", False), ("held_out", True)):
                docs = self.split(lang, held)
                out[f"{lang}_{split}_documents"] = len(docs)
                out[f"{lang}_{split}_bytes"] = sum(len(d.text.encode("utf-8")) for d in docs)
                out[f"{lang}_{split}_chars"] = sum(len(d.text) for d in docs)
        return out


def is_held_out(name: str) -> bool:
    """Stable across runs and machines (unlike hash()): md5 of the document name."""
    return int(hashlib.md5(name.encode()).hexdigest(), 16) % HELD_OUT_EVERY == 0


def tidy(text: str) -> str:
    """Strip trailing spaces, collapse runs of spaces and of blank lines."""
    text = text.replace("\r\n", "\n").replace("\t", "    ").replace("\xa0", " ")
    text = "\n".join(re.sub(r"(?<=\S) {2,}", " ", line.rstrip()) for line in text.split("\n"))
    return re.sub(r"\n{3,}", "\n\n", text).strip()


# --- English: reStructuredText to prose -------------------------------------------------------------

_ROLE = re.compile(r":[\w:.-]+:`([^`]*)`")
_SKIP_DIRECTIVES = ("code-block", "sourcecode", "testcode", "testoutput", "testsetup", "testcleanup", "doctest",
                    "productionlist", "literalinclude", "toctree", "index", "highlight", "raw", "image", "figure",
                    "csv-table", "list-table", "table", "tabularcolumns", "only", "moduleauthor", "sectionauthor",
                    "include", "audit-event", "impl-detail", "availability", "opcode", "cmdoption", "option",
                    "envvar", "describe", "program", "currentmodule", "module", "versionchanged", "versionadded",
                    "deprecated", "deprecated-removed", "seealso", "rubric", "c:function", "c:type", "c:macro",
                    "c:member", "c:var", "pdbcommand", "productionlist", "grammar-snippet", "contents", "sidebar")


def _role_text(m: re.Match) -> str:
    inner = m.group(1).lstrip("!~")
    target = re.match(r"(.*?)\s*<[^>]*>$", inner)  # :ref:`text <label>` -> text
    return target.group(1) if target else inner


def rst_prose(source: str) -> str:
    """Prose of one .rst file: headings and paragraphs kept; code, tables, directives and markup dropped."""
    lines = source.replace("\t", "    ").split("\n")
    out: list[str] = []
    i = 0
    skip_indent: int | None = None  # inside a block to drop: lines indented deeper than this

    def indent(line: str) -> int:
        return len(line) - len(line.lstrip(" "))

    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if skip_indent is not None:
            if not stripped or indent(line) > skip_indent:
                i += 1
                continue
            skip_indent = None
            out.append("")  # the dropped block separated paragraphs
        if re.fullmatch(r"([=\-~^\"'`#*+.:_])\1{2,}", stripped):  # heading over/underline
            i += 1
            continue
        if stripped.startswith(".."):
            m = re.match(r"\.\.\s+([\w:-]+)::(.*)", stripped)
            if m and m.group(1) not in _SKIP_DIRECTIVES and m.group(1) not in ("class", "function", "method",
                                                                               "attribute", "data", "exception",
                                                                               "decorator", "decoratormethod",
                                                                               "classmethod", "staticmethod",
                                                                               "coroutinefunction",
                                                                               "coroutinemethod",
                                                                               "abstractmethod", "property"):
                # note/warning/tip/...: keep its body as prose, its argument as a line
                if m.group(2).strip():
                    out.append(indent(line) * " " + m.group(2).strip())
                i += 1
                while i < len(lines) and re.match(r"\s+:[\w-]+:", lines[i]):
                    i += 1  # directive options
                continue
            skip_indent = indent(line)  # comment, label, target, or a directive to drop, with its body
            i += 1
            continue
        if stripped.startswith((">>>", "...")) or stripped.startswith("+--") or stripped.startswith("|"):
            i += 1
            continue
        if stripped.endswith("::"):  # a literal block follows: keep the sentence, drop the block
            text = stripped[:-2].rstrip()
            out.append(" " * indent(line) + (text + ":" if text and not text.endswith(":") else text))
            skip_indent = indent(line)
            i += 1
            continue
        out.append(line)
        i += 1

    text = "\n".join(out)
    text = _ROLE.sub(_role_text, text)
    text = re.sub(r"``([^`]+)``", r"\1", text)
    text = re.sub(r"`([^`<]+?)\s*<[^>]+>`_+", r"\1", text)  # `text <url>`_
    text = re.sub(r"`([^`]+)`_*", r"\1", text)
    text = re.sub(r"\*\*([^*]+)\*\*", r"\1", text)
    text = re.sub(r"(?<![\w*])\*([^*\s][^*]*?)\*(?![\w*])", r"\1", text)
    text = re.sub(r"\|([\w-]+)\|", r"\1", text)  # substitutions
    text = re.sub(r"\\(.)", r"\1", text)
    # Paragraphs: dedent and join hard-wrapped lines, so the model learns prose, not line lengths.
    paras = []
    for para in re.split(r"\n\s*\n", text):
        rows = [r.strip() for r in para.split("\n") if r.strip()]
        if not rows:
            continue
        bullet = re.compile(r"([*\-+]|\d+\.|#\.)\s")
        merged: list[str] = []
        for r in rows:
            if merged and not bullet.match(r):
                merged[-1] += " " + r
            else:
                merged.append(r)
        paras.append("\n".join(merged))
    return tidy("\n\n".join(paras))


def english_documents(root: Path) -> list[Document]:
    """One document per .rst page of the Python docs, up to ENGLISH_BYTES in sorted path order."""
    base = root / "python3.11-doc" / "usr" / "share" / "doc" / "python3.11" / "html" / "_sources"
    docs, total = [], 0
    for folder in ENGLISH_DIRS:
        for path in sorted((base / folder).rglob("*.rst.txt")):
            text = rst_prose(path.read_text(encoding="utf-8"))
            if len(text) < 200:
                continue
            docs.append(Document("en:" + str(path.relative_to(base)).removesuffix(".rst.txt"), text))
            total += len(text.encode())
            if total >= ENGLISH_BYTES:
                return docs
    return docs


# --- Korean: LibreOffice help pages and konlpy's statutes --------------------------------------------

class _HelpText(HTMLParser):
    """Paragraph texts of a LibreOffice help page (no navigation, scripts, or styles)."""

    BLOCK = {"p", "h1", "h2", "h3", "h4", "h5", "h6", "li", "td", "th", "div", "br", "dt", "dd", "table"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skip = 0

    def handle_starttag(self, tag: str, attrs) -> None:  # noqa: ANN001
        if tag in ("script", "style", "head", "nav", "header", "footer"):
            self.skip += 1
        elif tag in self.BLOCK:
            self.parts.append("\n\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style", "head", "nav", "header", "footer"):
            self.skip = max(0, self.skip - 1)
        elif tag in self.BLOCK:
            self.parts.append("\n\n")

    def handle_data(self, data: str) -> None:
        if not self.skip:
            self.parts.append(data.replace("\n", " "))


def korean_paragraphs(page_html: str, min_hangul: float = 0.5) -> str:
    """The paragraphs of a page written in Korean: at least min_hangul of their letters are Hangul syllables.

    Repeated paragraphs (a heading echoed in a link) are kept once.
    """
    parser = _HelpText()
    parser.feed(page_html)
    seen, keep = set(), []
    for para in re.split(r"\n\s*\n", "".join(parser.parts)):
        para = html.unescape(re.sub(r"\s+", " ", para)).replace("@@@", "").strip()  # "@@@": a translation mark
        letters = LETTER.findall(para)
        if len(para) < 4 or not letters or para in seen:
            continue
        if len(HANGUL.findall(para)) / len(letters) >= min_hangul:
            seen.add(para)
            keep.append(para)
    return "\n\n".join(keep)


def unwrap_korean(text: str) -> str:
    """Join hard-wrapped lines of a bill (a break inside a word joins it; a trailing space stays a space)."""
    paras = []
    for para in re.split(r"\n\s*\n", text.replace("\r\n", "\n")):
        paras.append("".join(para.split("\n")))
    return tidy("\n\n".join(paras))


def korean_documents(root: Path) -> list[Document]:
    docs = []
    help_dir = root / "libreoffice-help-ko" / "usr" / "share" / "libreoffice" / "help" / "ko"
    for path in sorted(help_dir.rglob("*.html")):
        text = tidy(korean_paragraphs(path.read_text(encoding="utf-8", errors="replace")))
        if len(HANGUL.findall(text)) >= 40:
            docs.append(Document("ko:libreoffice/" + str(path.relative_to(help_dir)).removesuffix(".html"), text))
    corpus_dir = root / "konlpy" / "konlpy" / "data" / "corpus"
    law = corpus_dir / "kolaw" / "constitution.txt"
    if law.exists():
        docs.append(Document("ko:kolaw/constitution", tidy(law.read_text(encoding="utf-8"))))
    for path in sorted((corpus_dir / "kobill").glob("*.txt")):
        docs.append(Document(f"ko:kobill/{path.stem}", unwrap_korean(path.read_text(encoding="utf-8"))))
    return docs


# --- Fetching the sources ---------------------------------------------------------------------------

def _deb_version(deb: Path) -> str:
    return subprocess.run(["dpkg-deb", "-f", str(deb), "Version"], capture_output=True, text=True,
                          check=True).stdout.strip()


def fetch_sources(root: Path = DEFAULT_SOURCES, log=print) -> dict[str, str]:  # noqa: ANN001
    """Download (once) and unpack the packages into root; return {package: version}."""
    root.mkdir(parents=True, exist_ok=True)
    versions = {}
    for name in DEBS:
        debs = sorted(root.glob(f"{name}_*.deb"))
        if not debs:
            log(f"apt-get download {name}")
            if subprocess.run(["apt-get", "download", name], cwd=root, capture_output=True).returncode != 0:
                subprocess.run(["apt-get", "update"], check=True, capture_output=True)  # a fresh machine's lists
                subprocess.run(["apt-get", "download", name], cwd=root, check=True, capture_output=True)
            debs = sorted(root.glob(f"{name}_*.deb"))
        if not (root / name).is_dir():
            subprocess.run(["dpkg-deb", "-x", str(debs[-1]), str(root / name)], check=True)
        versions[name] = _deb_version(debs[-1])
    wheels = sorted(root.glob("konlpy-*.whl"))
    if not wheels:
        log(f"pip download --no-deps {WHEEL}")
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", WHEEL, "-d", str(root)],
                       check=True)
        wheels = sorted(root.glob("konlpy-*.whl"))
    if not (root / "konlpy").is_dir():
        with zipfile.ZipFile(wheels[-1]) as zf:
            zf.extractall(root / "konlpy", [n for n in zf.namelist() if n.startswith("konlpy/data/corpus/ko")])
    versions["konlpy"] = wheels[-1].name.split("-")[1]
    return versions


def documents(root: Path, versions: dict[str, str]) -> list[Document]:
    """The documents of the unpacked sources, parsed once per set of package versions and per version of this
    module, then read back from a JSON file beside the sources. Parsing 2,500 help pages takes about a minute on
    two cores; every process that evaluates held-out text (the CLI, each app server, the tests) needs them."""
    key = hashlib.sha256(json.dumps(versions, sort_keys=True).encode() + Path(__file__).read_bytes()).hexdigest()
    path = root / f"documents-{key[:16]}.json"
    if path.is_file():
        return [Document(name, text) for name, text in json.loads(path.read_text(encoding="utf-8"))]
    docs = english_documents(root) + korean_documents(root)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")  # written whole, then renamed: a reader never sees half a file
    tmp.write_text(json.dumps([[d.name, d.text] for d in docs], ensure_ascii=False), encoding="utf-8")
    tmp.replace(path)
    return docs


def build_corpus(root: Path = DEFAULT_SOURCES, log=print) -> Corpus:  # noqa: ANN001
    versions = fetch_sources(root, log)
    docs = documents(root, versions)
    return Corpus(
        source="Python 3.11 documentation (python3.11-doc), LibreOffice help in Korean (libreoffice-help-ko), "
               "konlpy's kolaw and kobill",
        python_version=versions["python3.11-doc"],
        train=[d for d in docs if not d.held_out],
        held_out=[d for d in docs if d.held_out],
        versions=versions,
    )


# --- The held-out split as the package ships it -----------------------------------------------------

def write_held_out(corpus: Corpus, path: Path = HELD_OUT_FILE) -> None:
    """The held-out documents, in the corpus's order, with the package versions they came from."""
    data = {"source": corpus.source, "versions": corpus.versions, "licenses": LICENSES,
            "documents": [[d.name, d.text] for d in corpus.held_out]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(lzma.compress(json.dumps(data, ensure_ascii=False).encode("utf-8"),
                                   preset=9 | lzma.PRESET_EXTREME))


@functools.cache
def shipped_held_out(path: Path = HELD_OUT_FILE) -> tuple[dict[str, str], tuple[Document, ...]]:
    """(package versions, the held-out documents) from the file write_held_out wrote: what evaluations read."""
    data = json.loads(lzma.decompress(path.read_bytes()).decode("utf-8"))
    return data["versions"], tuple(Document(name, text) for name, text in data["documents"])
