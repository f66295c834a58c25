"""Properties of the model: the paper's sizes, masking, caching, backends, and Hugging Face integration."""

import itertools
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from conftest import assert_continues_under_both_cache_names, load_without_the_package, output_rows
from safetensors import safe_open
from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM
from transformers.cache_utils import DynamicCache

from hf_transformer import TransformerConfig, TransformerForConditionalGeneration, TransformerModel
from hf_transformer.model.modeling_transformer import CACHE_NAME


def make_model(config: TransformerConfig, **overrides) -> TransformerForConditionalGeneration:
    for key, value in overrides.items():
        setattr(config, key, value)
    return TransformerForConditionalGeneration(config).eval()


def random_batch(config: TransformerConfig, batch: int = 3, source_length: int = 9, target_length: int = 7):
    """Token ids that avoid the special tokens 0-3."""
    source = torch.randint(4, config.vocab_size, (batch, source_length))
    target = torch.randint(4, config.vocab_size, (batch, target_length))
    return source, target


# --- configuration ---------------------------------------------------------------------------------------------


def test_defaults_are_the_papers_base_model():
    config = TransformerConfig()
    assert (config.d_model, config.encoder_layers, config.decoder_layers) == (512, 6, 6)
    assert (config.encoder_attention_heads, config.encoder_ffn_dim, config.dropout) == (8, 2048, 0.1)
    assert config.activation_function == "relu" and config.scale_embedding and not config.normalize_before
    assert config.tie_word_embeddings and config.vocab_size == 37000
    assert (config.hidden_size, config.num_attention_heads, config.num_hidden_layers) == (512, 8, 6)


def parameter_count(config: TransformerConfig) -> int:
    """The parameters the paper's architecture has for `config`, counted from its sizes: one embedding matrix shared
    by both stacks and the output projection (section 3.4); per encoder layer self-attention (W^Q, W^K, W^V, W^O with
    biases), the feed-forward network (eq. 2) and two LayerNorms; per decoder layer those plus the encoder-decoder
    attention and a third LayerNorm; a final LayerNorm per stack when pre-LN. Sinusoidal positions have none."""
    d = config.d_model
    attention = 4 * (d * d + d)
    layer_norm = 2 * d

    def feed_forward(ffn_dim: int) -> int:
        return d * ffn_dim + ffn_dim + ffn_dim * d + d

    encoder_layer = attention + feed_forward(config.encoder_ffn_dim) + 2 * layer_norm
    decoder_layer = 2 * attention + feed_forward(config.decoder_ffn_dim) + 3 * layer_norm
    final_norms = 2 * layer_norm if config.normalize_before else 0
    return (
        config.vocab_size * d
        + config.encoder_layers * encoder_layer
        + config.decoder_layers * decoder_layer
        + final_norms
    )


@pytest.mark.parametrize(("preset", "papers_millions"), [("base", 65), ("big", 213)])
def test_presets_have_the_papers_parameter_counts(preset, papers_millions):
    """Exactly the count of the architecture's formula, where a missing or extra block, bias or untied matrix shows,
    and near the paper's Table 3 (65M and 213M), whose vocabulary the paper gives only roughly."""
    config = TransformerConfig.from_preset(preset)
    with torch.device("meta"):
        model = TransformerForConditionalGeneration(config)
    count = sum(p.numel() for p in model.parameters())  # tied matrices are counted once
    assert count == parameter_count(config)
    assert abs(count / 1e6 - papers_millions) < 2, count


def test_parameter_counts_follow_the_sizes_of_every_part(tiny_config):
    """Unequal stacks, feed-forward sizes and pre-LN: the count follows each size (each enters the formula apart)."""
    for changes in (
        {},
        {"encoder_layers": 3, "decoder_layers": 1},
        {"encoder_ffn_dim": 48, "decoder_ffn_dim": 80},
        {"normalize_before": True},
    ):
        config = TransformerConfig(**{**tiny_config.to_dict(), **changes})
        model = TransformerForConditionalGeneration(config)
        assert sum(p.numel() for p in model.parameters()) == parameter_count(config), changes


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("d_model", 100),  # not divisible by 8 heads
        ("encoder_attention_heads", 3),
        ("decoder_attention_heads", 7),
        ("encoder_layers", 0),
        ("decoder_ffn_dim", -1),
        ("vocab_size", 0),
        ("dropout", 1.0),
        ("attention_dropout", -0.1),
        ("activation_dropout", 1.5),
        ("activation_function", "swishy"),
        ("pad_token_id", 37000),
        ("eos_token_id", 40000),
        ("decoder_start_token_id", -1),
    ],
)
def test_invalid_config_values_raise_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        TransformerConfig(**{field: value})


@pytest.mark.parametrize(
    ("alias", "field", "value"),
    [("hidden_size", "d_model", 100), ("num_attention_heads", "encoder_attention_heads", 3)],  # 8 heads / 512
)
def test_an_alias_is_validated_like_its_field(alias, field, value):
    with pytest.raises(ValueError, match=field):
        TransformerConfig(**{alias: value})


def test_an_alias_sets_the_default_init_std_like_its_field():
    assert TransformerConfig(hidden_size=96).init_std == TransformerConfig(d_model=96).init_std == 96**-0.5


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(ValueError, match="base"):
        TransformerConfig.from_preset("huge")


# --- the architecture's properties -----------------------------------------------------------------------------


@pytest.mark.parametrize("normalize_before", [False, True])
@pytest.mark.parametrize("cache_name", ["cache", "past_key_values"])  # transformers 5.24 renamed the second
def test_cached_incremental_decoding_equals_full_forward(tiny_config, normalize_before, cache_name):
    model = make_model(tiny_config, normalize_before=normalize_before)
    source, target = random_batch(tiny_config)
    mask = torch.ones_like(source)
    mask[0, -3:] = 0
    with torch.no_grad():
        full = model(input_ids=source, attention_mask=mask, decoder_input_ids=target, use_cache=False).logits
        encoder_outputs = model.get_encoder()(source, mask)
        cache, steps = None, []
        for t in range(target.shape[1]):
            out = model(
                encoder_outputs=encoder_outputs,
                attention_mask=mask,
                decoder_input_ids=target[:, t : t + 1],
                use_cache=True,
                **{cache_name: cache},
            )
            cache = getattr(out, CACHE_NAME)
            assert cache.get_seq_length() == t + 1
            steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)


