"""`python -m kvviz.training`: train the shipped tiny model on CPU, from nothing, deterministically.

Builds the English + Korean corpus (kvviz.training.corpus), trains a byte-level BPE on its training split,
then trains a small GQA decoder with AdamW and a cosine schedule, logging train and held-out loss per
language. The last `long_steps` steps train on 2048-token windows, so every position the app reaches was
trained. Same seed and thread count → the same tokenizer.json and the same weights, bit for bit.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from kvviz.engine.config import DecoderConfig
from kvviz.engine.model import Decoder
from kvviz.engine.shape import TINY_DIR
from kvviz.engine.tokenizer import EOS_TOKEN, BPETokenizer
from kvviz.training.corpus import Corpus, Document, build_corpus, write_held_out

EOS_ID = 0  # the first special token the BPE trainer adds

LANGS = ("en", "ko")

# The shipped shape: 8 query heads share 2 KV heads (GQA, groups of 4). 8192 tokens hold the common Korean
# syllables and words as well as English words.
TINY_SHAPE = DecoderConfig(
    n_layers=4, d_model=192, n_heads=8, n_kv_heads=2, d_ff=512, vocab_size=8192, max_seq_len=2048,
    bos_id=EOS_ID, eos_id=EOS_ID,
)


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 0
    steps: int = 6000
    batch_size: int = 4
    seq_len: int = 512
    long_steps: int = 250  # the last steps use one window of the whole context (same tokens per step)
    long_seq_len: int = 2048
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup_steps: int = 50
    weight_decay: float = 0.1
    eval_every: int = 100
    eval_tokens: int = 2048  # per language, during training
    final_eval_tokens: int = 16384  # per language, for the final numbers (a bounded CPU cost)
    # On the idle 2-core machine two threads trained 5,281 tokens/s and one 2,890 (20 steps of batch 4 each);
    # on a machine shared with other busy processes, pass --threads 1 (a team of two spin-waits on each other).
    threads: int = 2


def train_tokenizer(docs: Sequence[Document], vocab_size: int, path: Path) -> BPETokenizer:
    """Byte-level BPE (GPT-2 style): 256 byte symbols, merges up to vocab_size, EOS as id 0."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte, so any UTF-8 text encodes
        show_progress=False,
    )
    tok.train_from_iterator([d.text for d in docs], trainer)
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    bpe = BPETokenizer(path)
    assert bpe.eos_id == EOS_ID
    return bpe


def encode_docs(tokenizer: BPETokenizer, docs: Sequence[Document]) -> torch.Tensor:
    """One stream of ids: EOS before every document (so EOS also serves as BOS)."""
    ids: list[int] = []
    for doc in docs:
        ids.append(EOS_ID)
        ids.extend(tokenizer.encode(doc.text))
    return torch.tensor(ids, dtype=torch.int64)


def unigram_loss(train_ids: torch.Tensor, eval_ids: torch.Tensor, vocab_size: int) -> float:
    """Cross-entropy (nats/token) of the add-one-smoothed token frequencies of the training split."""
    counts = torch.bincount(train_ids, minlength=vocab_size).double() + 1.0
    logp = counts.log() - counts.sum().log()
    return float(-logp[eval_ids[1:]].mean())  # the same targets evaluation_loss predicts


@torch.no_grad()
def evaluation_nll(model: Decoder, ids: torch.Tensor, seq_len: int, max_tokens: int | None = None
                   ) -> tuple[float, torch.Tensor]:
    """Summed next-token cross-entropy (nats) over non-overlapping windows of `ids`, and the targets scored."""
    ids = ids[: max_tokens + 1] if max_tokens else ids
    total, targets = 0.0, []
    for start in range(0, len(ids) - 1, seq_len):
        chunk = ids[start : start + seq_len + 1]
        if len(chunk) < 2:
            break
        logits = model(chunk[None, :-1]).logits[0].float()
        total += float(F.cross_entropy(logits, chunk[1:], reduction="sum"))
        targets.append(chunk[1:])
    return total, torch.cat(targets)


