"""Prompt lookup decoding as vLLM's `ngram` speculative method (vllm/v1/spec_decode/ngram_proposer.py,
NgramProposer.propose → _find_longest_matched_ngram_and_propose_tokens).

The last n tokens of the context (n from prompt_lookup_max down to prompt_lookup_min) are looked up earlier in the
context; the k tokens that followed the match are the draft. The longest matching n wins; among matches of that
length the earliest one in the context; fewer than k tokens when the context ends sooner; none without a match.
No model and no KV cache: the draft costs nothing on the accelerator.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvviz.errors import InputError

# vLLM's SpeculativeConfig.__post_init__: with neither bound given both are 5 ("arbitrarily chosen"); with one given,
# the other takes its value.
VLLM_DEFAULT_LOOKUP = 5


@dataclass(frozen=True)
class NgramConfig:
    prompt_lookup_min: int = VLLM_DEFAULT_LOOKUP
    prompt_lookup_max: int = VLLM_DEFAULT_LOOKUP

    def __post_init__(self) -> None:
        # The same checks as vLLM's SpeculativeConfig: both ≥ 1 and min ≤ max.
        for name in ("prompt_lookup_min", "prompt_lookup_max"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError("positive_int", name=name, value=value)
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise InputError("spec.lookup_order", low=self.prompt_lookup_min, high=self.prompt_lookup_max)

    @classmethod
    def from_bounds(cls, low: int | None, high: int | None) -> NgramConfig:
        """vLLM's defaulting: neither given → 5 and 5; one given → both that value."""
        if low is None and high is None:
            return cls()
        return cls(low if low is not None else high, high if high is not None else low)


def propose(tokens: Sequence[int], k: int, config: NgramConfig = NgramConfig(), max_model_len: int | None = None
            ) -> list[int]:
    """Up to k draft tokens: what followed the earliest earlier occurrence of the longest matching suffix."""
    total = len(tokens)
    if max_model_len is not None:
        k = min(k, max_model_len - total)  # never draft past the model's context
    if k <= 0 or total < config.prompt_lookup_min:
        return []
    for n in range(min(config.prompt_lookup_max, total - 1), config.prompt_lookup_min - 1, -1):
        suffix = list(tokens[total - n:])
        # An occurrence must end before the last token (it may overlap the suffix itself).
        for start in range(0, total - n):
            if list(tokens[start:start + n]) == suffix:
                return list(tokens[start + n:start + n + k])
    return []
