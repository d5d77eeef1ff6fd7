"""First-generation static word embeddings: skip-gram with negative sampling (word2vec).

For each (centre word, context word) pair within a window, maximise
    log sigmoid(v_c . u_o) + sum_{k} log sigmoid(-v_c . u_k)
over k negative words drawn from the unigram distribution raised to 3/4 (Mikolov et al.
2013). Frequent words are subsampled (kept with probability sqrt(t / f) for frequency f),
and the window is dynamic (a size drawn uniformly in 1..window for each pair, which weights
near contexts more), as in the reference word2vec.c.

Words are the corpus's lower-cased BERT pre-tokens (the same normalisation as WordPiece),
kept if they occur at least `min_count` times, at most `max_vocab` of them. Training is the
project's loop (`pretrain.train.train`): batches are a pure function of the step.

The optimisation is word2vec's: plain SGD on both tables (sparse rows: only the words of a
batch move), a learning rate per (centre, context) pair decaying linearly to 0, centre
vectors initialised uniformly in +-0.5/dim and context vectors at zero. A batch step is the
sum of its pairs' word2vec steps: the loss is the sum over the batch's pairs divided by
`batch_size`, and the loop's SGD runs at lr x batch_size.

Why the defaults differ from word2vec's lr 0.025: on a corpus this small (WordNet's glosses
are about 1.3M words) a run makes a few million pair updates, not word2vec's hundreds of
millions. From their tiny initialisation SGNS vectors first learn one direction they all
share (word frequency against the negative-sampling noise), and only later the directions
that tell words apart; at 0.025 (and with Adam at 3e-3) a short run ends in that first
phase, every pairwise cosine near 1 and the neighbours meaningless. At 0.1 the same number
of updates gets past it (benchmarks/README.md, "Static embeddings").

Exported: `embeddings.npy` (vocab x dim float32, the centre vectors word2vec exports),
`vocab.txt` (one word per line, in row order, with its count), `metrics.json`.
`load_embeddings(dir)` returns (words, matrix) to initialise a BiLSTM / CNN student.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Callable, Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from tokenizers import normalizers, pre_tokenizers
from torch import nn

from pretrain.data import load_corpus
from pretrain.errors import UserError
from pretrain.limits import MAX_SEED
from pretrain.train import StepBatches, TrainConfig, TrainResult, train

PROBE_WORDS = ("dog", "king", "red", "water", "music", "run", "happy", "tree", "money", "doctor")
# Pairs of related words frequent in WordNet's glosses: a collapse check, against random pairs.
RELATED_PAIRS = (("red", "yellow"), ("white", "black"), ("two", "three"), ("plant", "plants"),
                 ("leaves", "flowers"), ("north", "south"), ("male", "female"), ("brown", "yellow"))


class EmbeddingConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    dim: int = Field(100, ge=2)
    window: int = Field(5, ge=1)
    negatives: int = Field(5, ge=1)
    min_count: int = Field(5, ge=1)
    max_vocab: int = Field(50_000, ge=2)
    subsample: float = Field(1e-4, gt=0)      # word2vec's t
    steps: int = Field(3000, ge=1)
    batch_size: int = Field(4096, ge=1)       # (centre, context) pairs per step
    lr: float = Field(0.1, gt=0)   # SGD step per pair (word2vec: 0.025, see the module doc)
    # "adam": the loop's SparseAdam (centre) + AdamW (context) at lr, kept for comparison.
    optimizer: Literal["sgd", "adam"] = "sgd"
    seed: int = Field(0, ge=0, le=MAX_SEED)


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
        self.context = nn.Embedding(vocab_size, dim, sparse=True)   # a batch touches few rows
        nn.init.uniform_(self.centre.weight, -0.5 / dim, 0.5 / dim)
        nn.init.zeros_(self.context.weight)

    def get_input_embeddings(self) -> nn.Embedding:   # the loop trains this table sparsely
        return self.centre

    def forward(self, input_ids: torch.Tensor, contexts: torch.Tensor, negatives: torch.Tensor) -> torch.Tensor:
        """Each pair's negative log-likelihood, shape (B,)."""
        v = self.centre(input_ids)                                   # (B, D)
        positive = (v * self.context(contexts)).sum(-1)              # (B,)
        negative = torch.einsum("bd,bkd->bk", v, self.context(negatives))   # (B, K)
        return -(F.logsigmoid(positive) + F.logsigmoid(-negative).sum(-1))


