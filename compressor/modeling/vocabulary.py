"""Vocabulary trimming: keep a subset of the token ids in a tokenizer and a model, in step.

Half of MiniLM's weights are its 30,522 x 384 word embedding, and a task's texts use a small
part of that vocabulary. Keeping only some rows needs two edits that must agree:

- the tokenizer: a fast tokenizer of the same kind, whose vocab is the kept tokens in their
  old order (new id = position among the kept ones). Normalizer, pre-tokenizer, special
  tokens, post-processor and decoder are carried over from the original's own serialized
  form, so the rebuilt tokenizer splits text exactly as before;
- the model: the kept rows of the input embedding (and of an output embedding tied to it or
  of vocab size, e.g. an MLM decoder), `config.vocab_size` and the config's `*_token_id`
  fields renumbered.

Only tokenizers whose model is a plain token -> id table can be trimmed: WordPiece (BERT,
DistilBERT, ELECTRA) and WordLevel. WordPiece matches the longest vocab prefix at each
position of a word, so a word whose pieces were all kept splits exactly as before (any
longer prefix was not in the old vocab either). A word with a dropped piece splits into
kept pieces where WordPiece can, and becomes the unknown token where it cannot. BPE needs
every intermediate token of its merges, and a SentencePiece unigram model scores whole
segmentations with its pieces' probabilities: dropping tokens changes how both split
text, so they are refused.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Iterable

import torch
from tokenizers import Tokenizer
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from pretrain.errors import UserError

TRIMMABLE_MODELS = ("WordPiece", "WordLevel")
# init_kwargs that describe the original files or ids, not the tokenizer's behaviour.
FILE_KWARGS = ("vocab_file", "tokenizer_file", "added_tokens_decoder", "name_or_path")


def tokenizer_model_type(tokenizer: PreTrainedTokenizerBase) -> str | None:
    """The `tokenizers` model behind a fast tokenizer (WordPiece, BPE, Unigram, ...), None if slow."""
    if not getattr(tokenizer, "is_fast", False):
        return None
    return json.loads(tokenizer.backend_tokenizer.to_str())["model"]["type"]


def check_trimmable(tokenizer: PreTrainedTokenizerBase) -> None:
    """One-line UserError for a tokenizer whose vocabulary cannot be cut without changing how it splits text."""
    kind = tokenizer_model_type(tokenizer)
    if kind not in TRIMMABLE_MODELS:
        what = f"a {kind} tokenizer" if kind else f"a slow (Python) tokenizer ({type(tokenizer).__name__})"
        raise UserError(f"trim-vocab cannot trim {what}: dropping tokens would change how it splits text; "
                        f"expected a fast {' or '.join(TRIMMABLE_MODELS)} tokenizer (BERT, DistilBERT, ELECTRA)")
    if tokenizer.unk_token is None:
        raise UserError("trim-vocab needs a tokenizer with an unknown token (e.g. [UNK]) for the dropped "
                        "tokens; this tokenizer has none")


def token_counts(tokenizer: PreTrainedTokenizerBase, texts: list[str], pairs: list[str] | None) -> Counter:
    """How often each token id occurs in the texts, special tokens included, nothing truncated."""
    ids = tokenizer(texts, pairs, truncation=False)["input_ids"]
    return Counter(i for row in ids for i in row)


def ids_to_keep(tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel, used: Iterable[int]) -> list[int]:
    """`used`, plus what the tokenizer and model cannot do without: every special or added
    token (unknown, padding, separators) and every id the model's config names (`*_token_id`),
    in their old order."""
    rows = model.get_input_embeddings().num_embeddings
    needed = set(used) | set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder)
    needed |= {v for v in config_token_ids(model).values() if v is not None and 0 <= v < rows}
    return sorted(needed)


def config_token_ids(model: PreTrainedModel) -> dict[str, int | None]:
    return {name: value for name, value in model.config.to_dict().items()
            if name.endswith("_token_id") and (value is None or isinstance(value, int))}


def trim_tokenizer(tokenizer: PreTrainedTokenizerBase, keep: list[int]) -> PreTrainedTokenizerBase:
    """A tokenizer of the same class holding only the tokens `keep` (old ids, ascending), renumbered 0..n-1."""
    new_id = {token: i for i, token in enumerate(tokenizer.convert_ids_to_tokens(keep))}
    state = json.loads(tokenizer.backend_tokenizer.to_str())
    state["model"]["vocab"] = new_id
    for added in state["added_tokens"]:
        added["id"] = new_id[added["content"]]
    if state.get("post_processor"):
        renumber_post_processor(state["post_processor"], new_id)
    # The call site decides padding and truncation (transformers sets them per call).
    state["padding"] = state["truncation"] = None
    backend = Tokenizer.from_str(json.dumps(state))
    kwargs = {k: v for k, v in tokenizer.init_kwargs.items() if k not in FILE_KWARGS}
    trimmed = type(tokenizer)(tokenizer_object=backend, **kwargs)
    # Set on the tokenizer after loading (pretrain.models.fit_tokenizer), not in init_kwargs.
    for name in ("model_max_length", "padding_side", "truncation_side", "split_special_tokens"):
        if hasattr(tokenizer, name):
            setattr(trimmed, name, getattr(tokenizer, name))
    return trimmed


def renumber_post_processor(processor: dict, new_id: dict[str, int]) -> None:
    """Give the special tokens a post-processor inserts ([CLS], [SEP]) their new ids, in place."""
    kind = processor["type"]
    if kind == "TemplateProcessing":
        for special in processor["special_tokens"].values():
            special["ids"] = [new_id[token] for token in special["tokens"]]
    elif kind in ("BertProcessing", "RobertaProcessing"):
        for key in ("sep", "cls"):
            token = processor[key][0]
            processor[key] = [token, new_id[token]]
    elif kind == "Sequence":
        for inner in processor["processors"]:
            renumber_post_processor(inner, new_id)
    elif kind != "ByteLevel":   # ByteLevel only fixes offsets: no ids
        raise UserError(f"trim-vocab cannot renumber a {kind} post-processor; expected TemplateProcessing, "
                        f"BertProcessing or a Sequence of them")


def trim_embeddings(model: PreTrainedModel, keep: list[int]) -> None:
    """Keep the rows `keep` (old ids, ascending) of every vocab-sized matrix, in place.

    Modules that shared the input embedding's weight (BART's encoder and decoder lookups, a
    tied MLM decoder) share the trimmed one; an untied output embedding keeps its own rows.
    Config ids of special tokens are renumbered; each must be among `keep`.
    """
    index = torch.tensor(keep, dtype=torch.long)
    position = {old: new for new, old in enumerate(keep)}
    old = model.get_input_embeddings().weight
    new = nn.Parameter(old.detach().index_select(0, index).clone(), requires_grad=old.requires_grad)
    for module in model.modules():
        if isinstance(module, nn.Embedding) and module.weight is old:
            module.weight = new
            module.num_embeddings = len(keep)
            if module.padding_idx is not None:
                module.padding_idx = position[module.padding_idx]
    output = model.get_output_embeddings()
    if isinstance(output, nn.Linear) and output.out_features == old.shape[0]:
        output.weight = new if output.weight is old else \
            nn.Parameter(output.weight.detach().index_select(0, index).clone())
        if output.bias is not None:
            output.bias = nn.Parameter(output.bias.detach().index_select(0, index).clone())
        output.out_features = len(keep)
    model.config.vocab_size = len(keep)
    for name, value in config_token_ids(model).items():
        if value in position:   # ids_to_keep kept every one in range
            setattr(model.config, name, position[value])
