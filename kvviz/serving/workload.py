"""What a serving benchmark sends and when, as `vllm bench serve` builds it.

References (vllm-project/vllm, read at the commits named):
- vllm/benchmarks/datasets.py @0056b87f: RandomDataset.get_sampling_params (input and output lengths drawn
  uniformly from [⌊L·(1 − r)⌋, ⌈L·(1 + r)⌉], output at least 1; --random-range-ratio r in [0, 1)), a shared prefix
  of --random-prefix-len tokens before each prompt, ShareGPTDataset (a JSON list of {"conversations": [...]}:
  the first turn is the prompt, the second's token count the output length unless --sharegpt-output-len gives
  one; shuffled with the seed; oversampled with the seed when short), CustomDataset (JSONL of {"prompt": ...}),
  and dataset_utils.is_valid_sequence (ShareGPT pairs kept only with prompt and output ≥ 4 tokens, prompt ≤ 1024,
  both ≤ 2048).
- vllm/benchmarks/serve.py @009e6d4a, get_request: arrival gaps drawn from a gamma distribution with shape
  = burstiness and scale = 1 / (rate · burstiness) (burstiness 1: a Poisson process; < 1 burstier; ∞ evenly
  spaced), their running sum rescaled so the last request arrives at n / rate; rate ∞ sends everything at 0.

kvviz's prompts differ in one way: they are exact token ids from the server's own /tokenize (each request's own
number first, so no two share a cached prefix), not decoded random ids; where the server has no /tokenize
(or for the chat endpoint) they are text of about that many words, and the result says so.
"""
from __future__ import annotations

import json
import math
import random
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import numpy as np

from kvviz.errors import InputError
from kvviz.serving import client as api

FILLER = ("The keys and values of earlier tokens never change under a causal mask, so a serving engine "
          "keeps them in a paged cache and each new token only computes its own. ")
SYSTEM_PROMPT = ("You are the assistant of a serving benchmark. Every request in this run begins with these same "
                 "instructions, so an engine with a prefix cache computes their keys and values once. ")
# Each request's first tokens, drawn from these (most are one token each in a byte-level BPE vocabulary).
LEAD_WORDS = (
    "apple river stone cloud garden window candle forest silver harbor meadow lantern pepper violin desert "
    "island marble orchid pilot rocket saddle temple umbrella valley wagon anchor basket cactus dolphin engine "
    "feather glacier hammer igloo jacket kettle ladder magnet needle oyster parrot quartz ribbon scarf tiger "
    "tunnel velvet walnut yogurt zebra arrow bubble copper dragon ember falcon ginger helmet ivory jungle koala "
    "lemon mango nickel olive panda quilt radish salmon tomato urchin vapor wizard yacht acorn beacon cobalt "
    "dune eagle fossil gravel hazel indigo jasmine kayak lotus maple nectar onyx pebble quiver raven sapphire "
    "thistle tulip vessel willow amber bison cedar daisy emerald fern goblet heron iris juniper kelp lilac "
    "mist nutmeg otter plum quill reef sparrow thunder vanilla whale badger canyon comet crystal dagger "
    "elbow fabric galaxy hollow insect jigsaw kernel lagoon mirror nomad orbit puzzle rabbit shadow timber "
    "vortex winter blossom castle circus cobweb cricket crown diamond donkey empire fiddle flame frost "
    "goose harvest hornet jelly kitten lobster mammoth monkey muffin napkin ocean palace pearl pigeon "
    "pocket pumpkin rainbow saturn shovel spider statue summit tractor trumpet turtle volcano waffle beetle "
    "biscuit blanket bronze button camel cherry cotton coyote crater cushion dinner dragonfly feast forge "
    "gecko glove gorilla granite hamster hedgehog honey iceberg jaguar lizard llama meteor mushroom orange "
    "penguin pirate planet prism raccoon robin sailor sandal scorpion sheep spinach squirrel stallion "
    "sunflower tadpole teapot thimble toffee tornado trolley tundra unicorn vulture walrus yarn zeppelin")
# vllm/benchmarks/dataset_utils.py is_valid_sequence defaults
MIN_LEN, MAX_PROMPT_LEN, MAX_TOTAL_LEN = 4, 1024, 2048


@dataclass(frozen=True)
class SampleRequest:
    """One request to send (vllm/benchmarks/datasets.py SampleRequest)."""

    prompt: str | list[int]
    prompt_len: int | None  # tokens as the server counts them; None where it cannot tell us
    expected_output_len: int


