"""First-generation static word embeddings: skip-gram with negative sampling (word2vec).

For each (centre word, context word) pair within a window, maximise
    log sigmoid(v_c . u_o) + sum_{k} log sigmoid(-v_c . u_k)
over k negative words drawn from the unigram distribution raised to 3/4 (Mikolov et al.
2013). Frequent words are subsampled (kept with probability sqrt(t / f) for frequency f),
and the window is dynamic (a size drawn uniformly in 1..window for each pair, which weights
near contexts more), as in the reference word2vec.c.

Words are the corpus's lower-cased BERT pre-tokens (the same normalisation as WordPiece),
kept if they occur at least `min_count` times, at most `max_vocab` of them. Training is the
project's loop (`pretrain.train.train`): batches are a pure function of the step, the
centre-word table trains with sparse rows (SparseAdam) and the context table densely.

Exported: `embeddings.npy` (vocab x dim float32, the centre vectors word2vec exports),
`vocab.txt` (one word per line, in row order, with its count), `metrics.json`.
`load_embeddings(dir)` returns (words, matrix) to initialise a BiLSTM / CNN student.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from tokenizers import normalizers, pre_tokenizers
from torch import nn

from pretrain.data import load_corpus
from pretrain.errors import UserError
from pretrain.train import StepBatches, TrainConfig, TrainResult, train

PROBE_WORDS = ("dog", "king", "red", "water", "music", "run", "happy", "tree", "money", "doctor")


class EmbeddingConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    dim: int = Field(100, ge=2)
    window: int = Field(5, ge=1)
    negatives: int = Field(5, ge=1)
    min_count: int = Field(5, ge=1)
    max_vocab: int = Field(50_000, ge=2)
    subsample: float = Field(1e-4, gt=0)      # word2vec's t
    steps: int = Field(3000, ge=1)
    batch_size: int = Field(4096, ge=1)       # centre words per step
    lr: float = Field(3e-3, gt=0)
    seed: int = 0


# -- words --------------------------------------------------------------------------------

class WordSplitter:
    """BERT's normalisation and pre-tokenisation, keeping alphabetic words only."""

    def __init__(self) -> None:
        self.normalizer = normalizers.BertNormalizer(lowercase=True)
        self.pre = pre_tokenizers.BertPreTokenizer()

    def __call__(self, line: str) -> list[str]:
        text = self.normalizer.normalize_str(line)
        return [w for w, _ in self.pre.pre_tokenize_str(text) if w.isalpha()]


def count_words(corpus: str, split: WordSplitter) -> Counter:
    counts: Counter = Counter()
    for doc in load_corpus(corpus):
        for line in doc:
            counts.update(split(line))
    return counts


def build_vocab(counts: Counter, cfg: EmbeddingConfig) -> list[tuple[str, int]]:
    kept = [(w, c) for w, c in counts.most_common(cfg.max_vocab) if c >= cfg.min_count]
    if len(kept) < 2:
        raise UserError(f"corpus has {len(kept)} words occurring at least {cfg.min_count} times: "
                        "expected a larger corpus or a smaller --min-count")
    return kept


def encode_corpus(corpus: str, index: dict[str, int], split: WordSplitter) -> tuple[np.ndarray, np.ndarray]:
    """(ids, doc_of): every in-vocabulary word of the corpus in order, and its document."""
    ids: list[int] = []
    docs: list[int] = []
    for d, doc in enumerate(load_corpus(corpus)):
        words = [index[w] for line in doc for w in split(line) if w in index]
        ids.extend(words)
        docs.extend([d] * len(words))
    return np.asarray(ids, dtype=np.int64), np.asarray(docs, dtype=np.int64)


# -- model and batches --------------------------------------------------------------------

class SkipGram(nn.Module):
    """Centre (input) and context (output) vectors; word2vec's initialisation."""

    def __init__(self, vocab_size: int, dim: int):
        super().__init__()
        self.centre = nn.Embedding(vocab_size, dim)
        self.context = nn.Embedding(vocab_size, dim)
        nn.init.uniform_(self.centre.weight, -0.5 / dim, 0.5 / dim)
        nn.init.zeros_(self.context.weight)

    def get_input_embeddings(self) -> nn.Embedding:   # the loop trains this table sparsely
        return self.centre

    def forward(self, input_ids: torch.Tensor, contexts: torch.Tensor, negatives: torch.Tensor) -> torch.Tensor:
        v = self.centre(input_ids)                                   # (B, D)
        positive = (v * self.context(contexts)).sum(-1)              # (B,)
        negative = torch.einsum("bd,bkd->bk", v, self.context(negatives))   # (B, K)
        return -(F.logsigmoid(positive) + F.logsigmoid(-negative).sum(-1)).mean()


def sgns_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return model(batch["input_ids"], batch["contexts"], batch["negatives"])