def test_right_padding_of_source_and_target_does_not_change_logits(tiny_config):
    model = make_model(tiny_config)
    source, target = random_batch(tiny_config, batch=1)
    pad = tiny_config.pad_token_id
    padded_source = torch.cat([source, torch.full((1, 5), pad)], dim=1)
    padded_mask = (padded_source != pad).long()
    padded_target = torch.cat([target, torch.full((1, 4), pad)], dim=1)
    with torch.no_grad():
        plain = model(input_ids=source, decoder_input_ids=target).logits
        padded = model(input_ids=padded_source, attention_mask=padded_mask, decoder_input_ids=padded_target).logits
    torch.testing.assert_close(padded[:, : target.shape[1]], plain, atol=1e-5, rtol=0)


def test_changing_a_future_target_token_does_not_change_earlier_logits(tiny_config):
    model = make_model(tiny_config)
    source, target = random_batch(tiny_config)
    changed = target.clone()
    changed[:, 4] = (changed[:, 4] + 1 - 4) % (tiny_config.vocab_size - 4) + 4
    with torch.no_grad():
        before = model(input_ids=source, decoder_input_ids=target).logits
        after = model(input_ids=source, decoder_input_ids=changed).logits
    torch.testing.assert_close(after[:, :4], before[:, :4], atol=1e-6, rtol=0)
    assert not torch.allclose(after[:, 4:], before[:, 4:])


def padded_inputs(config: TransformerConfig) -> dict[str, torch.Tensor]:
    """A random batch whose first two sources end in 2 and 4 padding positions."""
    source, target = random_batch(config)
    mask = torch.ones_like(source)
    mask[0, -2:] = 0
    mask[1, -4:] = 0
    return {"input_ids": source, "attention_mask": mask, "decoder_input_ids": target}


def outputs_under_sdpa_and(implementation: str, model: TransformerForConditionalGeneration, inputs: dict, **kwargs):
    """The model's outputs on `inputs` with sdpa attention, then with `implementation`."""
    with torch.no_grad():
        sdpa = model(**inputs, **kwargs)
        model.set_attn_implementation(implementation)
        return sdpa, model(**inputs, **kwargs)


@pytest.mark.parametrize("implementation", ["eager", "flex_attention"])
def test_attention_implementations_agree_with_sdpa(tiny_config, implementation):
    sdpa, other = outputs_under_sdpa_and(implementation, make_model(tiny_config), padded_inputs(tiny_config))
    torch.testing.assert_close(other.logits, sdpa.logits, atol=1e-5, rtol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="flash attention needs a CUDA GPU")
def test_flash_attention_agrees_with_sdpa_on_gpu(tiny_config):
    pytest.importorskip("flash_attn", reason="the flash-attn package is not installed")
    model = make_model(tiny_config).to("cuda", torch.bfloat16)
    source, target = (t.cuda() for t in random_batch(tiny_config))
    sdpa, flash = outputs_under_sdpa_and("flash_attention_2", model, {"input_ids": source, "decoder_input_ids": target})
    torch.testing.assert_close(flash.logits.float(), sdpa.logits.float(), atol=2e-2, rtol=0)


def test_attention_maps_are_returned_by_sdpa_and_eager_alike(tiny_config):
    inputs = padded_inputs(tiny_config)
    sdpa, eager = outputs_under_sdpa_and("eager", make_model(tiny_config), inputs, output_attentions=True)
    for outputs in (sdpa, eager):
        assert len(outputs.encoder_attentions) == tiny_config.encoder_layers
        cross = outputs.cross_attentions[-1]
        assert cross.shape == (3, 4, inputs["decoder_input_ids"].shape[1], inputs["input_ids"].shape[1])
        torch.testing.assert_close(cross.sum(-1), torch.ones(cross.shape[:-1]))
        assert cross[1, :, :, -4:].abs().max() == 0  # padded source tokens get no attention
        decoder_self = outputs.decoder_attentions[0]
        assert torch.triu(decoder_self, diagonal=1).abs().max() == 0  # nothing attends to the future
    torch.testing.assert_close(sdpa.cross_attentions[-1], eager.cross_attentions[-1], atol=1e-6, rtol=0)
    torch.testing.assert_close(eager.logits, sdpa.logits, atol=1e-5, rtol=0)


def test_every_layers_output_is_recorded_where_asked_and_the_outputs_stay_the_same(tiny_config):
    """transformers' `capture_outputs` records each layer's input and output (and its attention weights) from the
    layers' returns; with padding, the layers then compute every position (not only the ones that count, as they do
    otherwise), so that the recorded states are [batch, length, d_model]. The outputs are the same either way, and
    the config's `output_hidden_states` asks as the argument does."""
    model = make_model(tiny_config)
    inputs = padded_inputs(tiny_config)
    with torch.no_grad():
        plain = model(**inputs)
        recorded = model(**inputs, output_hidden_states=True, output_attentions=True)
        model.config.output_hidden_states = True
        from_config = model(**inputs)
    torch.testing.assert_close(recorded.logits, plain.logits, atol=1e-5, rtol=0)  # eager and sdpa round apart
    assert plain.encoder_hidden_states is None and plain.decoder_attentions is None
    for states, last in (
        (recorded.encoder_hidden_states, recorded.encoder_last_hidden_state),
        (recorded.decoder_hidden_states, None),
    ):
        assert len(states) == tiny_config.encoder_layers + 1
        assert all(state.shape == states[0].shape and state.dim() == 3 for state in states)
        if last is not None:
            assert torch.equal(states[-1], last)
    assert len(from_config.decoder_hidden_states) == tiny_config.decoder_layers + 1
    assert len(recorded.decoder_attentions) == len(recorded.cross_attentions) == tiny_config.decoder_layers


