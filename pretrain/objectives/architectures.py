"""Transformers configs for models pretrained from scratch, shaped by a `ModelSize`.

Shared by the objectives of this package that build BERT (span, unilm) or BART-shaped
encoder-decoders (dae, seq2seq-mlm). Positions are sized to the pretraining `max_length`,
which the objectives never exceed.
"""

from __future__ import annotations

from transformers import BartConfig, BertConfig

from pretrain.objectives import ModelSize
from pretrain.objectives.noising import SpecialTokens


def bert_config(specials: SpecialTokens, size: ModelSize, max_length: int) -> BertConfig:
    return BertConfig(vocab_size=specials.vocab_size, hidden_size=size.hidden,
                      num_hidden_layers=size.layers, num_attention_heads=size.heads,
                      intermediate_size=size.intermediate, max_position_embeddings=max_length,
                      pad_token_id=specials.pad)


def bart_config(specials: SpecialTokens, size: ModelSize, max_length: int) -> BartConfig:
    """An encoder-decoder with `size.layers` layers on each side; the sequence start/end
    tokens ([CLS]/[SEP] or <s>/</s>) serve as BART's bos/eos, and the decoder starts from
    eos as in BART."""
    return BartConfig(vocab_size=specials.vocab_size, d_model=size.hidden,
                      encoder_layers=size.layers, decoder_layers=size.layers,
                      encoder_attention_heads=size.heads, decoder_attention_heads=size.heads,
                      encoder_ffn_dim=size.intermediate, decoder_ffn_dim=size.intermediate,
                      max_position_embeddings=max_length, pad_token_id=specials.pad,
                      bos_token_id=specials.start, eos_token_id=specials.end,
                      decoder_start_token_id=specials.end,
                      # Generation settings belong in a generation config, not here (and
                      # BartConfig's default forced_eos id 2 is some other token of ours).
                      forced_eos_token_id=None, forced_bos_token_id=None)


def fresh_bart(tokenizer, objective: str, size: ModelSize, max_length: int, seed: int):
    """A seeded, randomly initialised BartForConditionalGeneration for `tokenizer` (dae, seq2seq-mlm)."""
    import torch
    from transformers import BartForConditionalGeneration

    from pretrain.objectives.noising import special_tokens
    torch.manual_seed(seed)
    return BartForConditionalGeneration(bart_config(special_tokens(tokenizer, objective), size, max_length))