def evaluation_loss(model: Decoder, ids: torch.Tensor, seq_len: int, max_tokens: int | None = None) -> float:
    """Mean next-token cross-entropy over non-overlapping windows of `ids` (nats/token)."""
    total, targets = evaluation_nll(model, ids, seq_len, max_tokens)
    return total / len(targets)


def token_byte_counts(tokenizer, ids: torch.Tensor) -> int:  # noqa: ANN001
    """UTF-8 bytes the tokens stand for (a special token such as EOS stands for none)."""
    return sum(len(tokenizer.token_bytes(i) or b"") for i in ids.tolist())


def bits_per_byte(model: Decoder, tokenizer, ids: torch.Tensor, seq_len: int,  # noqa: ANN001
                  max_tokens: int | None = None) -> float:
    """Cross-entropy per UTF-8 byte of the predicted tokens, in bits: comparable across tokenizers."""
    total, targets = evaluation_nll(model, ids, seq_len, max_tokens)
    return total / token_byte_counts(tokenizer, targets) / math.log(2)


def prose_bits_per_byte(model: Decoder, tokenizer, texts: Sequence[str]) -> float:  # noqa: ANN001
    """Bits per byte over paragraphs, each read from an EOS (a fresh document), all of it scored."""
    total, n_bytes = 0.0, 0
    for text in texts:
        ids = torch.tensor([EOS_ID, *tokenizer.encode(text)][: model.cfg.max_seq_len + 1])
        nll, targets = evaluation_nll(model, ids, model.cfg.max_seq_len)
        total += nll
        n_bytes += token_byte_counts(tokenizer, targets)
    return total / n_bytes / math.log(2)