def test_unknown_keyword_arguments_are_refused(tiny_config):
    """forward took **kwargs and dropped what it did not know: a misspelt argument changed nothing, silently."""
    model = make_model(tiny_config)
    source, target = random_batch(tiny_config)
    with pytest.raises(TypeError, match="unexpected keyword argument 'decoder_attention_masks'"):
        model(input_ids=source, decoder_input_ids=target, decoder_attention_masks=torch.ones_like(target))
    with pytest.raises(TypeError, match="unexpected keyword argument 'output_attention'"):
        model.model(input_ids=source, decoder_input_ids=target, output_attention=True)
    with pytest.raises(ValueError, match=r"model_kwargs.* not used by the model: \['num_beam'\]"):
        model.generate(source, num_beam=2, max_new_tokens=3)


def test_sinusoidal_encoding_matches_the_formula():
    from hf_transformer.model.modeling_transformer import SinusoidalPositionalEncoding

    d_model = 16
    encoding = SinusoidalPositionalEncoding(50, d_model)(torch.arange(50))
    assert torch.equal(SinusoidalPositionalEncoding(50, d_model)(torch.arange(7, 10)), encoding[7:10])
    for pos in (0, 7, 49):
        for i in range(d_model // 2):
            angle = torch.tensor(pos / 10000 ** (2 * i / d_model))
            torch.testing.assert_close(encoding[pos, 2 * i], torch.sin(angle))
            torch.testing.assert_close(encoding[pos, 2 * i + 1], torch.cos(angle))


def test_dropout_zeroes_a_fraction_p_and_rescales_the_rest():
    from hf_transformer.model.speed import apply_dropout

    x = (torch.rand(1000, 1000) + 1.0).requires_grad_()  # no zeros of its own
    assert apply_dropout(x, 0.1, training=False) is x
    torch.manual_seed(0)
    dropped = apply_dropout(x, 0.1, training=True)
    kept = dropped != 0
    assert abs(1 - kept.float().mean().item() - 0.1) < 3e-3  # 10 standard deviations of a million draws
    torch.testing.assert_close(dropped[kept], x[kept] / 0.9)
    dropped.sum().backward()
    torch.testing.assert_close(x.grad, kept / 0.9)
    torch.manual_seed(0)
    assert torch.equal(apply_dropout(x, 0.1, training=True) != 0, kept)  # reproducible from the seed
    # Neighbours share a random word but not their fate: both are dropped with probability p^2.
    assert abs((~kept[:, 0::2] & ~kept[:, 1::2]).float().mean().item() - 0.01) < 2e-3
    assert apply_dropout(x.detach().bfloat16(), 0.3, training=True).dtype == torch.bfloat16


def test_shared_embeddings_and_output_projection_are_one_matrix(tiny_config):
    model = make_model(tiny_config)
    shared = model.model.encoder.embed_tokens.weight
    assert model.model.decoder.embed_tokens.weight is shared and model.lm_head.weight is shared
    untied = make_model(TransformerConfig(**{**tiny_config.to_dict(), "tie_word_embeddings": False}))
    assert untied.lm_head.weight is not untied.model.encoder.embed_tokens.weight


def test_loss_is_the_papers_label_smoothed_cross_entropy_per_target_token(tiny_config):
    model = make_model(tiny_config)
    source, target = random_batch(tiny_config)
    labels = target.clone()
    labels[0, -2:] = -100
    labels[1, 2] = -100  # between targets: no padding, later positions still attend to it
    out = model(input_ids=source, labels=labels, return_logits=True)
    is_target = labels != -100
    logits = out.logits[is_target]
    expected = torch.nn.functional.cross_entropy(logits, labels[is_target], label_smoothing=0.1)
    assert tiny_config.label_smoothing == 0.1  # section 5.4
    torch.testing.assert_close(out.loss, expected)
    nll = model(input_ids=source, labels=labels, label_smoothing=0.0).loss
    torch.testing.assert_close(nll, torch.nn.functional.cross_entropy(logits, labels[is_target]))
    # decoder inputs are the labels shifted right behind the start token
    shifted = model.prepare_decoder_input_ids_from_labels(labels)
    assert shifted[:, 0].eq(tiny_config.decoder_start_token_id).all()
    assert torch.equal(shifted[2, 1:], labels[2, :-1])
    summed = model(input_ids=source, labels=labels, num_items_in_batch=10).loss
    torch.testing.assert_close(summed, expected * is_target.sum() / 10)


def test_logits_with_labels_are_computed_in_training_only_when_asked_and_change_no_loss_or_gradient(tiny_config):
    """In eval mode they come with the loss, as Hugging Face's models give them (the Trainer's metrics read them)."""
    model = make_model(tiny_config, dropout=0.0).train()  # dropout 0: the same function as in eval mode
    source, target = random_batch(tiny_config)
    labels = target.masked_fill(torch.arange(target.shape[1]) >= torch.tensor([[7], [4], [6]]), -100)
    with_logits = model(input_ids=source, labels=labels, return_logits=True)
    with_logits.loss.backward()
    gradients = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()

    without = model(input_ids=source, labels=labels)
    assert without.logits is None  # the loss never holds [tokens, vocabulary] logits
    torch.testing.assert_close(without.loss, with_logits.loss)
    without.loss.backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, gradients[name], msg=name)
    evaluated = model.eval()(input_ids=source, labels=labels)
    torch.testing.assert_close(evaluated.logits, with_logits.logits)
    torch.testing.assert_close(evaluated.loss, with_logits.loss)

    full = model(input_ids=source, decoder_input_ids=target).logits
    torch.testing.assert_close(model(input_ids=source, decoder_input_ids=target, logits_to_keep=2).logits, full[:, -2:])
    kept = model(input_ids=source, decoder_input_ids=target, logits_to_keep=torch.tensor([0, 3])).logits
    torch.testing.assert_close(kept, full[:, [0, 3]])


