"""A lecture room's follower on Serving Engine sees the lecturer's cache-events picture, drawn from the numbers the
lecturer's page published (room_view's "kv_events"), and never subscribes: drawn in Streamlit's AppTest with the
subscriber made to fail if anything starts one."""
import json

from streamlit.testing.v1 import AppTest

from kvviz.serving.kv_events import Batch, Stored
from kvviz.serving.kv_tree import BlockTree


def lecturer_view() -> dict:
    """What the lecturer's page publishes after a drawing: kv_events.panel's state as plain data, through JSON."""
    tree = BlockTree()
    tree.apply(Batch(0, 1.0, [Stored((1, 2, 3), None, tuple(range(12)), 4, "GPU", 0),
                              Stored((4,), 2, tuple(range(4)), 4, "CPU", 0)], "map"))
    state = {"endpoint": "tcp://10.0.0.5:5557", "replay_endpoint": None, "status": "receiving", "retries": 0,
             "summary": tree.summary(), "chains": tree.chains(), "rates": tree.rate_rows(), "folded": 1,
             "frames": 1, "elapsed_s": 3.0, "per_token": 131072}
    view = {"page": "serving", "shown": None, "engine": "vllm", "model": "m", "n_requests": 0, "live_charts": False,
            "load": None, "prefix": None, "kv_events": state}
    return json.loads(json.dumps(view))


def draw_follower(view_json: str) -> None:
    import json

    import kvviz.app.views.kv_events as ke
    from kvviz.app.views.serving import follow

    class NoSubscribing:
        def __init__(self, *a, **k):
            raise AssertionError("a follower subscribed")

    ke.Watch = NoSubscribing
    follow(json.loads(view_json), lecture=False)


def test_follower_draws_the_lecturers_tree_without_subscribing():
    at = AppTest.from_function(draw_follower, args=(json.dumps(lecturer_view()),), default_timeout=60)
    at.run()
    assert not at.exception
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Cached blocks"] == "4" and metrics["Tokens"] == "16" and metrics["KV bytes"] == "2.00 MiB"
    assert not at.text_input  # no endpoint box, no Subscribe: nothing of the lecturer's server reachable from here
    assert any("GPU 3" in c.value and "CPU 1" in c.value for c in at.caption)
