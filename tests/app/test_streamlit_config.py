"""The app's Streamlit settings that the pages rely on (.streamlit/config.toml)."""
from pathlib import Path

from streamlit import config

ROOT = Path(__file__).resolve().parents[2]


def test_no_element_is_sent_as_a_reference(monkeypatch):
    """Streamlit 1.67 keeps a superseded fragment run's references to large cached elements, which then point into
    a container the next run emptied: the decode page went blank after Pause. No message may be a reference."""
    monkeypatch.chdir(ROOT)  # Streamlit reads ./.streamlit/config.toml from where it runs, as `streamlit run` does
    monkeypatch.delenv("STREAMLIT_GLOBAL_MIN_CACHED_MESSAGE_SIZE", raising=False)
    config.get_config_options(force_reparse=True)
    assert config.get_option("global.minCachedMessageSize") >= 1e12  # larger than any message can be


def test_no_full_garbage_collection_after_each_run(monkeypatch):
    """Streamlit's gc.collect(2) after every run walked torch's and the model's objects holding the GIL (~300 ms on
    2 cores): a Step's finished deltas waited that long to be sent (bench/app_step_latency.py)."""
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("STREAMLIT_RUNNER_POST_SCRIPT_GC", raising=False)
    config.get_config_options(force_reparse=True)
    assert config.get_option("runner.postScriptGC") is False