def sgns_loss(batch_size: int) -> Callable[[nn.Module, dict[str, torch.Tensor]], torch.Tensor]:
    """Sum of the pairs' losses / batch_size: the mean over a full batch, and a fixed
    per-pair weight (so a step moves each pair by the same lr) when a batch comes up short."""
    def loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return model(batch["input_ids"], batch["contexts"], batch["negatives"]).sum() / batch_size
    return loss


class PairSampler:
    """Step -> a batch of (centre, context, negatives), a pure function of (seed, step)."""

    def __init__(self, ids: np.ndarray, doc_of: np.ndarray, counts: np.ndarray, cfg: EmbeddingConfig):
        self.ids, self.doc_of, self.cfg = ids, doc_of, cfg
        freq = counts / counts.sum()
        self.keep = np.minimum(1.0, np.sqrt(cfg.subsample / freq))   # word2vec subsampling
        noise = counts.astype(np.float64) ** 0.75
        self.noise_cdf = np.cumsum(noise / noise.sum())
        self._acceptance: float | None = None

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
        found_pos, found_ctx, total = [], [], 0
        draw = int(self.cfg.batch_size / self.acceptance * 1.25) + 16   # usually one round is enough
        for _ in range(max_rounds):
            pos, ctx = self.candidates(rng, draw)
            found_pos.append(pos)
            found_ctx.append(ctx)
            total += len(pos)
            if total >= self.cfg.batch_size:
                break
        if total == 0:
            raise UserError("no word pairs found within one document: expected documents of several words")
        return np.concatenate(found_pos)[: self.cfg.batch_size], np.concatenate(found_ctx)[: self.cfg.batch_size]

    def candidates(self, rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
        """The pairs of `size` random draws that survive subsampling and document bounds."""
        n, window = len(self.ids), self.cfg.window
        pos = rng.integers(0, n, size=size)
        reach = rng.integers(1, window + 1, size=size) * (2 * rng.integers(0, 2, size=size) - 1)
        ctx = np.clip(pos + reach, 0, n - 1)
        ok = (ctx != pos) & (self.doc_of[pos] == self.doc_of[ctx]) \
            & (rng.random(size) < self.keep[self.ids[pos]]) & (rng.random(size) < self.keep[self.ids[ctx]])
        return pos[ok], ctx[ok]

    @property
    def acceptance(self) -> float:
        """The share of random draws that make a pair (measured once, on a fixed draw)."""
        if self._acceptance is None:
            pos, _ = self.candidates(np.random.default_rng(0), 20_000)
            self._acceptance = max(len(pos) / 20_000, 1e-3)
        return self._acceptance


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
    if cfg.optimizer == "sgd":
        # lr x batch_size: the loss divides the pairs' sum by batch_size (see the module doc).
        train_cfg = TrainConfig(lr=cfg.lr * cfg.batch_size, weight_decay=0.0, warmup_ratio=0.0,
                                max_grad_norm=None, seed=cfg.seed, embedding_updates="sparse", optimizer="sgd")
    else:
        model.context.sparse = False      # AdamW takes dense gradients only
        train_cfg = TrainConfig(lr=cfg.lr, weight_decay=0.0, warmup_ratio=0.0, max_grad_norm=None,
                                seed=cfg.seed, embedding_updates="sparse")
    result = train(model, StepBatches(steps=cfg.steps, make=sampler.batch), train_cfg,
                   loss_fn=sgns_loss(cfg.batch_size), desc="skip-gram", show_progress=show_progress)
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


def geometry(words: list[str], matrix: np.ndarray, top: int = 2000, seed: int = 0) -> dict[str, float]:
    """Collapse checks: the mean cosine over all pairs of the `top` most frequent words (near 1
    when the vectors share one direction), and the mean cosine of RELATED_PAIRS found in
    the vocabulary beside that of as many random pairs of those `top` words."""
    unit = matrix / np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)
    head = unit[:top]
    n = len(head)
    cos = head @ head.T
    index = {w: i for i, w in enumerate(words)}
    related = [float(unit[index[a]] @ unit[index[b]]) for a, b in RELATED_PAIRS if a in index and b in index]
    rng = np.random.default_rng(seed)
    pairs = rng.choice(n, size=(max(len(related), 1) * 50, 2)) if n > 1 else np.zeros((0, 2), dtype=int)
    random = [float(cos[i, j]) for i, j in pairs if i != j]
    return {"mean_pairwise_cosine": float((cos.sum() - n) / max(n * (n - 1), 1)),
            # null, not NaN, where there are no pairs: metrics.json stays strict JSON
            "related_pairs": len(related), "related_pairs_cosine": float(np.mean(related)) if related else None,
            "random_pairs_cosine": float(np.mean(random)) if random else None}


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
