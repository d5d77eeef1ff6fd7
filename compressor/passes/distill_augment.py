"""Transfer-data augmentation for `distill` and `distill-structure` (`augment: {copies: N, mlm: DIR}`).

TinyBERT's rule as text in, text out (Tang et al. also mask words, but leave [MASK] in place and
add part-of-speech swaps and n-gram sampling, which this does not): each training text
gets N noised copies in which every word the masked LM knows as one token is, with
probability `replace_prob`, masked and replaced by a word drawn uniformly from the masked
LM's `candidates` most likely fillers. The copies carry no task label (NO_LABEL): the
student learns them from the teacher's soft targets only, so `distill` refuses `augment`
without `soft` and `distill-structure` without the teacher's logits (alpha < 1).

Where TinyBERT masks one word per forward pass, this masks a copy's chosen words together and
fills them from one forward pass (N passes per text instead of one per word: the difference
is how much context each prediction sees). Words the masked LM splits into pieces are kept,
where TinyBERT would take a GloVe neighbour (no word vectors ship offline).

`unlabeled_samples: N` is the other transfer set: the next N texts of the train split after
the labelled ones, their labels withheld (NO_LABEL), as when labels are scarce and in-domain
text is not; the teacher alone labels them, under the same refusals as `augment`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

import torch
from pydantic import Field
from transformers import AutoModelForMaskedLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from compressor.passes.distill_losses import NO_LABEL
from compressor.passes.registry import Context, Known, PassConfig
from pretrain.data import Split, TaskData
from pretrain.domain import mlm_head
from pretrain.errors import UserError
from pretrain.families import FAMILIES

WORD = re.compile(r"[A-Za-z]+")
FILL_BATCH = 64        # masked texts per forward pass of the masked LM
EXAMPLES_KEPT = 3      # (original, copy) pairs kept in the pass record


class AugmentConfig(PassConfig):
    copies: int = Field(1, ge=1, le=50)                   # noised copies of each training text
    mlm: str = Field(min_length=1)                        # a masked-LM model dir (the teacher's, if it has the head)
    replace_prob: float = Field(0.4, gt=0, le=1)          # TinyBERT's p_t
    candidates: int = Field(15, ge=1)                     # TinyBERT's K


Config = TypeVar("Config", bound=PassConfig)


def transfer_data(cfg: Config, ctx: Context, record: dict) -> tuple[TaskData, Config]:
    """The task as the loop should see it: the train split's first max_train_samples texts,
    plus with `cfg.augment` their noised copies, plus with `cfg.unlabeled_samples` the next
    texts without their labels (and the cap lifted, as it is applied). `cfg` is any training
    pass's config with `augment`, `unlabeled_samples`, `max_train_samples` and `seed`."""
    if cfg.augment is None and not cfg.unlabeled_samples:
        return ctx.task, cfg
    train = ctx.task.split("train")
    split = originals = train.head(cfg.max_train_samples)
    if cfg.augment is not None:
        augmented = augment_split(originals, cfg.augment, Path(cfg.augment.mlm), cfg.seed)
        record["augment"] = augmented.record
        split = augmented.split
    if cfg.unlabeled_samples:
        split = joined(split, unlabeled_rows(train, len(originals), cfg.unlabeled_samples))
        record["unlabeled"] = {"labelled": len(originals), "unlabeled": cfg.unlabeled_samples}
    task = replace(ctx.task, splits={**ctx.task.splits, "train": split})
    return task, cfg.model_copy(update={"max_train_samples": None})


def unlabeled_rows(train: Split, labelled: int, count: int) -> Split:
    """The `count` train rows after the first `labelled`, their labels withheld."""
    check_unlabeled_count(count, len(train), labelled)
    pairs = train.text_pairs[labelled:labelled + count] if train.text_pairs is not None else None
    return Split(train.texts[labelled:labelled + count], [NO_LABEL] * count, pairs)


def check_unlabeled_count(count: int, train_rows: int, labelled: int) -> None:
    left = train_rows - labelled
    if count > left:
        raise UserError(f"unlabeled_samples {count} asks for more train texts than the {left} after the "
                        f"{labelled} labelled ones; expected at most {left} (or a smaller max_train_samples)")


def check_unlabeled_fit(cfg: PassConfig, known: Known) -> None:
    """The same refusal up front: the labelled rows are the first max_train_samples (the
    step's, else the recipe's) of the train split."""
    if not cfg.unlabeled_samples or known.train_rows is None:
        return
    cap = cfg.max_train_samples or known.max_train_samples
    check_unlabeled_count(cfg.unlabeled_samples, known.train_rows, min(known.train_rows, cap or known.train_rows))


def check_augment_fit(cfg: PassConfig, known: Known) -> None:
    """`augment`'s refusals up front, before any stage trains: a pair task, and a masked LM
    that cannot propose words (a missing dir is left to the check for missing inputs)."""
    if cfg.augment is None:
        return
    if known.pair_task:
        raise UserError(PAIR_TASK_REFUSAL)
    if Path(cfg.augment.mlm).is_dir():
        load_masked_lm(Path(cfg.augment.mlm))


PAIR_TASK_REFUSAL = "augment noises single texts; expected a single-text task, not a pair task"


def joined(first: Split, second: Split) -> Split:
    pairs = first.text_pairs + second.text_pairs if first.text_pairs is not None else None
    return Split(first.texts + second.texts, first.labels + second.labels, pairs)


@dataclass
class Augmented:
    split: Split               # the originals first, then every copy (labels NO_LABEL)
    record: dict


