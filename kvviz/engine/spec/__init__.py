"""Speculative decoding on the real cache: a draft proposes k tokens, the target verifies them in one pass over
k + 1 positions, and the positions it rejects are rolled back out of every cache, in place.

ngram.py: prompt lookup, vLLM's `ngram` method (no model, no cache).
sampling.py: which drafted tokens the target keeps: greedy agreement, or rejection sampling (Leviathan et al. 2023,
    Chen et al. 2023) under temperature.
drafts.py: the three drafts: n-gram, early exit (the target's first m layers, sharing its cache), a separate model.
decoding.py: SpeculativeGeneration (prefill, then step = draft → verify → accept → roll back), its measured events
    and vLLM's acceptance metrics; the GPU roofline prediction for the same steps.
"""
