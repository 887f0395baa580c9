"""The page's choices turned into a run's settings, without Streamlit: the eviction budgets every method shares and
the decode steps whose kept positions and attention are recorded."""
from kvviz.compression.eviction import SNAPKV_WINDOW
from kvviz.compression.quality import SMALL_MODEL_PARAMS, chunk_steps, eviction_budgets, page_tokens


def test_budgets_are_the_shares_of_the_chunk_raised_to_snapkvs_window():
    assert eviction_budgets([0.25, 0.5], 512) == ([128, 256], [])
    # below SnapKV's window and one more, a share is raised for every method, and said so
    assert SNAPKV_WINDOW == 32
    assert eviction_budgets([0.25, 0.5], 64) == ([33], [0.25, 0.5])  # 16 and 32 positions: both raised to 33
    assert eviction_budgets([0.25, 0.5], 128) == ([33, 64], [0.25])
    budgets, raised = eviction_budgets([0.5, 0.25, 0.5], 1024)
    assert budgets == [256, 512] and raised == []  # one budget per share, in order


def test_chunk_steps_record_the_first_quarters_and_last_decode_step():
    assert chunk_steps(256) == (128, (0, 32, 64, 95, 127))
    n_prompt, steps = chunk_steps(7)
    assert n_prompt == 3 and steps == (0, 1, 2, 3)  # repeated steps of a short chunk once each


def test_the_page_starts_a_larger_model_on_one_default_chunk():
    # the shipped model (4,695,744 parameters) and SmolLM2-135M (134,515,008), as load_backend counts them
    assert page_tokens(4_695_744) == 512 and page_tokens(SMALL_MODEL_PARAMS) == 512
    assert page_tokens(134_515_008) == 256  # one chunk of the default 256: half the passes of 512