@pytest.mark.parametrize("checkpointing", [False, True])
def test_padding_is_not_computed_and_changes_no_logit_loss_or_gradient(tiny_config, checkpointing):
    """The position-wise layers see only real source tokens and the target positions up to each row's last label;
    logits, loss and gradients equal those of every pair run alone, unpadded."""
    torch.manual_seed(0)
    model = make_model(tiny_config, dropout=0.0)
    if checkpointing:
        model.train().activation_checkpointing_enable()
    source, labels = random_batch(tiny_config, batch=3, source_length=9, target_length=7)
    source_lengths, target_lengths = [9, 5, 7], [7, 4, 6]
    attention_mask = (torch.arange(9) < torch.tensor(source_lengths)[:, None]).long()
    source = source.masked_fill(attention_mask == 0, tiny_config.pad_token_id)
    labels = labels.masked_fill(torch.arange(7) >= torch.tensor(target_lengths)[:, None], -100)
    labels[2, 1] = -100  # ignored, but later positions attend to it: still computed
    rows_seen = {}

    def count_rows(name):
        def hook(module, args, output):
            rows_seen[name] = args[0].shape[0]

        return hook

    for name, module in model.named_modules():
        if name.endswith("feed_forward.fc1"):
            module.register_forward_hook(count_rows(name))

    is_target = labels != -100
    tokens = int(is_target.sum())
    batched = model(
        input_ids=source, attention_mask=attention_mask, labels=labels, num_items_in_batch=tokens, return_logits=True
    )
    batched.loss.backward()
    batched_gradients = {name: p.grad.clone() for name, p in model.named_parameters()}
    assert len(rows_seen) == tiny_config.encoder_layers + tiny_config.decoder_layers
    for name, rows in rows_seen.items():
        assert rows == (sum(source_lengths) if ".encoder." in name else sum(target_lengths)), name

    model.zero_grad()
    alone_logits, alone_loss = [], 0.0
    for row, (source_length, target_length) in enumerate(zip(source_lengths, target_lengths, strict=True)):
        row_labels = labels[row : row + 1, :target_length]
        row_source = source[row : row + 1, :source_length]
        alone = model(input_ids=row_source, labels=row_labels, num_items_in_batch=tokens, return_logits=True)
        alone.loss.backward()
        alone_loss += alone.loss
        alone_logits.append(alone.logits[row_labels != -100])
    torch.testing.assert_close(batched.logits[is_target], torch.cat(alone_logits), atol=1e-5, rtol=0)
    torch.testing.assert_close(batched.loss, alone_loss)
    for name, p in model.named_parameters():
        torch.testing.assert_close(batched_gradients[name], p.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_training_flops_count_every_matrix_multiply_of_a_training_step(tiny_config):
    from torch.utils.flop_counter import FlopCounterMode

    from lightning_modules.callbacks.throughput import training_flops

    # Unequal stacks and feed-forward sizes, so that a term counted in the wrong stack shows.
    model = make_model(tiny_config, decoder_layers=3, encoder_ffn_dim=48, _attn_implementation="eager")
    source_lengths, target_lengths = [9, 3, 5], [4, 7, 5]
    counted = 0
    for source_length, target_length in zip(source_lengths, target_lengths, strict=True):
        source, labels = random_batch(tiny_config, 1, source_length, target_length)
        with FlopCounterMode(display=False) as counter:
            model(input_ids=source, labels=labels, return_logits=False).loss.backward()  # as training calls it
        counted += counter.get_total_flops()
    expected = training_flops(tiny_config, torch.tensor(source_lengths), torch.tensor(target_lengths))
    assert int(expected) == counted


def test_torch_compile_gives_the_same_loss_and_gradients(tiny_config):
    """The training step as the speed benchmark's compiled runs take it: padded source, -100 labels."""
    model = make_model(tiny_config)  # eval: no dropout, whose random stream differs under compilation
    source, labels = random_batch(tiny_config)
    attention_mask = torch.ones_like(source)
    attention_mask[0, 6:] = 0
    labels[1, 5:] = -100

    def loss_and_gradients(forward: Callable) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad()
        batch = dict(input_ids=source, attention_mask=attention_mask, labels=labels)
        loss = forward(**batch).loss
        loss.backward()
        return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}

    eager_loss, eager_gradients = loss_and_gradients(model)
    compiled_loss, compiled_gradients = loss_and_gradients(torch.compile(model))
    torch.testing.assert_close(compiled_loss, eager_loss)
    for name, gradient in eager_gradients.items():
        torch.testing.assert_close(compiled_gradients[name], gradient, msg=name)


@pytest.mark.parametrize("training", [False, True], ids=["eval", "training on the CPU"])
def test_token_ids_outside_the_vocabulary_give_a_clear_error(tiny_config, training):
    model = make_model(tiny_config).train(training)  # only training on a GPU leaves the check to the data pipeline
    source, target = random_batch(tiny_config)
    source[0, 2] = tiny_config.vocab_size + 5
    with pytest.raises(ValueError, match=r"outside the vocabulary \[0, 64\).*resize_token_embeddings"):
        model(input_ids=source, decoder_input_ids=target)
    with pytest.raises(ValueError, match=r"outside the vocabulary \[0, 64\) in labels:.*resize_token_embeddings"):
        model(input_ids=target, labels=source)
    source[0, 2] = -1
    with pytest.raises(ValueError, match=r"\[-1\] are outside the vocabulary \[0, 64\) in input_ids: .*never negative"):
        model(input_ids=source, decoder_input_ids=target)
    target[1, -2:] = -1  # padding marked with another negative id than the loss ignores
    with pytest.raises(ValueError, match=r"\[-1\] .* in labels: mark the positions that the loss ignores with -100"):
        model(input_ids=source.clamp(min=0), labels=target)