class PairSampler:
    """Step -> a batch of (centre, context, negatives), a pure function of (seed, step)."""

    def __init__(self, ids: np.ndarray, doc_of: np.ndarray, counts: np.ndarray, cfg: EmbeddingConfig):
        self.ids, self.doc_of, self.cfg = ids, doc_of, cfg
        freq = counts / counts.sum()
        self.keep = np.minimum(1.0, np.sqrt(cfg.subsample / freq))   # word2vec subsampling
        noise = counts.astype(np.float64) ** 0.75
        self.noise_cdf = np.cumsum(noise / noise.sum())

    def batch(self, step: int) -> dict[str, torch.Tensor]:
        rng = np.random.default_rng((self.cfg.seed, step))
        pos, ctx = self.pairs(rng)
        negatives = np.searchsorted(self.noise_cdf, rng.random((len(pos), self.cfg.negatives)))
        negatives = np.minimum(negatives, len(self.noise_cdf) - 1)
        return {"input_ids": torch.from_numpy(self.ids[pos]), "contexts": torch.from_numpy(self.ids[ctx]),
                "negatives": torch.from_numpy(negatives)}

    def pairs(self, rng: np.random.Generator, max_rounds: int = 64) -> tuple[np.ndarray, np.ndarray]:
        """batch_size (centre, context) positions: random positions, a dynamic window offset,
        dropped when subsampled or when the context lies in another document."""
        n, cfg = len(self.ids), self.cfg
        found_pos, found_ctx, total = [], [], 0
        for _ in range(max_rounds):
            pos = rng.integers(0, n, size=cfg.batch_size * 2)
            reach = rng.integers(1, cfg.window + 1, size=pos.shape) * rng.choice([-1, 1], size=pos.shape)
            ctx = np.clip(pos + reach, 0, n - 1)
            ok = (ctx != pos) & (self.doc_of[pos] == self.doc_of[ctx]) \
                & (rng.random(pos.shape) < self.keep[self.ids[pos]]) \
                & (rng.random(pos.shape) < self.keep[self.ids[ctx]])
            found_pos.append(pos[ok])
            found_ctx.append(ctx[ok])
            total += int(ok.sum())
            if total >= cfg.batch_size:
                break
        if total == 0:
            raise UserError("no word pairs found within one document: expected documents of several words")
        return np.concatenate(found_pos)[: cfg.batch_size], np.concatenate(found_ctx)[: cfg.batch_size]


# -- training and use ---------------------------------------------------------------------

def train_embeddings(corpus: str, cfg: EmbeddingConfig, show_progress: bool = True
                     ) -> tuple[list[tuple[str, int]], np.ndarray, TrainResult]:
    """(vocabulary with counts, vocab x dim matrix, training result)."""
    split = WordSplitter()
    vocab = build_vocab(count_words(corpus, split), cfg)
    index = {w: i for i, (w, _) in enumerate(vocab)}
    ids, doc_of = encode_corpus(corpus, index, split)
    sampler = PairSampler(ids, doc_of, np.array([c for _, c in vocab], dtype=np.float64), cfg)
    torch.manual_seed(cfg.seed)
    model = SkipGram(len(vocab), cfg.dim)
    train_cfg = TrainConfig(lr=cfg.lr, weight_decay=0.0, warmup_ratio=0.0, max_grad_norm=None,
                            seed=cfg.seed, embedding_updates="sparse")
    result = train(model, StepBatches(steps=cfg.steps, make=sampler.batch), train_cfg, loss_fn=sgns_loss,
                   desc="skip-gram", show_progress=show_progress)
    return vocab, model.centre.weight.detach().numpy().copy(), result


def nearest_neighbours(words: list[str], matrix: np.ndarray, probes: tuple[str, ...] = PROBE_WORDS,
                       k: int = 5) -> dict[str, list[list]]:
    """probe -> [[word, cosine], ...] for the probes in the vocabulary."""
    unit = matrix / np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)
    index = {w: i for i, w in enumerate(words)}
    out = {}
    for probe in probes:
        if probe not in index:
            continue
        sims = unit @ unit[index[probe]]
        sims[index[probe]] = -np.inf
        best = np.argsort(-sims)[:k]
        out[probe] = [[words[i], round(float(sims[i]), 3)] for i in best]
    return out


def save_embeddings(directory: Path, vocab: list[tuple[str, int]], matrix: np.ndarray) -> None:
    np.save(directory / "embeddings.npy", matrix.astype(np.float32))
    (directory / "vocab.txt").write_text("".join(f"{w}\t{c}\n" for w, c in vocab), encoding="utf-8")


def load_embeddings(directory: str | Path) -> tuple[list[str], np.ndarray]:
    directory = Path(directory)
    try:
        matrix = np.load(directory / "embeddings.npy")
        words = [line.split("\t")[0] for line in (directory / "vocab.txt").read_text(encoding="utf-8").splitlines()]
    except (OSError, ValueError) as err:
        raise UserError(f"{directory} is not an embeddings dir (embeddings.npy + vocab.txt): {err}") from None
    if len(words) != len(matrix):
        raise UserError(f"{directory}: vocab.txt has {len(words)} words but embeddings.npy {len(matrix)} rows")
    return words, matrix
