"""The same weights in two engines: greedy agreement of kvviz's decoder with a llama.cpp server, prompt by prompt.

Both engines get the same prompt token ids (llama.cpp's /completion takes ids, so tokenization cannot differ).
llama.cpp decodes n_new tokens greedily; kvviz reads prompt + llama.cpp's continuation in one pass. The request sets
`ignore_eos`, with which llama-server biases every end-of-generation token to −inf before sampling
(tools/server/server-schema.cpp, "ignore_eos"; common/common.cpp, logit_bias_eog), so its sampled token is not
always its own argmax: the engines are compared on the argmax of the logits, which llama-server reports before any
sampler (`n_probs` with post_sampling_probs off: get_token_probabilities, tools/server/server-common.cpp). Per prompt:
- `forced_equal`: steps at which kvviz, given llama.cpp's own prefix, picks llama.cpp's argmax: agreement one
  step at a time, not carried away by an earlier divergence (where llama.cpp reports no probabilities, inside a
  UTF-8 character, its sampled token stands for its argmax);
- `first_divergence`: the first step where they pick differently (n_new when never), which is where two free
  greedy runs part; with `free_run` kvviz also decodes on its own (prefill, then cached steps) and
  `free_first_divergence`, `positions_equal` and kvviz's text come from that run (against llama.cpp's sampled
  tokens: where kvviz ends the text, llama.cpp was told not to);
- both engines' top-1 − top-2 logit margin at the first divergence (kvviz's logits, llama.cpp's log-probabilities
  from `n_probs`), the largest gap by which kvviz prefers its own pick where they disagree, and the largest
  difference between the two engines' log-probabilities of llama.cpp's token: they part only at near ties, by less
  than their logits differ anywhere (a wide gap would be a bug, not rounding).
bench/llamacpp_agreement.py prints the table; tests/engine/test_llamacpp_smollm2.py bounds it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import httpx
import torch

from kvviz.engine.generation import Generation

# Ten prompts: facts, prose, code, digits (SmolLM2 splits each digit), Korean, and the model's chat template.
PROMPTS = (
    "The capital of France is",
    "A KV cache stores",
    "In 2024, 12345 apples cost $3.50 at",
    "Once upon a time, in a small village,",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "The theory of relativity states that",
    "1, 2, 3, 5, 8, 13,",
    "한국어 문장입니다.",
    "서울은 대한민국의 수도이며",
    "<|im_start|>user\nWhat is a KV cache?<|im_end|>\n<|im_start|>assistant\n",
)

# Text where byte-level BPE tokenizers part ways: runs of spaces and newlines (GPT-2's \s+(?!\S)), trailing
# space, tabs, contractions in both cases, numerals that are not ASCII digits, emoji, mixed scripts, special tokens
# inside text.
TOKENIZER_TEXTS = (
    "Hello  world   and    more",
    "trailing space ",
    "lines\n\n\nand\ttabs\t\tend\n",
    "  leading spaces",
    "I'm sure they'll say it's fine, DON'T YOU'LL WE'VE",
    "x=3.14159; y=-2e10; z=0x1F",
    "½ ² Ⅻ ٣٤ ১২",
    "emoji 🙂👍🏽 and ✨",
    "가나다라 마바사, 한국어 123 숫자와 English 섞기",
    "日本語とにほんご、中文",
    "<|im_start|>system\nYou are helpful.<|im_end|>",
    "café naïve résumé",
)


@dataclass(frozen=True)
class PromptAgreement:
    prompt: str
    prompt_tokens: int
    n_new: int
    forced_equal: int
    first_divergence: int  # == n_new when they agree at every step
    kvviz_margin: float | None  # kvviz's top-1 − top-2 logit at the first divergence
    llamacpp_margin: float | None  # the same from llama.cpp's log-probabilities (None inside a UTF-8 character)
    logprob_diff_max: float  # max over steps of |kvviz − llama.cpp| log-probability of llama.cpp's token
    logprob_steps: int  # the steps llama.cpp reported a log-probability for (whole UTF-8 characters)
    disagreement_gap_max: float | None  # max over disagreeing steps of kvviz's logit(own pick) − logit(llama.cpp's)
    eog_argmax_steps: int  # steps whose argmax (both engines') is an end-of-generation token ignore_eos kept out
    llamacpp_text: str
    free_first_divergence: int | None = None  # the free runs (free_run=True only)
    positions_equal: int | None = None
    kvviz_text: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def llamacpp_greedy(backend, base_url: str, prompt_ids: list[int], n_new: int,  # noqa: ANN001 - a Backend
                    timeout_s: float = 300.0
                    ) -> tuple[list[int], list[float | None], list[float | None], list[int | None]]:
    """llama.cpp's greedy tokens on token ids, the log-probability of each, its top-1 − top-2 gap and its argmax at
    each step (log-probabilities before sampling, `n_probs`: the argmax may be an end-of-generation token that
    ignore_eos kept from being sampled). llama-server keeps a token's probabilities only when the text
    so far ends in a whole UTF-8 character (server_context::process_token, tools/server/server-context.cpp): a
    token inside a character (a Korean syllable is three byte tokens) has None."""
    body = {"prompt": prompt_ids, "n_predict": n_new, "temperature": 0.0, "top_k": 1, "ignore_eos": True,
            "cache_prompt": False, "return_tokens": True, "samplers": ["top_k"], "n_probs": 2,
            "post_sampling_probs": False}
    response = httpx.post(base_url + "/completion", json=body, timeout=timeout_s)
    response.raise_for_status()
    out = response.json()
    tokens, reported = out["tokens"], iter(out["completion_probabilities"])
    logprobs: list[float | None] = []
    margins: list[float | None] = []
    argmax: list[int | None] = []
    for i, tok in enumerate(tokens):
        if backend.tokenizer.decode(tokens[: i + 1]).endswith("\ufffd"):  # inside a character: nothing reported
            logprobs.append(None)
            margins.append(None)
            argmax.append(None)
            continue
        step = next(reported)
        if step["id"] != tok:
            raise RuntimeError(f"llama-server's probabilities do not line up with its tokens at step {i}")
        logprobs.append(step["logprob"])
        margins.append(step["top_logprobs"][0]["logprob"] - step["top_logprobs"][1]["logprob"])
        argmax.append(step["top_logprobs"][0]["id"])
    return tokens, logprobs, margins, argmax


def compare(backend, prompt: str, base_url: str, n_new: int = 64,  # noqa: ANN001 - a Backend
            free_run: bool = False) -> PromptAgreement:
    """One prompt through both engines (see the module's note)."""
    ids = backend.tokenizer.encode(prompt)
    theirs, their_logprobs, their_margins, their_argmax = llamacpp_greedy(backend, base_url, ids, n_new)
    their_picks = [tok if top is None else top for tok, top in zip(theirs, their_argmax, strict=True)]
    x = torch.tensor([ids + theirs[:-1]], device=backend.device)
    forced = backend.forward(x, None, capture_attention=False, all_logits=True).logits[0, len(ids) - 1:].float().cpu()
    picks = forced.argmax(-1).tolist()
    equal = [a == b for a, b in zip(picks, their_picks, strict=True)]
    first = equal.index(False) if not all(equal) else n_new
    top2 = forced[first].topk(2).values if first < n_new else None
    steps = torch.arange(n_new)
    ours_lp = torch.log_softmax(forced, -1)[steps, theirs]
    reported = [i for i, lp in enumerate(their_logprobs) if lp is not None]
    lp_diff = (ours_lp[reported] - torch.tensor([their_logprobs[i] for i in reported])).abs()
    gaps = (forced[steps, picks] - forced[steps, their_picks])[~torch.tensor(equal)]
    free = {}
    if free_run:
        gen = Generation(backend, max_new_tokens=n_new, stop_at_eos=False)
        gen.run(ids)
        ours = gen.generated[0]
        free = {"free_first_divergence": next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=True))
                                               if a != b), n_new),
                "positions_equal": sum(a == b for a, b in zip(ours, theirs, strict=True)),
                "kvviz_text": backend.tokenizer.decode(ours)}
    return PromptAgreement(
        prompt=prompt, prompt_tokens=len(ids), n_new=n_new, forced_equal=sum(equal), first_divergence=first,
        kvviz_margin=None if top2 is None else float(top2[0] - top2[1]),
        llamacpp_margin=their_margins[first] if first < n_new else None,
        logprob_diff_max=float(lp_diff.max()),
        logprob_steps=len(reported),
        disagreement_gap_max=float(gaps.max()) if len(gaps) else None,
        eog_argmax_steps=sum(a == b != t for a, b, t in zip(picks, their_picks, theirs, strict=True)),
        llamacpp_text=backend.tokenizer.decode(theirs), **free)


def greedy_agreement(backend, base_url: str, prompts: tuple[str, ...] = PROMPTS,  # noqa: ANN001 - a Backend
                     n_new: int = 64, free_run: bool = False) -> list[PromptAgreement]:
    return [compare(backend, p, base_url, n_new, free_run) for p in prompts]


def llamacpp_tokenize(base_url: str, text: str) -> list[int]:
    """llama.cpp's tokenizer on text, special tokens parsed and none added (llama-server /tokenize)."""
    response = httpx.post(base_url + "/tokenize", json={"content": text, "add_special": False,
                                                         "parse_special": True}, timeout=30)
    response.raise_for_status()
    return response.json()["tokens"]