def load_masked_lm(source: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A masked LM with its trained head; one whose head would be drawn at random is refused
    (its fillers would be noise, not words that fit)."""
    try:
        model, info = AutoModelForMaskedLM.from_pretrained(source, output_loading_info=True)
        tokenizer = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as err:
        raise UserError(f"augment.mlm {source} is not a masked-LM model dir ({str(err).splitlines()[0]}); "
                        "expected a model dir with a masked-LM head (e.g. from `compressor pretrain --objective "
                        "mlm`)") from None
    if info["missing_keys"]:
        raise UserError(f"augment.mlm {source} has no trained masked-LM head (missing {info['missing_keys'][0]}); "
                        "augmentation needs one to propose words: give augment.mlm, a model dir with one "
                        "(e.g. from `compressor pretrain --objective mlm`)")
    family = FAMILIES.get(model.config.model_type)
    if family is None or not family.mlm_head:
        raise UserError(f"augment.mlm {source} is a {model.config.model_type!r} model, whose masked-LM "
                        "head this tool does not know; expected a BERT-family masked LM")
    if tokenizer.mask_token is None:
        raise UserError(f"augment.mlm: the tokenizer of {source} has no mask token; expected a masked-LM tokenizer")
    return model.eval(), tokenizer


def augment_split(split: Split, cfg: AugmentConfig, mlm_dir: Path, seed: int) -> Augmented:
    """The split with `cfg.copies` noised copies of every text appended."""
    if split.text_pairs is not None:
        raise UserError(PAIR_TASK_REFUSAL)
    model, tokenizer = load_masked_lm(mlm_dir)
    generator = torch.Generator().manual_seed(seed)
    one_token = OneTokenWords(tokenizer)
    masked, slots = [], []
    for _ in range(cfg.copies):
        for text in split.texts:
            spans = [m.span() for m in WORD.finditer(text) if one_token(m.group())]
            chosen = [s for s in spans if torch.rand((), generator=generator) < cfg.replace_prob]
            masked.append(with_spans_replaced(text, chosen, [tokenizer.mask_token] * len(chosen)))
            slots.append(chosen)
    fillers = fill_masks(model, tokenizer, masked, cfg.candidates, generator)
    copies = [with_spans_replaced(split.texts[i % len(split)], spans, words)
              for i, (spans, words) in enumerate(zip(slots, fillers))]
    replaced = sum(len(s) for s in slots)
    words = sum(len(WORD.findall(t)) for t in split.texts) * cfg.copies
    record = {"copies": cfg.copies, "originals": len(split), "added": len(copies), "mlm": str(mlm_dir),
              "replace_prob": cfg.replace_prob, "candidates": cfg.candidates,
              "words_replaced": replaced, "share_of_words_replaced": round(replaced / max(words, 1), 4),
              "examples": [[split.texts[i], copies[i]] for i in range(min(EXAMPLES_KEPT, len(split)))]}
    return Augmented(Split(split.texts + copies, split.labels + [NO_LABEL] * len(copies)), record)


class OneTokenWords:
    """Whether the masked LM reads a word as one known token (memoized: words repeat)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        self.tokenizer, self.known = tokenizer, {}

    def __call__(self, word: str) -> bool:
        if word not in self.known:
            ids = self.tokenizer(word, add_special_tokens=False)["input_ids"]
            self.known[word] = len(ids) == 1 and ids[0] != self.tokenizer.unk_token_id
        return self.known[word]


def with_spans_replaced(text: str, spans: list[tuple[int, int]], words: list[str]) -> str:
    out, last = [], 0
    for (start, end), word in zip(spans, words):
        out += [text[last:start], word]
        last = end
    return "".join(out + [text[last:]])


@torch.no_grad()
def fill_masks(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, texts: list[str], candidates: int,
               generator: torch.Generator) -> list[list[str]]:
    """For each text, one word per mask token (in order): drawn uniformly from the masked LM's
    top `candidates` whole-word tokens at that position."""
    allowed = whole_word_tokens(tokenizer, model.get_output_embeddings().weight.shape[0])
    head = mlm_head(model)
    fillers: list[list[str]] = []
    for start in range(0, len(texts), FILL_BATCH):
        batch = tokenizer(texts[start:start + FILL_BATCH], padding=True, truncation=True, return_tensors="pt")
        is_mask = batch["input_ids"] == tokenizer.mask_token_id                # (B, T)
        hidden = model.base_model(**batch)[0][is_mask]                          # (masks, D)
        # The vocabulary projection at the masks only (a few per text, not every position).
        logits = head(hidden).masked_fill(~allowed, float("-inf"))              # (masks, V)
        top = logits.topk(candidates, dim=-1).indices                           # (masks, K)
        pick = torch.randint(0, candidates, (len(top),), generator=generator)
        chosen = top.gather(-1, pick.unsqueeze(-1)).squeeze(-1).tolist()
        per_row = is_mask.sum(-1).tolist()
        for count in per_row:
            fillers.append(tokenizer.convert_ids_to_tokens(chosen[:count]))
            chosen = chosen[count:]
    # A mask cut off by truncation has no prediction: that word and the later ones keep their
    # original text (with_spans_replaced stops at the last filler).
    return fillers


def whole_word_tokens(tokenizer: PreTrainedTokenizerBase, size: int) -> torch.Tensor:
    """Vocabulary entries a word may become: alphabetic, not a special token or a word piece."""
    allowed = torch.zeros(size, dtype=torch.bool)
    special = set(tokenizer.all_special_tokens)
    for token, index in tokenizer.get_vocab().items():
        if index < size:
            allowed[index] = token not in special and WORD.fullmatch(token) is not None
    if not allowed.any():
        raise UserError(f"augment.mlm: the masked LM's vocabulary ({type(tokenizer).__name__}) has no plain whole-word "
                        "tokens to fill masks with; expected a WordPiece vocabulary (BERT family)")
    return allowed
