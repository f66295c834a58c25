"""Convert a trained model into a stock `transformers.MarianMTModel`, which loads anywhere without remote code.

Marian's architecture is the paper's: post-LN layers, sinusoidal positions added to embeddings scaled by
sqrt(d_model), one embedding matrix shared by the encoder, the decoder and the output projection, a ReLU feed-forward
network. The one difference is the layout of the sinusoids: ours interleave them (dimension 2i is the sine of
frequency i, 2i + 1 its cosine, as in section 3.5), Marian's put all sines first (dimension i is the sine of
frequency i, ceil(d/2) + i its cosine). Every sub-layer and LayerNorm commutes with a permutation of the model
dimension, so permuting that axis in every weight turns our model into an equivalent Marian model: Marian's
dimension i is our dimension `perm[i]`, with `perm = [0, 2, 4, ..., 1, 3, 5, ...]`. The axes inside a sub-layer (the
per-head query/key/value dimensions, the feed-forward inner dimension) are not permuted.

Marian builds its sinusoid table in float64 when it loads (the table is not saved), ours in float32: the two differ by
float32 rounding (about 2e-6 at the first 64 positions, 6e-5 near position 1000), which is the only numerical
difference between the two models besides the order of floating-point operations.
"""

import copy
from pathlib import Path

import torch
from transformers import MarianConfig, MarianMTModel, PretrainedConfig, PreTrainedTokenizerFast

from ..formats import FormatCard
from ..model import TransformerConfig, TransformerForConditionalGeneration
from ..model.configuration_transformer import SHAPE_FIELDS

__all__ = ["check_marian_compatible", "marian_config", "marian_permutation", "to_marian"]

# Our layer-norm modules (`<name>.layer_norm`) and the Marian names they become.
_LAYER_NORMS = {
    "self_attn_add_norm": "self_attn_layer_norm",
    "encoder_attn_add_norm": "encoder_attn_layer_norm",
    "feed_forward_add_norm": "final_layer_norm",
}

# Marian tensors with no counterpart in our model, kept as Marian makes them: the sinusoid tables (recomputed when a
# saved Marian model loads; `marian_permutation` is what makes ours equal them) and the output bias, which is zeros.
_MARIAN_OWN_KEYS = frozenset(
    {"final_logits_bias", "model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight"}
)

# What the check allows, every other field of a config is refused: a field added later (a position scheme, another
# feed-forward network) stops the export until it is mapped here, rather than exporting a model that computes
# something else. First, what `marian_config` copies into MarianConfig (and `init_std`, filled in when unset), which
# computes alike for every value but `decoder_start_token_id` (checked by name, as `normalize_before`: Marian is
# post-LN); what changes only training (the loss, source-token dropout), not the exported model; and Hugging Face's
# fields of every config (output flags, dtype, names) and of a saved folder's remote code (`auto_map`,
# `custom_pipelines`), which MarianMTModel reads as ours does, or not at all.
_COPIED_FIELDS = (
    *SHAPE_FIELDS,
    "activation_function",
    "max_position_embeddings",
    "scale_embedding",
    "dropout",
    "attention_dropout",
    "activation_dropout",
    "use_cache",
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
    "decoder_start_token_id",
    "tie_word_embeddings",
)
_ALLOWED_FIELDS = {
    *_COPIED_FIELDS,
    "init_std",
    "normalize_before",
    "label_smoothing",
    "source_token_dropout",
    "auto_map",
    "custom_pipelines",
    *PretrainedConfig().to_dict(),
}

