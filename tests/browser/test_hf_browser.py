"""A saved Hugging Face model chosen in the sidebar of a real browser: its architecture, or a clear error."""
import pytest
import torch
from playwright.sync_api import expect
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from tests.browser.harness import wait_idle


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("smol-llama")
    config = LlamaConfig(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    LlamaForCausalLM(config).save_pretrained(path)
    tok = Tokenizer(models.WordLevel({"<unk>": 0, "the": 1, "cache": 2}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(path)
    return path


def choose_hf_model(page, name: str, model_label: str, box_label: str) -> None:
    sidebar = page.get_by_test_id("stSidebar")
    sidebar.get_by_test_id("stSelectbox").first.click()
    page.get_by_role("option", name=model_label).click()
    wait_idle(page)
    box = sidebar.get_by_label(box_label)
    box.fill(name)
    box.press("Enter")
    wait_idle(page)


def test_sidebar_loads_a_saved_hf_model(page, shots, llama_dir):
    page.goto_app()
    choose_hf_model(page, str(llama_dir), "Hugging Face model", "Model directory or hub id")
    expect(page.get_by_text(f"{llama_dir.name} (llama) · 2 layers · 4/2 heads (GQA) · d_head 16")).to_be_visible()
    assert page.locator("[data-testid='stException']").count() == 0
    page.screenshot(path=shots / "hf_model_en.png", full_page=True)

    choose_hf_model(page, "kvviz-test/absent-model", "Hugging Face model", "Model directory or hub id")
    expect(page.get_by_test_id("stAlertContentError")).to_contain_text("offline")
    page.screenshot(path=shots / "hf_offline_en.png", full_page=True)
    assert page.console_errors == []


def test_korean_error_for_a_non_model_directory(page, shots, tmp_path):
    page.goto_app(query="?lang=ko")
    choose_hf_model(page, str(tmp_path), "Hugging Face 모델", "모델 디렉터리 또는 허브 ID")
    expect(page.get_by_test_id("stAlertContentError")).to_contain_text("config.json 없음")
    assert page.locator("[data-testid='stException']").count() == 0
    page.screenshot(path=shots / "hf_no_model_ko.png", full_page=True)
