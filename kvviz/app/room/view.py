"""RoomView: the record a lecturer's page publishes to its room and a follower's page draws. Its JSON is flat (the
room's own fields beside the page's), so a store's snapshot reads as one dict."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvviz.app.navigation import FOLLOWED, page_at

OWN = ("page", "path", "explore", "picks")  # the room's fields; a page's `data` may not use these names


@dataclass(frozen=True)
class RoomView:
    """What a lecturer's page draws, as plain JSON (small lists and numbers, or the inputs of a pure computation;
    never a tensor).

    path: the lecturer's page file (navigation's Page.path): a follower on another page is linked there;
    page: that page's name when it has something to show (a follower draws it only on the page of that name);
        None: no run yet, a reset, a model it cannot use: followers wait;
    data: the page's own fields, read by its view module's `follow` as view[name];
    explore: the lecturer's settings for "Explore from here" (explore.page_settings), or None;
    picks: what the lecturer picked to draw with (a layer, a metric, a GPU), drawn with by a follower, or None.
    """

    path: str
    page: str | None = None
    data: Mapping[str, Any] = field(default_factory=dict)
    explore: Mapping[str, Any] | None = None
    picks: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        registered = page_at(self.path)
        if registered is None:
            raise ValueError(f"a room view from {self.path!r}, a page navigation does not register")
        if self.page is not None and (self.page != registered.name or registered not in FOLLOWED):
            raise ValueError(f"{self.path} publishes as {self.page!r}: its followers wait on {registered.name!r}"
                             if registered in FOLLOWED else f"{self.path} is not a page a room follows")
        if clash := set(OWN) & set(self.data):
            raise ValueError(f"a room view's data may not use the room's own names {sorted(clash)}")

    def __getitem__(self, name: str) -> Any:
        return self.data[name]

    def __contains__(self, name: object) -> bool:
        return name in self.data

    def get(self, name: str, default: Any = None) -> Any:
        return self.data.get(name, default)

    def to_json(self) -> dict[str, Any]:
        """The store's snapshot: page and path, explore and picks when set, then the page's own fields."""
        own = {"page": self.page, "path": self.path}
        own |= {k: v for k, v in (("explore", self.explore), ("picks", self.picks)) if v is not None}
        return {**own, **self.data}

    @classmethod
    def from_json(cls, snapshot: Mapping[str, Any]) -> RoomView:
        return cls(snapshot["path"], snapshot.get("page"), {k: v for k, v in snapshot.items() if k not in OWN},
                   snapshot.get("explore"), snapshot.get("picks"))