@dataclass(frozen=True)
class Workload:
    """The requests of one point: random lengths around a mean, a shared prefix, or a dataset file's prompts."""

    input_len: int = 128  # --random-input-len
    output_len: int = 64  # --random-output-len
    range_ratio: float = 0.0  # --random-range-ratio
    prefix_len: int = 0  # --random-prefix-len: a system prompt every request shares
    dataset_path: str | None = None  # ShareGPT JSON / JSONL, or JSONL of {"prompt": ...}
    sharegpt_output_len: int | None = None  # the dataset's own output lengths unless given
    seed: int = 0

    def to_dict(self) -> dict:
        return asdict(self)

    def check(self) -> None:
        if not 0.0 <= self.range_ratio < 1.0:
            raise InputError("serving.bad_range_ratio", value=self.range_ratio)
        if self.prefix_len < 0:
            raise InputError("positive_int", name="prefix_len", value=self.prefix_len)
        if self.dataset_path is not None and not Path(self.dataset_path).is_file():
            raise InputError("serving.no_dataset", path=self.dataset_path)


def length_bounds(mean: int, range_ratio: float, *, at_least: int = 0) -> tuple[int, int]:
    """[⌊mean·(1 − r)⌋, ⌈mean·(1 + r)⌉], as vLLM's RandomDataset.get_sampling_params bounds a length."""
    low, high = math.floor(mean * (1 - range_ratio)), math.ceil(mean * (1 + range_ratio))
    return max(low, at_least), max(high, at_least)


def sample_lengths(n: int, workload: Workload, rng: np.random.Generator) -> tuple[list[int], list[int]]:
    """Each request's input and output length, drawn uniformly (integers, both ends included)."""
    in_lo, in_hi = length_bounds(workload.input_len, workload.range_ratio, at_least=1)
    out_lo, out_hi = length_bounds(workload.output_len, workload.range_ratio, at_least=1)
    return (rng.integers(in_lo, in_hi + 1, size=n).tolist(), rng.integers(out_lo, out_hi + 1, size=n).tolist())


def arrival_times(n: int, request_rate: float, burstiness: float, rng: np.random.Generator) -> list[float]:
    """When each of n requests is sent, in seconds after the start (vLLM's get_request, without ramp-up)."""
    if burstiness <= 0:
        raise InputError("serving.bad_burstiness", value=burstiness)
    if request_rate <= 0:
        raise InputError("serving.bad_rate", value=request_rate)
    if math.isinf(request_rate):
        return [0.0] * n
    if math.isinf(burstiness):
        gaps = np.full(n, 1.0 / request_rate)
    else:
        gaps = rng.gamma(shape=burstiness, scale=1.0 / (request_rate * burstiness), size=n)
    times = np.cumsum(gaps)
    if n and times[-1] != 0:
        times *= (n / request_rate) / times[-1]  # the last one lands on n / rate, whatever the draw
    return times.tolist()


