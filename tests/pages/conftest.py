import pytest


@pytest.fixture
def store():
    """The lecture rooms' store, emptied: the in-process one a lecturer's and followers' AppTest sessions share."""
    from kvviz.app.room.session import room_store
    from kvviz.room.store import MemoryStore

    room_store.clear()
    store = room_store()
    assert isinstance(store, MemoryStore)  # KVVIZ_ROOM_STORE unset: the in-process store both sessions share
    return store
