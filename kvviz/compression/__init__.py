"""Compressing the KV cache on a real model: eviction (window, StreamingLLM, H2O, SnapKV), quantized storage
(every format the table of KV formats says kvviz stores: KIVI int8/int4, KIVI-2, FP8) and MHA→GQA/MQA by
mean-pooling, each measured in bytes and in quality.

Modules: quant (quantize/dequantize and their error bounds), caches (the evicting and quantized caches),
eviction (the policies), pooling (MHA→GQA), runner (the decode loop), quality (perplexity, KL, top-1).
"""
