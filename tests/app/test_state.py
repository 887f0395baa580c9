"""The session-key registry: keys are declared once with defaults, seeded without overwriting, reset to fresh copies."""
import pytest

from kvviz.app.state import REGISTRY, page_state


def test_seed_fills_only_missing_keys_with_fresh_copies():
    keys = page_state("t1", items=[], mode="a")
    state = {"t1_mode": "b"}
    keys.seed(state)
    assert state == {"t1_mode": "b", "t1_items": []}
    state["t1_items"].append(1)
    keys.reset("items", state=state)
    assert state["t1_items"] == [] and keys.defaults["items"] == []  # the default itself was never mutated
    assert REGISTRY["t1"] is keys


def test_an_undeclared_name_or_a_second_declaration_is_refused():
    keys = page_state("t2", a=1)
    with pytest.raises(KeyError, match="no session key 'b'"):
        keys.key("b")
    with pytest.raises(ValueError, match="declared twice"):
        page_state("t2", a=1, b=2)
    assert keys.get("a", {}) == 1 and keys.get("a", {"t2_a": 5}) == 5


def test_pop_takes_a_flag_out_once():
    keys = page_state("t3", start=False, run=None)
    state = {"t3_start": True}
    assert keys.pop("start", state) is True and "t3_start" not in state
    assert keys.pop("start", state) is False and keys.pop("run", state) is None and state == {}
    with pytest.raises(KeyError, match="no session key 'other'"):
        keys.pop("other", state)
