"""The room's results CSV and the followers' link on the machine's network (kvviz.room.results, kvviz.room.network)."""
import csv
import io
import ipaddress

import pytest

from kvviz.room import network
from kvviz.room.network import RoomLink, is_loopback, listens_on_network, network_address, room_link
from kvviz.room.results import RESULT_COLUMNS, results_csv, summary
from kvviz.room.store import Asked

ASKED = [Asked("cache_update", {"append": 7, "rebuild": 2, "logits": 1}, "append", 1_796_000_000.0,
               1_796_000_042.0),
         Asked("m_optional", {"true": 3, "false": 5}, None, 1_796_000_100.0, None)]
LABELS = {"cache_update": {"append": "추가", "rebuild": "다시 계산", "logits": "로짓"},
          "m_optional": {"true": "참", "false": "거짓"}}


def test_results_csv_has_a_row_per_option_with_counts_answer_and_times():
    text = results_csv(ASKED, lambda q: f"Q {q}", LABELS.__getitem__, RESULT_COLUMNS)
    assert text.startswith("\ufeff")
    rows = list(csv.reader(io.StringIO(text.removeprefix("\ufeff"))))
    assert rows[0] == list(RESULT_COLUMNS)
    assert rows[1:] == [
        ["Q cache_update", "2026-11-30T00:53:20Z", "2026-11-30T00:54:02Z", "추가", "7", "1"],
        ["Q cache_update", "2026-11-30T00:53:20Z", "2026-11-30T00:54:02Z", "다시 계산", "2", "0"],
        ["Q cache_update", "2026-11-30T00:53:20Z", "2026-11-30T00:54:02Z", "로짓", "1", "0"],
        ["Q m_optional", "2026-11-30T00:55:00Z", "", "참", "3", ""],  # never revealed, no answer given
        ["Q m_optional", "2026-11-30T00:55:00Z", "", "거짓", "5", ""],
    ]
    s = summary(ASKED)
    assert (s[0].answered, s[0].right, s[0].right_share, s[0].revealed) == (10, 7, 0.7, True)
    assert (s[1].answered, s[1].right, s[1].right_share, s[1].revealed) == (8, None, None, False)


@pytest.mark.parametrize("host, loop", [("localhost", True), ("127.0.0.1", True), ("127.1.2.3", True),
                                        ("[::1]", True), ("::1", True), ("app.localhost", True),
                                        ("192.168.1.20", False), ("kvviz.example.org", False), ("", False)])
def test_loopback_hosts(host, loop):
    assert is_loopback(host) is loop


def test_the_room_link_never_points_at_loopback():
    page = "http://localhost:8501/Reusing_Past_KV?lecture=1&lang=ko"
    # the lecture way: every interface, the page opened on the machine itself -> the network address, the port
    assert room_link(page, "abc", "0.0.0.0", 8501, "192.168.1.20") == RoomLink(
        "http://192.168.1.20:8501/Reusing_Past_KV?room=abc")
    assert room_link(page, "abc", "", 8501, "10.0.0.5").url == "http://10.0.0.5:8501/Reusing_Past_KV?room=abc"
    assert room_link(page, "abc", "192.168.1.20", 8502, None).url == "http://192.168.1.20:8502/Reusing_Past_KV?room=abc"
    # `python -m kvviz serve` (127.0.0.1): no phone can connect, whatever address the machine has
    assert room_link(page, "abc", "127.0.0.1", 8501, "192.168.1.20") == RoomLink(None, "room.link_loopback_only")
    assert room_link(page, "abc", "0.0.0.0", 8501, None) == RoomLink(None, "room.link_no_network")
    # a hosted demo behind its proxy, or a lecturer who opened the network address: kept as it is
    hosted = "https://kvviz.example.org/Check?lang=ko"
    assert room_link(hosted, "abc", "127.0.0.1", 7860, None).url == "https://kvviz.example.org/Check?room=abc"
    assert room_link("http://192.168.1.20:8501/", "abc", "0.0.0.0", 8501, "10.0.0.1").url == \
        "http://192.168.1.20:8501/?room=abc"
    assert listens_on_network("::") and not listens_on_network("127.0.0.1") and not listens_on_network("localhost")


def test_network_address_is_never_loopback_and_falls_back_to_the_interfaces(monkeypatch):
    found = network_address()
    assert found is None or not ipaddress.ip_address(found).is_loopback
    interfaces = network._interface_addresses()
    assert all(not ipaddress.ip_address(a).is_loopback for a in interfaces)
    monkeypatch.setattr(network, "_routed_address", lambda: None)  # no default route: a hotspot without internet
    assert network_address() == (sorted(interfaces, key=lambda a: not ipaddress.ip_address(a).is_private)[0]
                                 if interfaces else None)