def learning_rate(step: int, cfg: TrainConfig) -> float:
    """Linear warmup, then cosine decay from lr to min_lr."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * progress))


def make_optimizer(model: Decoder, cfg: TrainConfig) -> torch.optim.AdamW:
    # Decay matrices only; norms' gains stay free, as in most Llama recipes.
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8, foreach=True)


def save_checkpoint(model: Decoder, out_dir: Path) -> None:
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    model.cfg.save(out_dir / "config.json")
    tensors = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})


def train(
    cfg: TrainConfig,
    out_dir: Path = TINY_DIR,
    corpus: Corpus | None = None,
    shape: DecoderConfig = TINY_SHAPE,
    log=print,  # noqa: ANN001
) -> dict:
    """Train tokenizer and model into out_dir; return the measured numbers (also in training.json)."""
    from kvviz.training.prose import PROSE

    torch.manual_seed(cfg.seed)
    t_start = time.perf_counter()
    corpus = corpus or build_corpus(log=log)
    tokenizer = train_tokenizer(corpus.train, shape.vocab_size, out_dir / "tokenizer.json")
    train_ids = encode_docs(tokenizer, corpus.train)
    langs = [lang for lang in LANGS if corpus.split(lang, True)]
    eval_ids = {lang: encode_docs(tokenizer, corpus.split(lang, True)) for lang in langs}
    log(f"corpus: {len(corpus.train)} train docs, {len(train_ids):,} tokens; held-out "
        + ", ".join(f"{lang} {len(corpus.split(lang, True))} docs {len(ids):,} tokens"
                    for lang, ids in eval_ids.items()))
    eval_len = min(cfg.seq_len, shape.max_seq_len)

    model = Decoder(shape).init_weights(cfg.seed)
    opt = make_optimizer(model, cfg)
    gen = torch.Generator().manual_seed(cfg.seed)
    history: list[dict] = []
    t_train = time.perf_counter()
    n_tokens = 0
    for step in range(cfg.steps):
        lr = learning_rate(step, cfg)
        for group in opt.param_groups:
            group["lr"] = lr
        long = step >= cfg.steps - cfg.long_steps
        seq_len = cfg.long_seq_len if long else cfg.seq_len
        batch_size = max(1, cfg.batch_size * cfg.seq_len // seq_len) if long else cfg.batch_size
        starts = torch.randint(0, len(train_ids) - seq_len - 1, (batch_size,), generator=gen)
        batch = torch.stack([train_ids[s : s + seq_len + 1] for s in starts.tolist()])
        model.train()
        logits = model(batch[:, :-1]).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        n_tokens += batch_size * seq_len
        if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps:
            model.eval()
            per_lang = {lang: evaluation_loss(model, ids, eval_len, cfg.eval_tokens) for lang, ids in eval_ids.items()}
            elapsed = time.perf_counter() - t_train
            row = {"step": step + 1, "seq_len": seq_len, "train_loss": loss.item(),
                   "held_out_loss": sum(per_lang.values()) / len(per_lang),
                   **{f"held_out_loss_{lang}": v for lang, v in per_lang.items()},
                   "lr": lr, "tokens": n_tokens, "elapsed_s": round(elapsed, 1)}
            history.append(row)
            save_checkpoint(model, out_dir)  # the latest weights are always usable, even mid-run
            log(f"step {step + 1:5d}  train {loss.item():.3f}  held-out "
                + "  ".join(f"{lang} {v:.3f}" for lang, v in per_lang.items())
                + f"  lr {lr:.2e}  {elapsed:6.0f} s  {n_tokens / elapsed:,.0f} tok/s")
    train_s = time.perf_counter() - t_train

    model.eval()
    result = {
        "train_config": asdict(cfg),
        "corpus": corpus.stats(),
        "train_tokens": len(train_ids),
        "n_params": model.num_parameters(),
        "train_seconds": round(train_s, 1),
        "history": history,
    }
    for lang, ids in eval_ids.items():
        nll, targets = evaluation_nll(model, ids, eval_len, cfg.final_eval_tokens)
        result[lang] = {
            "held_out_documents": len(corpus.split(lang, True)),
            "held_out_tokens": len(ids),
            "held_out_bytes": sum(len(d.text.encode()) for d in corpus.split(lang, True)),
            "held_out_tokens_per_char": len(ids) / sum(len(d.text) for d in corpus.split(lang, True)),
            "evaluated_tokens": len(targets),
            "held_out_loss": nll / len(targets),
            "held_out_perplexity": math.exp(nll / len(targets)),
            "held_out_bits_per_byte": nll / token_byte_counts(tokenizer, targets) / math.log(2),
            # the same number of tokens from this language's training documents
            "train_loss": evaluation_loss(model, encode_docs(tokenizer, corpus.split(lang, False)), eval_len,
                                          max_tokens=len(targets)),
            "unigram_held_out_loss": unigram_loss(train_ids, ids[: len(targets) + 1], shape.vocab_size),
            "prose_bits_per_byte": prose_bits_per_byte(model, tokenizer, PROSE[lang]),
        }
    result["held_out_loss"] = history[-1]["held_out_loss"]
    result["total_seconds"] = round(time.perf_counter() - t_start, 1)
    (out_dir / "training.json").write_text(json.dumps(result, indent=2) + "\n")
    if out_dir == TINY_DIR:  # the shipped model's held-out split ships beside it, for evaluations at run time
        write_held_out(corpus)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    defaults = TrainConfig()
    p = argparse.ArgumentParser(prog="python -m kvviz.training", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=TINY_DIR, help="where model, config and tokenizer go")
    for name, value in asdict(defaults).items():
        p.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    args = vars(p.parse_args(argv))
    out = args.pop("out")
    torch.set_num_threads(args["threads"])  # float sums depend on the thread split: part of the recipe
    result = train(replace(defaults, **args), out)
    for lang in LANGS:
        if lang in result:
            r = result[lang]
            print(f"{lang}: held-out loss {r['held_out_loss']:.3f} nats/token, {r['held_out_bits_per_byte']:.3f} "
                  f"bits/byte (unigram {r['unigram_held_out_loss']:.3f}); outside prose "
                  f"{r['prose_bits_per_byte']:.3f} bits/byte")
    print(f"{result['n_params']:,} parameters; trained in {result['train_seconds']:.0f} s -> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