@pytest.mark.parametrize("shape", [(0, 5), (2, 0)])
def test_an_empty_batch_or_sequence_gives_a_clear_error(tiny_config, shape):
    model = make_model(tiny_config)
    empty = torch.ones(shape, dtype=torch.long)
    with pytest.raises(ValueError, match=rf"input_ids has shape \({shape[0]}, {shape[1]}\): a batch needs at least"):
        model(input_ids=empty, labels=torch.ones(max(shape[0], 1), 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"input_ids has shape"):
        model.generate(empty, max_new_tokens=3)


def test_too_long_input_names_max_position_embeddings(tiny_config):
    model = make_model(tiny_config)
    source = torch.randint(4, 64, (1, tiny_config.max_position_embeddings + 1))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model(input_ids=source, decoder_input_ids=source[:, :3])


@pytest.mark.parametrize("decoder_input", ["labels", "labels and decoder_input_ids", "decoder_input_ids"])
def test_gradient_checkpointing_gives_the_same_loss_and_gradients(tiny_config, decoder_input):
    """Also where the decoder would build a cache in training (no labels): checkpointing must not replay its
    update."""
    source, target = random_batch(tiny_config)
    inputs = {"input_ids": source}
    if "labels" in decoder_input:
        inputs["labels"] = target
    if "decoder_input_ids" in decoder_input:
        inputs["decoder_input_ids"] = torch.randint(4, tiny_config.vocab_size, target.shape)
    losses, gradients = [], []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = TransformerForConditionalGeneration(tiny_config).train()
        if checkpointing:
            model.activation_checkpointing_enable()
        torch.manual_seed(1)  # same dropout masks in both runs
        outputs = model(**inputs)
        loss = outputs.loss if "labels" in inputs else outputs.logits.square().mean()
        loss.backward()
        losses.append(loss.detach())
        gradients.append({name: p.grad.clone() for name, p in model.named_parameters()})
    torch.testing.assert_close(losses[0], losses[1])
    assert gradients[0].keys() == gradients[1].keys()
    for name, gradient in gradients[0].items():
        torch.testing.assert_close(gradients[1][name], gradient, msg=name)


def test_training_with_labels_and_decoder_input_ids_builds_no_cache(tiny_config):
    model = make_model(tiny_config).train()
    source, target = random_batch(tiny_config)
    outputs = model(input_ids=source, labels=target, decoder_input_ids=target)
    assert getattr(outputs, CACHE_NAME) is None


def test_a_missing_decoder_input_names_what_to_pass(tiny_config):
    model = make_model(tiny_config)
    source, _ = random_batch(tiny_config)
    for call in (model, model.model):
        with pytest.raises(ValueError, match=r"exactly one of decoder_input_ids and decoder_inputs_embeds \(or labels"):
            call(input_ids=source)


@pytest.mark.parametrize("field", ["pad_token_id", "decoder_start_token_id"])
def test_labels_without_the_ids_to_shift_them_name_the_config_field(tiny_config, field):
    model = make_model(tiny_config, **{field: None})
    source, target = random_batch(tiny_config)
    with pytest.raises(ValueError, match=rf"config\.{field} is None.*decoder_input_ids"):
        model(input_ids=source, labels=target)
    assert model(input_ids=source, labels=target, decoder_input_ids=target).loss.isfinite()


@pytest.mark.parametrize("mask_shape", [(3, 5), (3, 12), (2, 9)])
def test_an_attention_mask_of_another_shape_names_both_shapes(tiny_config, mask_shape):
    model = make_model(tiny_config)
    source, target = random_batch(tiny_config, batch=3, source_length=9, target_length=7)
    mask = torch.ones(mask_shape, dtype=torch.long)
    mask[0, -1] = 0  # padding: the packing of padded tokens is where a wrong shape failed
    with pytest.raises(
        ValueError,
        match=rf"attention_mask has shape \({mask_shape[0]}, {mask_shape[1]}\), but the source has shape \(3, 9\)",
    ):
        model(input_ids=source, attention_mask=mask, labels=target)
    target_mask = torch.ones(mask_shape[0], mask_shape[1] - 2, dtype=torch.long)
    with pytest.raises(ValueError, match=r"decoder_attention_mask has shape .*, but the target has shape \(3, 7\)"):
        model(input_ids=source, decoder_input_ids=target, decoder_attention_mask=target_mask)
    encoder_outputs = model.get_encoder()(source)
    with pytest.raises(ValueError, match=r"attention_mask has shape .*, but the encoder output has shape \(3, 9\)"):
        model(encoder_outputs=encoder_outputs, attention_mask=mask, decoder_input_ids=target)


def test_labels_and_decoder_inputs_of_other_shapes_name_both(tiny_config):
    model = make_model(tiny_config)
    source, target = random_batch(tiny_config)
    with pytest.raises(ValueError, match=r"labels has shape \(3, 7\), but the decoder input has shape \(3, 5\)"):
        model(input_ids=source, labels=target, decoder_input_ids=target[:, :5])


def test_resize_token_embeddings_keeps_the_ties(tiny_config):
    model = make_model(tiny_config)
    model.resize_token_embeddings(80)
    assert model.config.vocab_size == 80
    assert model.lm_head.weight is model.model.encoder.embed_tokens.weight
    assert model.model.decoder.embed_tokens.weight.shape == (80, 32)
    source, target = random_batch(model.config)
    assert model(input_ids=source, decoder_input_ids=target).logits.shape[-1] == 80


# --- generation ------------------------------------------------------------------------------------------------


# Tests that compare two computations of the same model (cached against full, batched against alone) run it in float64:
# the two sum in other orders, and in float64 they differ by about 1e-16, far below any gap between two candidate
# tokens, so that the same tokens win (in float32 a near tie could go either way).


def test_greedy_generation_equals_an_argmax_loop_and_the_default_is_the_papers_beam_search(tiny_config):
    model = make_model(tiny_config).double()
    source, _ = random_batch(tiny_config, batch=2)
    mask = torch.ones_like(source)
    greedy = model.generate(source, attention_mask=mask, num_beams=1, max_new_tokens=6, min_new_tokens=6)
    decoded = torch.full((2, 1), tiny_config.decoder_start_token_id)
    with torch.no_grad():
        for _ in range(6):
            logits = model(input_ids=source, attention_mask=mask, decoder_input_ids=decoded).logits[:, -1]
            logits[:, tiny_config.eos_token_id] = -float("inf")  # what min_new_tokens does
            decoded = torch.cat([decoded, logits.argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(greedy, decoded)

    assert model.generation_config.num_beams == 4 and model.generation_config.length_penalty == 0.6


def test_beam_search_with_a_beam_for_every_hypothesis_finds_the_exhaustive_searchs_best(tiny_config):
    """Beam search through our cache, with as many beams as there are outputs of up to 3 tokens over a 6-token
    vocabulary, keeps every hypothesis and so must return the best ones of an exhaustive search: each output (ending
    with </s>, or cut at 3 tokens) scored from the model's full forward pass as its summed log-probability over its
    length ** length penalty, and ranked. A cache that follows the wrong beams, or a wrong score, returns others."""
    config = TransformerConfig(**{**tiny_config.to_dict(), "vocab_size": 6})
    model = make_model(config).double()  # float64: one search against another, no near ties
    source = torch.tensor([[4, 5, 5, 4, 2], [5, 4, 2, 0, 0]])
    mask = (source != 0).long()
    steps, eos = 3, config.eos_token_id
    others = [token for token in range(config.vocab_size) if token != eos]
    outputs = [[*prefix, eos] for k in range(steps) for prefix in itertools.product(others, repeat=k)]
    outputs += [[*prefix, last] for prefix in itertools.product(others, repeat=steps - 1) for last in others]
    found = model.generate(
        source,
        attention_mask=mask,
        num_beams=config.vocab_size**steps,
        num_return_sequences=5,
        max_new_tokens=steps,
        length_penalty=0.6,
        return_dict_in_generate=True,
        output_scores=True,
    )
    start = config.decoder_start_token_id
    for row in range(len(source)):
        # Each output read teacher-forced, padded to 3 tokens (what follows a token does not change its probability).
        decoder_input_ids = torch.tensor(
            [[start, *output, *[eos] * (steps - len(output))][:steps] for output in outputs]
        )
        with torch.no_grad():
            logits = model(
                input_ids=source[row : row + 1].expand(len(outputs), -1),
                attention_mask=mask[row : row + 1].expand(len(outputs), -1),
                decoder_input_ids=decoder_input_ids,
            ).logits
        log_probs = logits.log_softmax(-1)
        scores = [
            float(sum(log_probs[index, position, token] for position, token in enumerate(output))) / len(output) ** 0.6
            for index, output in enumerate(outputs)
        ]
        best = sorted(range(len(outputs)), key=lambda index: -scores[index])[:5]
        beams = found.sequences[5 * row : 5 * row + 5].tolist()
        assert [output_rows(torch.tensor([beam]), eos)[0][1:] for beam in beams] == [outputs[i] for i in best]
        expected = torch.tensor([scores[index] for index in best])  # generate() returns float32 scores
        torch.testing.assert_close(found.sequences_scores[5 * row : 5 * row + 5], expected)


def test_top_k_sampling_draws_only_among_the_k_most_likely_tokens(tiny_config):
    """Each sampled token, at every step and in every sequence, is one of the k tokens the model's full forward pass
    gives the highest probabilities after the tokens before it; and sampling does draw: the k tokens all come up."""
    model = make_model(tiny_config).double()
    source, _ = random_batch(tiny_config, batch=2)
    mask = torch.ones_like(source)
    top_k, steps = 3, 6
    sampled = model.generate(
        source,
        attention_mask=mask,
        do_sample=True,
        num_beams=1,
        top_k=top_k,
        max_new_tokens=steps,
        min_new_tokens=steps,
        num_return_sequences=50,
    )
    with torch.no_grad():
        logits = model(
            input_ids=source.repeat_interleave(50, dim=0),
            attention_mask=mask.repeat_interleave(50, dim=0),
            decoder_input_ids=sampled[:, :-1],
        ).logits
    logits[:, :, tiny_config.eos_token_id] = -float("inf")  # what min_new_tokens does
    allowed = logits.topk(top_k, dim=-1).indices
    assert (allowed == sampled[:, 1:, None]).any(-1).all()
    first_steps = {(index // 50, token) for index, token in enumerate(sampled[:, 1].tolist())}
    assert first_steps == {(row, token) for row in range(2) for token in allowed[50 * row, 0].tolist()}


def test_beam_search_reorders_only_the_self_attention_cache_and_equals_reordering_both(tiny_config, monkeypatch):
    model = make_model(tiny_config)
    source, _ = random_batch(tiny_config, batch=3)
    mask = torch.ones_like(source)
    mask[1, 6:] = 0
    reordered, reorder = [], DynamicCache.reorder_cache

    def recording_reorder(cache: DynamicCache, beam_idx: torch.Tensor) -> None:
        reordered.append(cache)
        reorder(cache, beam_idx)

    monkeypatch.setattr(DynamicCache, "reorder_cache", recording_reorder)
    options = dict(attention_mask=mask, num_beams=4, max_new_tokens=6, return_dict_in_generate=True, output_scores=True)
    ours = model.generate(source, **options)
    assert reordered and all(cache is ours.past_key_values.self_attention_cache for cache in reordered)

    monkeypatch.delattr(TransformerForConditionalGeneration, "_reorder_cache")  # generate() then reorders both
    reordered.clear()
    both = model.generate(source, **options)
    assert any(cache is both.past_key_values.cross_attention_cache for cache in reordered)
    assert torch.equal(ours.sequences, both.sequences)
    torch.testing.assert_close(ours.sequences_scores, both.sequences_scores, atol=0, rtol=0)


def test_a_tiny_model_learns_to_copy(tiny_config):
    """The classic sanity check of an encoder-decoder: copy random sequences exactly."""
    torch.manual_seed(0)
    config = TransformerConfig(
        **{**tiny_config.to_dict(), "d_model": 64, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "dropout": 0.0}
    )
    model = TransformerForConditionalGeneration(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3, betas=(0.9, 0.98), eps=1e-9)
    # The paper's shape of schedule: linear warm-up, then inverse square-root decay.
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min((step + 1) / 50, (50 / (step + 1)) ** 0.5))
    symbols, eos = torch.arange(4, 14), config.eos_token_id

    def batch(size: int):
        tokens = symbols[torch.randint(0, len(symbols), (size, 8))]
        return torch.cat([tokens, torch.full((size, 1), eos)], dim=1)

    for _ in range(600):
        sequences = batch(64)
        loss = model(input_ids=sequences, labels=sequences).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    model.eval()
    test = batch(200)
    output = model.generate(test, attention_mask=torch.ones_like(test), num_beams=1, max_new_tokens=10)
    exact = (output[:, 1 : test.shape[1] + 1] == test).all(dim=1).float().mean().item()
    assert exact == 1.0, f"exact match {exact:.2f} after training, loss {loss.item():.4f}"


# --- Hugging Face integration ----------------------------------------------------------------------------------


def test_auto_classes_resolve_our_classes(tiny_config):
    assert isinstance(AutoConfig.for_model("vaswani_transformer"), TransformerConfig)
    assert isinstance(AutoModel.from_config(tiny_config), TransformerModel)
    assert isinstance(AutoModelForSeq2SeqLM.from_config(tiny_config), TransformerForConditionalGeneration)


def test_save_and_load_round_trip_exactly(tiny_config, tmp_path):
    model = make_model(tiny_config)
    source, target = random_batch(tiny_config)
    model.save_pretrained(tmp_path)
    with safe_open(tmp_path / "model.safetensors", "pt") as weights:
        stored = weights.keys()
        embedding_keys = [key for key in stored if "embed_tokens" in key or "lm_head" in key]
    assert embedding_keys == ["model.encoder.embed_tokens.weight"]  # the tied matrix is written once
    assert not any("positional_encoding" in key for key in stored)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["auto_map"]["AutoModelForSeq2SeqLM"] == "modeling_transformer.TransformerForConditionalGeneration"

    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert isinstance(loaded, TransformerForConditionalGeneration)
    assert loaded.lm_head.weight is loaded.model.encoder.embed_tokens.weight
    with torch.no_grad():
        torch.testing.assert_close(
            loaded(input_ids=source, decoder_input_ids=target).logits,
            model(input_ids=source, decoder_input_ids=target).logits,
            atol=0,
            rtol=0,
        )
    assert torch.equal(loaded.generate(source, max_new_tokens=5), model.generate(source, max_new_tokens=5))

    model.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert len(list((tmp_path / "sharded").glob("model-*.safetensors"))) > 1
    resharded = TransformerForConditionalGeneration.from_pretrained(tmp_path / "sharded")
    assert all(
        torch.equal(a, b) for a, b in zip(resharded.state_dict().values(), model.state_dict().values(), strict=True)
    )
    half = TransformerForConditionalGeneration.from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert half.lm_head.weight.dtype == torch.bfloat16
    assert half.generate(source, max_new_tokens=3).shape[0] == 3
    # The sinusoid tables are not saved: from_pretrained, which builds on the meta device, recomputes them.
    sinusoids = model.model.encoder.positional_encoding.table
    for stack in (loaded.model.encoder, loaded.model.decoder, half.model.encoder, half.model.decoder):
        table = stack.positional_encoding.table
        assert torch.equal(table, sinusoids.to(table.dtype))


def test_generate_bounds_the_output_by_section_6_1_or_the_callers_bound_without_a_warning(tiny_config, tmp_path):
    """Without a bound, a saved model's `generate()` stops at section 6.1's, the source's length + 50 tokens within the
    positions (`max_new_tokens`), as `translate()` does: the bound saved before, min(256, positions) - 1 tokens
    whatever the source, made the pipeline and `translate()` disagree. A caller's `max_new_tokens` or `max_length`
    (as an argument or in a generation config) bounds the output in its place, without transformers' warnings."""
    from transformers import GenerationConfig
    from transformers.testing_utils import CaptureLogger
    from transformers.utils import logging

    from hf_transformer.model.configuration_transformer import MAX_LENGTH_OFFSET, max_new_tokens

    make_model(tiny_config).save_pretrained(tmp_path / "model")
    assert "max_new_tokens" not in json.loads((tmp_path / "model" / "generation_config.json").read_text())
    model = TransformerForConditionalGeneration.from_pretrained(tmp_path / "model").eval()
    positions = tiny_config.max_position_embeddings
    with torch.no_grad():
        model.lm_head.weight[tiny_config.eos_token_id] = -1e4  # never ends early: the bound decides the length
    lengths = {}
    with CaptureLogger(logging.get_logger("transformers.generation.utils")) as captured:
        for source_length in (5, 20):  # 55 new tokens, then 70 cut to the positions' 63
            source = random_batch(tiny_config, batch=2, source_length=source_length)[0]
            lengths[source_length] = model.generate(source, num_beams=1).shape[1] - 1  # - 1: the start token
        lengths["max_new_tokens"] = model.generate(source, max_new_tokens=3).shape[1]
        lengths["max_length"] = model.generate(source, max_length=5).shape[1]
    assert captured.out == ""
    with CaptureLogger(logging.get_logger("transformers.generation.utils")) as captured:
        lengths["config"] = model.generate(source, generation_config=GenerationConfig(max_length=6)).shape[1]
    assert "seem to have been set" not in captured.out
    assert lengths == {5: 5 + MAX_LENGTH_OFFSET, 20: positions - 1, "max_new_tokens": 4, "max_length": 5, "config": 6}
    assert [max_new_tokens(n, positions) for n in (5, 20)] == [lengths[5], lengths[20]]


def test_remote_code_load_without_the_package_gives_identical_outputs(tiny_config, tmp_path):
    model = make_model(tiny_config)
    source, target = random_batch(tiny_config)
    model.save_pretrained(tmp_path / "model")
    remote = load_without_the_package(tmp_path / "model", source, target)
    with torch.no_grad():
        torch.testing.assert_close(
            remote["logits"], model(input_ids=source, decoder_input_ids=target).logits, atol=0, rtol=0
        )
    assert torch.equal(remote["beams"], model.generate(source, max_new_tokens=5))
    assert_continues_under_both_cache_names(remote)


def test_an_exported_folder_carries_exactly_the_files_of_the_model_folder_as_its_code(
    tiny_config, tiny_tokenizer, tmp_path
):
    """`hf_transformer/model/` is the remote code: a folder written by `export` carries each of its files unchanged
    (but its `__init__.py`, which the flat folder does not need), and nothing else of the package."""
    import hf_transformer.model
    from hf_transformer.export import export_model

    folder = export_model(make_model(tiny_config), tiny_tokenizer, tmp_path / "exported")
    package = Path(hf_transformer.model.__file__).parent
    model_files = {path.name: path.read_bytes() for path in package.glob("*.py") if path.name != "__init__.py"}
    assert {path.name: path.read_bytes() for path in folder.glob("*.py")} == model_files


def test_corrupt_weights_are_refused_naming_the_file(tiny_config, tmp_path):
    """Overwritten tensor bytes used to load as NaN weights without a word, and a truncated file failed inside
    safetensors naming no file: both name it, also when the model loads as remote code."""
    make_model(tiny_config).save_pretrained(tmp_path / "model")
    weights = tmp_path / "model" / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:-64] + b"\xff" * 64)  # the end of the last tensor: float32 NaNs
    with pytest.raises(ValueError, match=r"model/model\.safetensors hold NaN or infinite values"):
        TransformerForConditionalGeneration.from_pretrained(tmp_path / "model")
    source, target = random_batch(tiny_config)
    error = load_without_the_package(tmp_path / "model", source, target, expect_failure=True)
    assert "model/model.safetensors hold NaN or infinite values" in error, error[-2000:]

    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(OSError, match=r"Cannot read the weights in .*model/model\.safetensors, a truncated"):
        TransformerForConditionalGeneration.from_pretrained(tmp_path / "model")


def test_seq2seq_trainer_trains_with_label_smoothing(tiny_config, tiny_tokenizer, tmp_path):
    from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainer, Seq2SeqTrainingArguments

    config = TransformerConfig(**{**tiny_config.to_dict(), "vocab_size": len(tiny_tokenizer)})
    model = TransformerForConditionalGeneration(config)
    pairs = [("a dog runs", "ein hund rennt"), ("two men play music", "zwei männer spielen musik")] * 16
    dataset = [tiny_tokenizer(source, text_target=target) for source, target in pairs]
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path),
        max_steps=40,
        per_device_train_batch_size=8,
        learning_rate=3e-3,
        label_smoothing_factor=0.1,
        logging_steps=5,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
    )
    trainer = Seq2SeqTrainer(
        model=model,
        args=args,
        train_dataset=dataset,
        data_collator=DataCollatorForSeq2Seq(tiny_tokenizer, model=model),
    )
    assert trainer.label_smoother is not None
    assert trainer.model_accepts_loss_kwargs  # it passes num_items_in_batch, which forward takes by name
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert losses[-1] < 0.5 * losses[0], losses
    model.eval()
    inputs = tiny_tokenizer(["a dog runs"], return_tensors="pt")
    translation = tiny_tokenizer.decode(model.generate(**inputs, max_new_tokens=10)[0], skip_special_tokens=True)
    assert translation == "ein hund rennt"