def random_requests(server: api.Server, model: str, n: int, workload: Workload, endpoint: str, *,
                    rng: np.random.Generator, lead_rng: np.random.Generator | None = None,
                    client: httpx.Client | None = None) -> tuple[list[SampleRequest], bool]:
    """n requests of the drawn lengths. After the shared prefix, each begins with two tokens of its own (the
    first different for every request of the point, both drawn by `lead_rng`, fresh each run), so no two share
    more than that prefix, nor with anything an earlier run left cached: prefix caches reuse a common prefix
    only, so the text after them may be the same. The second value: exact token ids (True) or text of about
    that many words (False)."""
    input_lens, output_lens = sample_lengths(n, workload, rng)
    lead_rng = lead_rng or np.random.default_rng()
    body = FILLER * (max(input_lens) // 10 + 2)
    system = SYSTEM_PROMPT + FILLER * (workload.prefix_len // 10 + 2)
    if endpoint == "completions":
        head = api.tokenize(server, model, system, client) if workload.prefix_len else []
        pool = list(dict.fromkeys(api.tokenize(server, model, LEAD_WORDS, client) or []))
        body_ids = api.tokenize(server, model, body, client)
        if head is not None and len(head) >= workload.prefix_len and body_ids is not None and len(pool) >= 2:
            first, second = _leads(len(pool), n, lead_rng)
            return [SampleRequest((head[:workload.prefix_len] + [pool[a], pool[b]] + body_ids)[
                        :workload.prefix_len + k], workload.prefix_len + k, o)
                    for a, b, k, o in zip(first, second, input_lens, output_lens, strict=True)], True
    words, body_words, head_words = LEAD_WORDS.split(), body.split(), system.split()[:workload.prefix_len]
    first, second = _leads(len(words), n, lead_rng)
    return [SampleRequest(" ".join(head_words + ([words[a], words[b]] + body_words)[:k]), None, o)
            for a, b, k, o in zip(first, second, input_lens, output_lens, strict=True)], False


def _leads(pool: int, n: int, rng: np.random.Generator) -> tuple[list[int], list[int]]:
    """Indices of each request's two leading tokens: the first distinct across requests (while the pool lasts)."""
    first = rng.permutation(pool)[:n].tolist()
    while len(first) < n:
        first += rng.permutation(pool)[:n - len(first)].tolist()
    return first, rng.integers(0, pool, size=n).tolist()


def read_dataset(path: str | Path) -> list[tuple[str, str | None]]:
    """(prompt, completion or None) pairs from a ShareGPT JSON list, or JSONL whose lines are ShareGPT entries
    or {"prompt": ...} objects. A ShareGPT entry needs two turns (vLLM drops shorter ones too)."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        data = json.loads(text)
        entries = data if isinstance(data, list) else [data]
    except ValueError:
        try:
            entries = [json.loads(line) for line in text.splitlines() if line.strip()]
        except ValueError as exc:
            raise InputError("serving.bad_dataset", path=str(path), detail=str(exc)[:80]) from None
    pairs: list[tuple[str, str | None]] = []
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        turns = entry.get("conversations")
        if isinstance(turns, list) and len(turns) >= 2 and all(isinstance(t, dict) for t in turns[:2]):
            prompt, completion = turns[0].get("value"), turns[1].get("value")
            if isinstance(prompt, str) and isinstance(completion, str):
                pairs.append((prompt, completion))
        elif isinstance(entry.get("prompt"), str):
            pairs.append((entry["prompt"], None))
    if not pairs:
        raise InputError("serving.bad_dataset", path=str(path), detail="no ShareGPT conversation or prompt")
    return pairs


def valid_sequence(prompt_len: int, output_len: int, *, skip_min_output_len_check: bool = False) -> bool:
    """vllm/benchmarks/dataset_utils.py is_valid_sequence, with its defaults."""
    too_short = prompt_len < MIN_LEN or (not skip_min_output_len_check and output_len < MIN_LEN)
    return not (too_short or prompt_len > MAX_PROMPT_LEN or prompt_len + output_len > MAX_TOTAL_LEN)


def dataset_requests(server: api.Server, model: str, n: int, workload: Workload, *,
                     client: httpx.Client | None = None) -> list[SampleRequest]:
    """n requests from the dataset file, in vLLM's order: shuffled with the seed, invalid pairs skipped, then
    oversampled with the seed when fewer than n remain. Lengths by the server's tokenizer (with the tokens it
    adds, as vLLM's tokenizer(prompt) counts them); without /tokenize, unknown and unfiltered."""
    assert workload.dataset_path is not None
    pairs = read_dataset(workload.dataset_path)
    random.Random(workload.seed).shuffle(pairs)
    fixed = workload.sharegpt_output_len
    out: list[SampleRequest] = []
    for prompt, completion in pairs:
        if len(out) >= n:
            break
        ids = api.tokenize(server, model, prompt, client, add_special=True)
        if completion is None or fixed is not None:
            output_len = fixed if fixed is not None else workload.output_len
        else:
            done = api.tokenize(server, model, completion, client, add_special=True)
            output_len = len(done) if done is not None else workload.output_len
        if ids is not None and not valid_sequence(len(ids), output_len,
                                                   skip_min_output_len_check=fixed is not None or completion is None):
            continue
        out.append(SampleRequest(prompt, None if ids is None else len(ids), output_len))
    if not out:
        raise InputError("serving.bad_dataset", path=workload.dataset_path,
                         detail=f"no pair within {MIN_LEN}..{MAX_PROMPT_LEN} prompt, ≤ {MAX_TOTAL_LEN} total tokens")
    picker, sampled = random.Random(workload.seed), list(out)
    while len(out) < n:
        out.append(picker.choice(sampled))
    return out