_ALTERNATIVE = (
    "Export it without --format marian and load it with trust_remote_code=True (or with this package installed) "
    "instead."
)
# What the model card of a "marian" folder says of its format (`ExportFormat.card`).
MARIAN_CARD = FormatCard(
    tags=("marian",),
    about="This folder holds it as a stock `MarianMTModel`: the same post-LN architecture with its model dimension "
    "permuted to Marian's layout of the sinusoids, so that it computes the same logits and decodes the same tokens "
    "without remote code.",
    usage="""\
from transformers import AutoTokenizer, MarianMTModel

model_id = {{ model_id | tojson }}
# A stock Marian model: no remote code runs.
tokenizer = AutoTokenizer.from_pretrained(model_id)
model = MarianMTModel.from_pretrained(model_id)

inputs = tokenizer([{{ example | tojson }}], return_tensors="pt", padding=True)
output_ids = model.generate(**inputs)  # the decoding settings come from generation_config.json
print(tokenizer.batch_decode(output_ids, skip_special_tokens=True))""",
)


def marian_permutation(d_model: int) -> torch.Tensor:
    """Indices `perm` such that Marian's model dimension i is our dimension `perm[i]`: the even dimensions (the sines
    of our interleaved positional encoding) first, then the odd ones (the cosines), which is Marian's layout. For an
    odd d_model both sides have one more sine than cosines, so the same formula holds."""
    return torch.cat((torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)))


def check_marian_compatible(config: TransformerConfig) -> None:
    """Raise ValueError, saying why and what to do instead, if MarianMTModel cannot compute what this config does:
    pre-LN, no decoder start token, or a field outside what Marian expresses (`_ALLOWED_FIELDS`), named with its
    value."""
    if config.normalize_before:
        raise ValueError(
            "This model is pre-LN (normalize_before=True: x + Sublayer(LayerNorm(x)) and a final LayerNorm after each "
            "stack), but MarianMTModel is post-LN only (LayerNorm(x + Sublayer(x)), no final LayerNorm), so no Marian "
            f"model computes the same function. {_ALTERNATIVE}"
        )
    if config.decoder_start_token_id is None:
        raise ValueError(
            "MarianConfig needs a decoder_start_token_id, and this model's config has none: set "
            "model.config.decoder_start_token_id (and model.generation_config.decoder_start_token_id) to the token "
            "the decoder starts from, usually the bos id."
        )
    for field, value in config.to_dict().items():
        if field not in _ALLOWED_FIELDS:
            raise ValueError(
                f"This model's config sets {field}={value!r}, which MarianMTModel has no counterpart for: the export "
                f"would compute another function. {_ALTERNATIVE}"
            )


def marian_config(config: TransformerConfig) -> MarianConfig:
    """The MarianConfig of the same architecture.

    Shared embeddings become `share_encoder_decoder_embeddings=True` with `tie_word_embeddings=True`; untied ones (our
    `tie_word_embeddings=False` unties encoder, decoder and output matrices alike) become
    `share_encoder_decoder_embeddings=False` with `tie_word_embeddings=False`, which is the same three matrices.
    `forced_eos_token_id` is set to None: MarianConfig's default is 0, which would force token 0 (our pad) at the
    last step of `generate()`, and our model forces nothing.
    """
    check_marian_compatible(config)
    tied = config.tie_word_embeddings
    return MarianConfig(
        **{field: getattr(config, field) for field in _COPIED_FIELDS},
        decoder_vocab_size=config.vocab_size,
        init_std=float(config.init_std or config.d_model**-0.5),
        encoder_layerdrop=0.0,
        decoder_layerdrop=0.0,
        forced_eos_token_id=None,
        share_encoder_decoder_embeddings=tied,
    )