def test_translation_pipeline_from_a_saved_folder(tiny_config, tiny_tokenizer, tmp_path):
    from transformers import pipeline

    from hf_transformer import TranslationPipeline

    config = TransformerConfig(**{**tiny_config.to_dict(), "vocab_size": len(tiny_tokenizer)})
    model = TransformerForConditionalGeneration(config).eval()
    TranslationPipeline(model=model, tokenizer=tiny_tokenizer).save_pretrained(tmp_path)
    assert (tmp_path / "pipeline_translation.py").exists()
    assert "translation" in json.loads((tmp_path / "config.json").read_text())["custom_pipelines"]
    translator = pipeline(model=str(tmp_path), trust_remote_code=True)
    sentences = ["a dog runs", "two men play music"]
    results = translator(sentences, max_new_tokens=5)
    expected = [
        tiny_tokenizer.decode(
            model.generate(**tiny_tokenizer(s, return_tensors="pt"), max_new_tokens=5)[0], skip_special_tokens=True
        ).strip()
        for s in sentences
    ]
    assert [result["translation_text"] for result in results] == expected


@pytest.mark.parametrize(("num_beams", "length_penalty"), [(4, 0.6), (1, 1.0), (3, -0.5)])
def test_shrinking_beam_search_equals_generate_on_each_sentence(tiny_config, num_beams, length_penalty):
    """Sentences leave the batch as they finish; each result is still what generate() gives for it alone."""
    from hf_transformer.decoding.search import beam_search

    model = make_model(tiny_config).double()
    with torch.no_grad():
        model.lm_head.weight[tiny_config.eos_token_id] *= 4  # so that some sentences end early, some at max length
    lengths = torch.randint(3, 12, (16,))
    input_ids, _ = random_batch(tiny_config, batch=16, source_length=12)
    attention_mask = (torch.arange(12) < lengths[:, None]).long()
    input_ids = input_ids * attention_mask
    results = beam_search(
        model, input_ids, attention_mask, num_beams=num_beams, length_penalty=length_penalty, max_length_offset=8
    )
    for row, result in enumerate(results):
        source = input_ids[row : row + 1, : lengths[row]]
        expected = model.generate(
            source, num_beams=num_beams, length_penalty=length_penalty, max_length=int(lengths[row]) + 8 + 1
        )
        assert result[0].token_ids == expected[0].tolist()
    ended_by_eos = [result[0].token_ids[-1] == tiny_config.eos_token_id for result in results]
    assert any(ended_by_eos) and not all(ended_by_eos)


