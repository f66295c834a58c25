"""Decoding with several trained models at once, as fairseq (`--path a.pt:b.pt`) and OpenNMT (`-model a.pt b.pt`) do:
at every step of beam search each model gives its next-token distribution and the search advances on their average.

Beam search (`search.beam_search`) sees a model through a small object, `ModelDecoder` (or, for this package's model,
the faster `IncrementalDecoder` of `incremental.py`): it encodes the sources once, gives one step's next-token
log-probabilities of every row (or the best few), and keeps and reorders its own key/value cache as the search drops
final sentences and reorders beams. An `Ensemble` runs one per member, each with its own encoder output and cache (the
members may differ in size and depth), and combines their log-probabilities row by row, so that one search serves one
model and an ensemble alike.

The combination rule: by default the mean of the members' probabilities, log((p_1 + ... + p_n) / n), computed as the
logsumexp of their log-probabilities minus log n (fairseq's); `average="log-probabilities"` takes the mean of their
log-probabilities instead, (log p_1 + ... + log p_n) / n (OpenNMT-py's), a normalized geometric mean up to a constant
of each step. Scores are sums of these combined log-probabilities, length-penalized as for one model.
"""

import copy
import json
import math
from typing import Literal

import torch
import torch.nn.functional as F
from transformers import GenerationMixin, PreTrainedTokenizerBase
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.modeling_outputs import BaseModelOutput

from ..errors import ConfigError
from .incremental import IncrementalDecoder
from .shortlist import Shortlist

# The special ids that every member must share: the search reads them from one config for all.
SPECIAL_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id")
AVERAGES = ("probabilities", "log-probabilities")
Average = Literal["probabilities", "log-probabilities"]


