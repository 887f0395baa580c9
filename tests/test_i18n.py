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
