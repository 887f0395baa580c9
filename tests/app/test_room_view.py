"""Issue 44: one page record. A room view is published under its page's registered name and followed under the
same name (both from kvviz/app/navigation.py); a view under a wrong name, from a page no room follows, or with a
page field that clashes with the room's own is refused where it is made, not left for a follower to wait on."""
import ast
from pathlib import Path

import pytest

from kvviz.app.navigation import FOLLOWED, HOME, PAGES, page_named, page_of
from kvviz.app.room.view import RoomView

ROOT = Path(__file__).resolve().parents[2]


def test_the_followed_list_is_derived_from_the_registry():
    assert FOLLOWED == tuple(p for p in PAGES if p.followed) and HOME not in FOLLOWED
    assert [p.path for p in FOLLOWED] == sorted((f"pages/{f.name}" for f in (ROOT / "pages").glob("*.py")),
                                               key=[p.path for p in PAGES].index)
    names = [p.name for p in PAGES]
    assert len(set(names)) == len(names)  # one name each
    assert page_of(str(ROOT / "pages" / "8_Compressing_the_Cache.py")) == page_named("compression")
    with pytest.raises(KeyError):
        page_named("compress")  # an old name is gone, not an alias


@pytest.mark.parametrize("page", FOLLOWED, ids=[p.name for p in FOLLOWED])
def test_a_view_round_trips_under_its_pages_name(page):
    view = RoomView(page.path, page.name, {"shown": [0], "n_steps": 3}, explore={"kv_model": "tiny"},
                    picks={"layer": 1})
    snapshot = view.to_json()
    assert snapshot == {"page": page.name, "path": page.path, "explore": {"kv_model": "tiny"}, "picks": {"layer": 1},
                        "shown": [0], "n_steps": 3}  # flat: the store's snapshot reads as one dict
    back = RoomView.from_json(snapshot)
    assert back == view and back["n_steps"] == 3 and "shown" in back and back.get("missing") is None


def test_a_view_under_a_wrong_name_is_refused():
    reuse, spec = page_named("reuse"), page_named("spec")
    with pytest.raises(ValueError, match="followers wait on 'reuse'"):
        RoomView(reuse.path, spec.name, {"n_steps": 1})  # Reusing Past K/V's file publishing as another page
    with pytest.raises(ValueError, match="not a page a room follows"):
        RoomView(HOME.path, HOME.name)
    with pytest.raises(ValueError, match="does not register"):
        RoomView("pages/99_Nothing.py")
    with pytest.raises(ValueError, match="room's own names"):
        RoomView(reuse.path, reuse.name, {"explore": {}})  # the settings go in `explore`, not beside the data
    assert RoomView(HOME.path).to_json() == {"page": None, "path": HOME.path}  # the lecturer is on Home


@pytest.mark.parametrize("page", FOLLOWED, ids=[p.name for p in FOLLOWED])
def test_each_followed_page_takes_its_name_from_the_registry(page):
    """The page file never types its name: PAGE = page_of(__file__), and the room's part and its publishing go
    through it (a Sharing publishes under PAGE's name; a follower waits on PAGE's name)."""
    tree = ast.parse((ROOT / page.path).read_text())
    assigns = [ast.unparse(n) for n in tree.body if isinstance(n, ast.Assign)]
    assert "PAGE = page_of(__file__)" in assigns
    calls = {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    assert "room_part" in calls or "answer_question" in calls  # the Check page's follower answers its question
    text = (ROOT / page.path).read_text()
    assert f'"{page.name}", PAGE' not in text and f'"page": "{page.name}"' not in text