def test_translate_batches_by_length_and_keeps_the_input_order(tiny_config, tiny_tokenizer):
    from hf_transformer import translate

    config = TransformerConfig(**{**tiny_config.to_dict(), "vocab_size": len(tiny_tokenizer)})
    model = TransformerForConditionalGeneration(config).eval().double()
    sentences = ["two men play music on the grass", "a dog", "ein hund rennt", "a dog runs on the grass"]
    one_by_one = []
    for sentence in sentences:
        inputs = tiny_tokenizer(sentence, return_tensors="pt")
        output = model.generate(**inputs, num_beams=2, max_length=inputs["input_ids"].shape[1] + 5 + 1)
        one_by_one.append(tiny_tokenizer.decode(output[0], skip_special_tokens=True).strip())
    # 24 tokens with 2 beams leave 12 source tokens per batch: several batches of different lengths.
    assert translate(model, tiny_tokenizer, sentences, max_tokens=24, num_beams=2, max_length_offset=5) == one_by_one
    assert translate(model, tiny_tokenizer, []) == []


def test_generating_past_the_positions_names_max_new_tokens(tiny_config):
    """The message told the user to truncate the input, which was short: the output ran past the positions."""
    model = TransformerForConditionalGeneration(tiny_config).eval()
    source = torch.randint(4, 64, (1, 5))
    positions = tiny_config.max_position_embeddings
    with pytest.raises(ValueError) as error:
        model.generate(source, attention_mask=torch.ones_like(source), max_new_tokens=100, min_new_tokens=100)
    message = str(error.value)
    assert "max_new_tokens" in message and "max_length" in message
    assert f"max_position_embeddings={positions}" in message and "truncate the input" not in message