def _marian_state_dict(ours: dict[str, torch.Tensor], d_model: int, tied: bool) -> dict[str, torch.Tensor]:
    """Our state dict under Marian's names, with the model dimension permuted (see the module docstring): weights
    that read it (embeddings, the output projection, Q/K/V, fc1) permute their columns; weights and biases that write
    it (out_proj, fc2) and the LayerNorms permute their rows. Fused Q/K/V matrices are split into Marian's three."""
    perm = marian_permutation(d_model)
    converted: dict[str, torch.Tensor] = {}
    for key, tensor in ours.items():
        stack, _, rest = key.removeprefix("model.").partition(".")
        if key == "lm_head.weight":
            converted[key] = tensor[:, perm]
        elif rest == "embed_tokens.weight":
            converted[f"model.{stack}.embed_tokens.weight"] = tensor[:, perm]
            if tied and stack == "encoder":
                converted["model.shared.weight"] = tensor[:, perm]
        elif rest.startswith("layers."):
            # layers.<i>.<module>.<submodule>.<weight|bias>
            _, index, module, submodule, kind = rest.split(".")
            prefix = f"model.{stack}.layers.{index}"
            if module in _LAYER_NORMS:
                converted[f"{prefix}.{_LAYER_NORMS[module]}.{kind}"] = tensor[perm]
            elif submodule in ("out_proj", "fc2"):
                name = f"{module}.out_proj" if submodule == "out_proj" else "fc2"
                converted[f"{prefix}.{name}.{kind}"] = tensor[perm]
            elif submodule == "fc1":  # its bias lies on the inner dimension, which is not permuted
                converted[f"{prefix}.fc1.{kind}"] = tensor[:, perm] if kind == "weight" else tensor
            else:  # qkv_proj, q_proj, kv_proj: stacked [n * d_model, d_model] matrices, per-head output axis
                names = {"qkv_proj": "qkv", "q_proj": "q", "kv_proj": "kv"}[submodule]
                for name, part in zip(names, tensor.split(d_model, dim=0), strict=True):
                    converted[f"{prefix}.{module}.{name}_proj.{kind}"] = part[:, perm] if kind == "weight" else part
        else:
            raise ValueError(f"Unexpected weight {key!r}: to_marian does not know where it goes in MarianMTModel.")
    return converted


@torch.no_grad()
def to_marian(model: TransformerForConditionalGeneration) -> MarianMTModel:
    """A stock `MarianMTModel` (fp32, on the CPU, in eval mode) that computes the same logits as `model` and decodes
    the same tokens with `generate()`, so that the model can be used where `trust_remote_code` is not allowed.

    The generation config (the paper's beam 4, length penalty 0.6, the special ids) is copied, so `generate()` decodes
    as ours does. Its output's bound is a `max_length`, as stock models save it: the model's positions, which is where
    ours bounds an output of a long source. A stock model cannot bound the output by its source's length, as ours does
    where no bound is saved (section 6.1: `max_new_tokens`): pass `max_new_tokens` to compare them on short sources.
    A bound that ours saves (as models of 0.3 and 0.4 did) is kept. Raises ValueError for models Marian
    cannot express (pre-LN).
    """
    config = model.config
    marian = MarianMTModel(marian_config(config))
    ours = {key: tensor.detach().to("cpu", torch.float32) for key, tensor in model.state_dict().items()}
    state = _marian_state_dict(ours, config.d_model, config.tie_word_embeddings)
    own = marian.state_dict()
    # load_state_dict(strict=True) then proves that every Marian tensor came from ours except these, and that
    # none of ours was left over.
    state.update({key: own[key] for key in _MARIAN_OWN_KEYS})
    marian.load_state_dict(state, strict=True)

    # Replaces the one MarianMTModel derived from its config; ours has no forced_eos_token_id or bad_words_ids.
    generation = marian.generation_config = copy.deepcopy(model.generation_config)
    if generation.max_new_tokens is not None:  # max_length counts the start token
        generation.max_length, generation.max_new_tokens = generation.max_new_tokens + 1, None
    elif generation.max_length is None:
        generation.max_length = config.max_position_embeddings
    return marian.eval()


def save_marian(
    model: TransformerForConditionalGeneration, tokenizer: PreTrainedTokenizerFast, folder: str | Path
) -> Path:
    """The "marian" format: `to_marian(model)` and the tokenizer, which stock transformers loads without remote code."""
    to_marian(model).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return Path(folder)
