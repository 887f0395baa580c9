"""Every user-visible string exists in English and Korean, with the same placeholders."""
import re

from kvviz.i18n import LANGS, catalog


def test_locales_have_the_same_keys():
    en, ko = catalog("en"), catalog("ko")
    assert set(en) - set(ko) == set(), "keys missing in Korean"
    assert set(ko) - set(en) == set(), "keys missing in English"
    assert len(en) > 20


def test_placeholders_match_and_korean_is_translated():
    en, ko = catalog("en"), catalog("ko")
    for key in en:
        assert set(re.findall(r"{(\w+)}", en[key])) == set(re.findall(r"{(\w+)}", ko[key])), key
    hangul = sum(bool(re.search("[가-힣]", v)) for v in ko.values())
    assert hangul / len(ko) > 0.8  # symbols like "dtype" may stay, prose may not


def test_languages():
    assert LANGS == ("en", "ko")


def test_english_plurals_and_one_head_is_mha():
    """Issue 19 #22: "1 tokens", "1 query heads share 1 KV heads (group of 1)"."""
    from kvviz.i18n import t

    assert t("training.too_short", "en", n_tokens=1, min_len=2).startswith("the text has 1 token;")
    assert t("training.too_short", "en", n_tokens=0, min_len=2).startswith("the text has 0 tokens;")
    assert t("common.shape_caption_MHA", "en", n_heads=1, n_kv_heads=1, group=1) == (
        "MHA: 1 query head and as many KV heads, no groups")
    assert t("common.shape_caption_GQA", "en", n_heads=8, n_kv_heads=2, group=4) == (
        "GQA: 8 query heads share 2 KV heads, in groups of 4")
    assert "1 layer ·" in t("common.model_info", "en", name="m", layers=1, heads=1, kv_heads=1, kind="MHA", d_head=2,
                            params="1,234")
    assert "|" not in t("training.token_caption", "ko", n_tokens=1, max_tokens=64, n_prompt=0, steps=1)


def test_every_symbol_in_the_locales_has_a_font():
    """Issue 19 #20: "⏸" drew as an empty box: no installed font (Noto, DejaVu) has it."""
    import shutil
    import subprocess
    import unicodedata

    import pytest

    if shutil.which("fc-list") is None:
        pytest.skip("fontconfig's fc-list is not installed")
    symbols = {ch for lang in LANGS for text in catalog(lang).values() for ch in text
               if ord(ch) > 0x2000 and unicodedata.category(ch) in ("So", "Sm", "Po", "Pd", "Ps", "Pe")}
    missing = [f"U+{ord(ch):04X} {ch}" for ch in sorted(symbols)
               if not subprocess.run(["fc-list", f":charset={ord(ch):x}", "family"], capture_output=True,
                                     text=True).stdout.strip()]
    assert missing == []


def test_korean_says_layer_one_way_and_translates_bytes():
    """Issue 19 #22: 층 on Memory, 레이어 elsewhere; an English "bytes" in a Korean legend."""
    ko = catalog("ko")
    assert [k for k, v in ko.items() if "층" in v] == []
    assert [k for k, v in ko.items() if re.search(r"\bbytes\b", re.sub(r"{\w+}", "", v))] == []


def test_int4_caption_names_the_zero_point():
    from kvviz.i18n import t
    from kvviz.kv.formats import kv_dtype

    int4 = kv_dtype("int4")
    for lang in ("en", "ko"):
        text = t("memory.scale_note_int4", lang, dtype="int4", group=int4.group_size, scale=int4.scale_bytes_per_group)
        assert "64" in text and "4 B" in text
    note = t("memory.scale_note_int4", "en", dtype="int4", group=64, scale=4)
    assert "one fp16 scale and one fp16 zero point" in note