class ModelDecoder:
    """One model's part in beam search over a batch of right-padded sources: their encoder output, computed once
    and repeated for the `num_beams` rows of each sentence (row sentence * num_beams + beam), and its key/value
    cache."""

    def __init__(
        self, model: GenerationMixin, input_ids: torch.Tensor, attention_mask: torch.Tensor, num_beams: int
    ) -> None:
        config = model.config
        self.model = model
        encoder_states = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        self.encoder_states = encoder_states.repeat_interleave(num_beams, dim=0)
        self.attention_mask = attention_mask.repeat_interleave(num_beams, dim=0)
        self.cache = EncoderDecoderCache(DynamicCache(config=config), DynamicCache(config=config))

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """The fp32 log-probabilities [rows, vocabulary] of the next token after `tokens` ([rows, 1], the last token
        of each row), which join the cache."""
        logits = self.model(
            encoder_outputs=BaseModelOutput(last_hidden_state=self.encoder_states),
            attention_mask=self.attention_mask,
            decoder_input_ids=tokens,
            cache=self.cache,
            use_cache=True,
        ).logits[:, -1]
        return F.log_softmax(logits.float(), dim=-1)

    def candidates(self, tokens: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The `n` most likely next tokens of every row and their log-probabilities, each [rows, n], best first."""
        return self.step(tokens).topk(n, dim=-1)

    def keep(self, rows: torch.Tensor) -> None:
        """Keep only `rows` (those of the sentences still searched) of the encoder output and the cross-attention
        cache. The self-attention cache follows at the next `reorder`, whose rows index the rows before this call."""
        self.cache.cross_attention_cache.reorder_cache(rows)
        self.encoder_states, self.attention_mask = self.encoder_states[rows], self.attention_mask[rows]

    def reorder(self, beam_rows: torch.Tensor) -> None:
        """Row i of the self-attention cache becomes row `beam_rows[i]`'s: the beam each surviving beam continues. The
        cross-attention cache needs no reordering: all beams of a sentence hold the same encoder keys and values."""
        self.cache.self_attention_cache.reorder_cache(beam_rows)


class Ensemble:
    """Several trained models that share one vocabulary, decoded as one by `translate()` and `beam_search`: at each
    step the members' next-token distributions are averaged, by default in probability (`average="probabilities"`,
    fairseq's rule), or in log-probability (`"log-probabilities"`, OpenNMT-py's). Each member keeps its own encoder
    output and cache; members may differ in size and depth, and must sit on one device.

    Members must have the same vocabulary size and special ids (refused otherwise, naming the two models and what
    differs): their tokenizer is one. `names` name them in that message (default: "model 0", "model 1", ...).
    `config` is the first member's, with the fewest positions of all members (sources are cut to them and outputs
    stop there); `generation_config`, the default beams and length penalty, is the first member's too.
    """

    def __init__(
        self,
        models: list[GenerationMixin],
        average: Average = "probabilities",
        names: list[str] | None = None,
    ) -> None:
        models = list(models)
        if not models:
            raise ConfigError("an ensemble needs at least one model")
        if average not in AVERAGES:
            raise ConfigError(f"average={average!r}: an ensemble averages {' or '.join(map(repr, AVERAGES))}")
        names = list(names) if names is not None else [f"model {index}" for index in range(len(models))]
        first = models[0].config
        for name, model in zip(names[1:], models[1:], strict=True):
            differences = [
                f"{field} {getattr(first, field)} and {getattr(model.config, field)}"
                for field in ("vocab_size", *SPECIAL_IDS)
                if getattr(first, field) != getattr(model.config, field)
            ]
            if differences:
                raise ConfigError(
                    f"{names[0]} and {name} do not share one vocabulary ({', '.join(differences)}): an ensemble's "
                    "models must be trained with the same tokenizer"
                )
            if model.device != models[0].device:
                raise ConfigError(
                    f"{names[0]} is on {models[0].device} and {name} on {model.device}: move an ensemble's models to "
                    "one device"
                )
        self.models, self.average, self.names = models, average, names
        self.config = copy.deepcopy(first)
        self.config.max_position_embeddings = min(model.config.max_position_embeddings for model in models)
        self.generation_config = models[0].generation_config

    @property
    def device(self) -> torch.device:
        return self.models[0].device

    def __len__(self) -> int:
        return len(self.models)

    def combine(self, log_probs: list[torch.Tensor]) -> torch.Tensor:
        """The ensemble's log-probabilities from each member's (`average`): log of the mean probability, or the mean
        log-probability."""
        stacked = torch.stack(list(log_probs))
        if self.average == "probabilities":
            return torch.logsumexp(stacked, dim=0) - math.log(len(log_probs))
        return stacked.mean(dim=0)


class EnsembleDecoder:
    """An `Ensemble`'s part in beam search: a `ModelDecoder` per member, whose log-probabilities it combines."""

    def __init__(
        self,
        ensemble: Ensemble,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        num_beams: int,
        incremental: bool = True,
    ):
        self.ensemble = ensemble
        self.members = [
            model_decoder(model, input_ids, attention_mask, num_beams, incremental) for model in ensemble.models
        ]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.ensemble.combine([member.step(tokens) for member in self.members])

    def candidates(self, tokens: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.step(tokens).topk(n, dim=-1)

    def keep(self, rows: torch.Tensor) -> None:
        for member in self.members:
            member.keep(rows)

    def reorder(self, beam_rows: torch.Tensor) -> None:
        for member in self.members:
            member.reorder(beam_rows)


def as_decodable(model: GenerationMixin | Ensemble | list[GenerationMixin]) -> GenerationMixin | Ensemble:
    """A model or an `Ensemble` as given, and a list or tuple of models as their `Ensemble`."""
    return Ensemble(model) if isinstance(model, (list, tuple)) else model


def model_decoder(
    model: GenerationMixin,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    num_beams: int,
    incremental: bool = True,
    shortlist: Shortlist | None = None,
) -> ModelDecoder | IncrementalDecoder:
    """One model's part in a beam search over these sources: an `IncrementalDecoder` for this package's model, unless
    `incremental` is False, and a `ModelDecoder`, which runs forward() at each step, for any other. A `shortlist`
    needs the first."""
    if incremental and IncrementalDecoder.supports(model):
        return IncrementalDecoder(model, input_ids, attention_mask, num_beams, shortlist)
    if shortlist is not None:
        raise ConfigError(
            "a shortlist decodes one model of this package (TransformerForConditionalGeneration) with "
            f"incremental=True: drop the shortlist for {type(model).__name__}"
        )
    return ModelDecoder(model, input_ids, attention_mask, num_beams)


def decoder(
    model: GenerationMixin | Ensemble,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    num_beams: int,
    incremental: bool = True,
    shortlist: Shortlist | None = None,
) -> ModelDecoder | IncrementalDecoder | EnsembleDecoder:
    """The part of `model` (one model or an ensemble) in a beam search over these sources (`model_decoder`)."""
    if isinstance(model, Ensemble):
        if shortlist is not None:
            raise ConfigError(
                "a shortlist decodes one model, not an ensemble: drop the shortlist, or all models but one"
            )
        return EnsembleDecoder(model, input_ids, attention_mask, num_beams, incremental)
    return model_decoder(model, input_ids, attention_mask, num_beams, incremental, shortlist)


# The parts of a tokenizer.json that decide how text becomes ids and back (not truncation and padding, which calls set).
TOKENIZER_PARTS = ("model", "added_tokens", "normalizer", "pre_tokenizer", "post_processor", "decoder")


def check_same_tokenizer(
    first_name: str, first: PreTrainedTokenizerBase, name: str, tokenizer: PreTrainedTokenizerBase
) -> None:
    """Refuse, in one line naming the two models (`first_name`, `name`) and what differs, two tokenizers that do not
    turn text into the same ids: their vocabulary size, a special id, or a part of their tokenizer.json."""
    differences = []
    if len(first) != len(tokenizer):
        differences.append(f"vocabulary size {len(first)} and {len(tokenizer)}")
    for token in ("pad_token_id", "bos_token_id", "eos_token_id", "unk_token_id"):
        if getattr(first, token) != getattr(tokenizer, token):
            differences.append(f"{token} {getattr(first, token)} and {getattr(tokenizer, token)}")
    if not differences:
        files = [json.loads(each.backend_tokenizer.to_str()) for each in (first, tokenizer)]
        parts = [part for part in TOKENIZER_PARTS if files[0].get(part) != files[1].get(part)]
        if parts:
            differences.append(f"the {', '.join(parts)} of their tokenizer.json")
    if differences:
        raise ConfigError(
            f"{first_name} and {name} do not share one tokenizer ({'; '.join(differences)}): an ensemble's models "
            "must be trained with the same tokenizer (data.tokenizer or data.tokenizer_dir of one run)"
        )
