"""ELMo's bidirectional LSTM language model (Peters et al. 2018) and its classifier: the
model classes of the `bilm` objective (pretrain/objectives/bilm.py) and of the BiLSTM students
of `distill-structure`.

A forward LSTM LM reads [CLS] x1 .. xn [SEP] left to right and predicts each next token; a
backward LSTM LM reads it right to left and predicts each previous token. The two share
the token embedding and the softmax (tied to the embedding here, to keep the vocabulary
matrices to one), as ELMo shares its token representation and softmax layer; each
direction has its own stack of LSTMs with a projection back to the embedding width (ELMo's
LSTMP cells) and residual connections between layers. Loss = mean of the two directions'
token cross-entropies over non-pad targets.

Transformers has no such model, so this is a small custom `PreTrainedModel`, which gives it
the usual on-disk format and API:

    DIR/config.json        {"model_type": "bilm", "vocab_size", "embedding_dim", "hidden_size",
                            "num_layers", "dropout", "pad_token_id", "tie_word_embeddings", ...}
    DIR/model.safetensors  embeddings.weight [V, E]; forward_layers.{i}.* and backward_layers.{i}.*
                           (torch.nn.LSTM parameters: weight_ih_l0, weight_hh_l0, bias_ih_l0,
                           bias_hh_l0, weight_hr_l0); softmax.bias [V] (softmax.weight is the
                           embedding, tied)

Importing this module registers "bilm" with AutoConfig, AutoModel and
AutoModelForSequenceClassification. It imports nothing but torch and Transformers, so a
saved dir ships a copy of it (pretrain/model_code.py) and loads without this package, with
`trust_remote_code=True`. `model.contextual(input_ids, attention_mask)` returns ELMo's layer
representations (token embedding, then each layer's [forward; backward]).

`BiLMForSequenceClassification` classifies as ELMo's paper adds ELMo to a task model: a
learned softmax-normalised scalar mix of the layer representations times gamma (Peters et
al. 2018, eq. 1), here mean-pooled over the real tokens and fed to a linear layer. Its
weights are the BiLM's (the LM softmax is left out) plus `scalar_mix.*` and `classifier.*`.
It exports to ONNX: ONNX's LSTM has no projection, so each LSTMP runs as the exactly
equivalent plain LSTM with recurrent weight W_hh W_hr, followed by W_hr (`lstmp`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import SequenceClassifierOutput
from transformers.utils import ModelOutput

ELMO_LAYERS = 2


class BiLMConfig(PretrainedConfig):
    model_type = "bilm"

    def __init__(self, vocab_size: int = 30522, embedding_dim: int = 128, hidden_size: int = 512,
                 num_layers: int = ELMO_LAYERS, dropout: float = 0.1, pad_token_id: int = 0,
                 tie_word_embeddings: bool = True, initializer_range: float = 0.02, **kwargs):
        if hidden_size <= embedding_dim:
            raise ValueError(f"BiLM hidden_size ({hidden_size}) must exceed embedding_dim "
                             f"({embedding_dim}): the LSTM cells project down to the embedding")
        self.vocab_size = vocab_size
        self.embedding_dim = embedding_dim
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.dropout = dropout
        self.initializer_range = initializer_range
        super().__init__(pad_token_id=pad_token_id, tie_word_embeddings=tie_word_embeddings, **kwargs)


def init_like_bert(module: nn.Module, config: BiLMConfig) -> None:
    """Embeddings and linear layers drawn as BERT draws them (pad row zero); others untouched."""
    if isinstance(module, nn.Embedding):
        module.weight.data.normal_(0.0, config.initializer_range)
        module.weight.data[config.pad_token_id].zero_()
    elif isinstance(module, nn.Linear):
        module.weight.data.normal_(0.0, config.initializer_range)
        module.bias.data.zero_()


@dataclass
class BiLMOutput(ModelOutput):
    loss: torch.Tensor | None = None
    forward_logits: torch.Tensor | None = None     # [batch, seq, vocab]: next-token logits
    backward_logits: torch.Tensor | None = None    # [batch, seq, vocab]: previous-token logits


def reverse_padded(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Reverse each row's first lengths[b] steps along dim 1; padding stays at the end."""
    steps = torch.arange(x.shape[1], device=x.device)[None, :]
    index = torch.where(steps < lengths[:, None], lengths[:, None] - 1 - steps, steps)
    index = index.view(*index.shape, *([1] * (x.dim() - 2))).expand_as(x)
    return x.gather(1, index)


def residual_stack(layers: nn.ModuleList, x: torch.Tensor, dropout: nn.Module,
                   cell: Callable[[nn.LSTM, torch.Tensor], torch.Tensor]) -> list[torch.Tensor]:
    """Each layer's output states [batch, seq, E]; `cell(lstm, x)` runs one LSTM."""
    states = []
    for i, lstm in enumerate(layers):
        out = cell(lstm, dropout(x))
        x = out if i == 0 else out + x                  # ELMo's residual between layers
        states.append(x)
    return states


def elmo_representations(embedded: torch.Tensor, lengths: torch.Tensor, forward_layers: nn.ModuleList,
                         backward_layers: nn.ModuleList,
                         run: Callable[[nn.ModuleList, torch.Tensor], list[torch.Tensor]]) -> list[torch.Tensor]:
    """[embedding duplicated, layer 1, ..., layer L], each [batch, seq, 2E] = [forward; backward]."""
    forward = run(forward_layers, embedded)
    # The backward LM reads each row reversed within its length (padding stays last).
    backward = [reverse_padded(h, lengths) for h in run(backward_layers, reverse_padded(embedded, lengths))]
    return [torch.cat([embedded, embedded], -1)] + [torch.cat(pair, -1) for pair in zip(forward, backward)]


class BiLanguageModel(PreTrainedModel):
    config_class = BiLMConfig
    base_model_prefix = "bilm"
    _tied_weights_keys = ["softmax.weight"]

    def __init__(self, config: BiLMConfig):
        super().__init__(config)
        width = config.embedding_dim
        self.embeddings = nn.Embedding(config.vocab_size, width, padding_idx=config.pad_token_id)
        self.forward_layers = nn.ModuleList(self._lstm(config) for _ in range(config.num_layers))
        self.backward_layers = nn.ModuleList(self._lstm(config) for _ in range(config.num_layers))
        self.dropout = nn.Dropout(config.dropout)
        self.softmax = nn.Linear(width, config.vocab_size)
        self.post_init()

    @staticmethod
    def _lstm(config: BiLMConfig) -> nn.LSTM:
        return nn.LSTM(config.embedding_dim, config.hidden_size, batch_first=True,
                       proj_size=config.embedding_dim)

    def _init_weights(self, module: nn.Module) -> None:
        # LSTMs keep PyTorch's own initialisation; embeddings and softmax as in BERT.
        init_like_bert(module, self.config)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embeddings = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.softmax

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.softmax = value

    def _run(self, layers: nn.ModuleList, x: torch.Tensor) -> list[torch.Tensor]:
        return residual_stack(layers, x, self.dropout, lambda lstm, h: lstm(h)[0])

    def contextual(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
                   ) -> list[torch.Tensor]:
        """ELMo's representations: [embedding duplicated, layer 1, ..., layer L], each
        [batch, seq, 2 * embedding_dim] = [forward; backward]."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        return elmo_representations(self.embeddings(input_ids), attention_mask.sum(1),
                                    self.forward_layers, self.backward_layers, self._run)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                **_: object) -> BiLMOutput:
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        top = self.contextual(input_ids, attention_mask)[-1]
        width = self.config.embedding_dim
        forward_logits = self.softmax(self.dropout(top[..., :width]))
        backward_logits = self.softmax(self.dropout(top[..., width:]))
        ignore = torch.full_like(input_ids[:, :1], -100)
        targets = input_ids.masked_fill(attention_mask == 0, -100)
        next_tokens = torch.cat([targets[:, 1:], ignore], 1)      # position t predicts t+1
        previous_tokens = torch.cat([ignore, targets[:, :-1]], 1)  # position t predicts t-1
        loss = 0.5 * (nn.functional.cross_entropy(forward_logits.transpose(1, 2), next_tokens)
                      + nn.functional.cross_entropy(backward_logits.transpose(1, 2), previous_tokens))
        return BiLMOutput(loss=loss, forward_logits=forward_logits, backward_logits=backward_logits)


def lstmp(lstm: nn.LSTM, x: torch.Tensor) -> torch.Tensor:
    """`lstm(x)[0]` for a one-layer LSTM with projection, computed as a plain LSTM.

    An LSTMP feeds h_t = W_hr m_t back (m_t = o_t * tanh(c_t)), so its gates read
    W_hh h_{t-1} = (W_hh W_hr) m_{t-1}: a plain LSTM over m with recurrent weight W_hh W_hr,
    whose outputs are then projected by W_hr. Same function (to float rounding), but ONNX
    has an LSTM operator only for this plain form. During ONNX export the product is taken
    out of the trace as a constant, so the graph's LSTM holds both weights as initializers
    (which ONNX Runtime's dynamic quantization turns into an int8 DynamicQuantizeLSTM).
    """
    w_hr = lstm.weight_hr_l0                                          # [P, H]
    recurrent = lstm.weight_hh_l0 @ w_hr                              # [4H, P] @ [P, H] -> [4H, H]
    if torch.onnx.is_in_onnx_export():
        recurrent = torch.from_numpy(recurrent.detach().numpy().copy())
    zeros = x.new_zeros(1, x.shape[0], w_hr.shape[1])                # h0 = c0 = 0: [1, batch, H]
    out, _, _ = torch.lstm(x, (zeros, zeros), [lstm.weight_ih_l0, recurrent, lstm.bias_ih_l0, lstm.bias_hh_l0],
                           True, 1, 0.0, False, False, True)          # biases, 1 layer, no dropout, eval, uni, batch_first
    return out @ w_hr.T                                               # [batch, seq, H] -> [batch, seq, P]


class BiLMEncoder(nn.Module):
    """The BiLM without its LM softmax: what a classifier keeps (same parameter names)."""

    def __init__(self, config: BiLMConfig):
        super().__init__()
        self.embeddings = nn.Embedding(config.vocab_size, config.embedding_dim, padding_idx=config.pad_token_id)
        self.forward_layers = nn.ModuleList(BiLanguageModel._lstm(config) for _ in range(config.num_layers))
        self.backward_layers = nn.ModuleList(BiLanguageModel._lstm(config) for _ in range(config.num_layers))
        self.dropout = nn.Dropout(config.dropout)

    def _run(self, layers: nn.ModuleList, x: torch.Tensor) -> list[torch.Tensor]:
        return residual_stack(layers, x, self.dropout, lstmp)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[torch.Tensor]:
        """ELMo's L + 1 representations, each [batch, seq, 2 * embedding_dim] (as `contextual`)."""
        return elmo_representations(self.embeddings(input_ids), attention_mask.sum(1),
                                    self.forward_layers, self.backward_layers, self._run)


class ElmoScalarMix(nn.Module):
    """gamma * sum_j softmax(s)_j h_j: ELMo's task-specific weighting of the layers."""

    def __init__(self, states: int):
        super().__init__()
        self.weights = nn.Parameter(torch.zeros(states))    # a uniform mix at the start
        self.gamma = nn.Parameter(torch.ones(()))

    def forward(self, states: list[torch.Tensor]) -> torch.Tensor:
        w = torch.softmax(self.weights, dim=0)
        return self.gamma * sum(w[j] * h for j, h in enumerate(states))


class BiLMForSequenceClassification(PreTrainedModel):
    """A pretrained BiLM with ELMo's scalar mix, masked mean pooling and a linear head."""

    config_class = BiLMConfig
    base_model_prefix = "bilm"
    _keys_to_ignore_on_load_unexpected = [r"softmax\."]     # the LM softmax of a pretrained BiLM

    def __init__(self, config: BiLMConfig):
        super().__init__(config)
        self.bilm = BiLMEncoder(config)
        self.scalar_mix = ElmoScalarMix(config.num_layers + 1)
        self.dropout = nn.Dropout(config.dropout)
        self.classifier = nn.Linear(2 * config.embedding_dim, config.num_labels)
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, ElmoScalarMix):
            module.weights.data.zero_()
            module.gamma.data.fill_(1.0)
        else:
            init_like_bert(module, self.config)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.bilm.embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.bilm.embeddings = value

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, **_: object) -> SequenceClassifierOutput:
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        mixed = self.scalar_mix(self.bilm(input_ids, attention_mask))         # [batch, seq, 2E]
        mask = attention_mask.unsqueeze(-1).to(mixed.dtype)
        pooled = (mixed * mask).sum(1) / mask.sum(1).clamp(min=1.0)           # mean over real tokens
        logits = self.classifier(self.dropout(pooled))
        loss = nn.functional.cross_entropy(logits, labels) if labels is not None else None
        return SequenceClassifierOutput(loss=loss, logits=logits)


AutoConfig.register("bilm", BiLMConfig, exist_ok=True)
AutoModel.register(BiLMConfig, BiLanguageModel, exist_ok=True)
AutoModelForSequenceClassification.register(BiLMConfig, BiLMForSequenceClassification, exist_ok=True)
