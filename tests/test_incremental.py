"""The incremental decoding step of beam search (`IncrementalDecoder`) against the model's own forward() at every step
(`ModelDecoder`): the same log-probabilities through reordered beams and sentences that leave the batch, the same best
candidates, and the same translations, post-LN and pre-LN, padded or not, alone and in an ensemble."""

import pytest
import torch
from conftest import TINY_MODEL, copying_model, make_tiny_config, padded_sources

from hf_transformer import TransformerConfig, TransformerForConditionalGeneration, translate
from hf_transformer.decoding import beam_search
from hf_transformer.decoding.ensemble import Ensemble, ModelDecoder, decoder
from hf_transformer.decoding.incremental import CANDIDATE_ROWS, IncrementalDecoder, top_n


@pytest.fixture(scope="module", params=[False, True], ids=["post-LN", "pre-LN"])
def model(request):
    torch.manual_seed(0)
    return copying_model(normalize_before=request.param)


@torch.inference_mode()
def test_each_step_gives_the_log_probabilities_of_forward_through_reorders_and_dropped_sentences(model):
    input_ids, attention_mask = padded_sources(6, seed=1)
    beams = 3
    ours = IncrementalDecoder(model, input_ids, attention_mask, beams)
    reference = ModelDecoder(model, input_ids, attention_mask, beams)
    generator = torch.Generator().manual_seed(2)
    rows = input_ids.shape[0] * beams
    tokens = torch.full((rows, 1), model.config.decoder_start_token_id)
    for step in range(6):
        expected, got = reference.step(tokens), ours.step(tokens)
        torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)
        if step == 2:  # the first sentence and the fourth leave the batch
            sentences = torch.tensor([index for index in range(rows // beams) if index not in (0, 3)])
            kept = (sentences[:, None] * beams + torch.arange(beams)).flatten()
            for decoding in (ours, reference):
                decoding.keep(kept)
            # The rows of the reordering index the batch before the sentences left.
            beam_rows = kept // beams * beams + torch.randint(0, beams, (len(kept),), generator=generator)
            rows = len(kept)
        else:  # each beam continues one of its sentence's beams, chosen at random
            sentence_of_row = torch.arange(rows) // beams
            beam_rows = sentence_of_row * beams + torch.randint(0, beams, (rows,), generator=generator)
        for decoding in (ours, reference):
            decoding.reorder(beam_rows)
        tokens = torch.randint(4, 64, (rows, 1), generator=generator)


@torch.inference_mode()
def test_the_candidates_are_the_best_of_each_rows_log_probabilities_over_several_chunks_of_rows(model):
    input_ids, attention_mask = padded_sources(CANDIDATE_ROWS + 5, seed=3)  # more rows than one chunk of the projection
    start = torch.full((input_ids.shape[0], 1), model.config.decoder_start_token_id)
    log_probs = IncrementalDecoder(model, input_ids, attention_mask, 1).step(start)
    scores, token_ids = IncrementalDecoder(model, input_ids, attention_mask, 1).candidates(start, 5)
    expected = log_probs.topk(5, dim=-1)
    torch.testing.assert_close(scores, expected.values)
    assert torch.equal(token_ids, expected.indices)


@pytest.mark.parametrize("columns", [300, 384, 1000, 32000])
def test_the_top_n_through_the_blocks_maxima_are_the_rows_top_n(columns):
    """Whole blocks and a partial last one, the best scores packed into one block or spread over many, and ties."""
    generator = torch.Generator().manual_seed(columns)
    scores = torch.randn(40, columns, generator=generator)
    scores[0, 5:13] += 10.0  # the 8 best in one block
    scores[1, -3:] += 10.0  # in the last, partial block
    scores[2] = scores[2].round()  # many ties
    scores[3, : columns // 2] = float("-inf")
    columns_found = top_n(scores, 8, block=128)
    expected = scores.topk(8, dim=-1)
    assert torch.equal(scores.gather(1, columns_found), expected.values)
    untied = [row for row in range(40) if row != 2]
    assert torch.equal(columns_found[untied], expected.indices[untied])
    assert torch.equal(top_n(scores[:, :64], 8), scores[:, :64].topk(8).indices)  # fewer blocks than n: plain top-k


@pytest.mark.parametrize("num_beams", [1, 4])
def test_translations_and_scores_equal_those_of_forward_at_every_step(model, num_beams):
    input_ids, attention_mask = padded_sources(9, seed=4)
    settings = dict(num_beams=num_beams, num_return_sequences=num_beams, max_length_offset=5)
    ours = beam_search(model, input_ids, attention_mask, **settings)
    reference = beam_search(model, input_ids, attention_mask, incremental=False, **settings)
    assert [[h.token_ids for h in n_best] for n_best in ours] == [[h.token_ids for h in n_best] for n_best in reference]
    ours_scores = torch.tensor([[h.score for h in n_best] for n_best in ours])
    torch.testing.assert_close(ours_scores, torch.tensor([[h.score for h in n_best] for n_best in reference]))
    assert len({len(n_best[0].token_ids) for n_best in ours}) > 2  # sentences end at several steps


def test_an_ensemble_of_this_packages_models_decodes_incrementally_with_the_same_translations(model, tiny_tokenizer):
    torch.manual_seed(1)
    other = copying_model(normalize_before=model.config.normalize_before, decoder_layers=1)
    input_ids, attention_mask = padded_sources(4, seed=5)
    members = decoder(Ensemble([model, other]), input_ids, attention_mask, 2).members
    assert all(isinstance(member, IncrementalDecoder) for member in members)
    sentences = ["a dog runs on the grass", "two men play music", "ein hund"]
    assert translate([model, other], tiny_tokenizer, sentences, max_length_offset=4) == translate(
        [model, other], tiny_tokenizer, sentences, max_length_offset=4, incremental=False
    )


def test_a_model_of_another_class_decodes_through_its_forward(model):
    """Any other Hugging Face model (or this package's remote code loaded from a folder, a class of its own) goes
    through its forward(): its layers may differ from this package's."""
    from transformers import MarianConfig, MarianMTModel

    marian = MarianMTModel(MarianConfig(vocab_size=64, decoder_start_token_id=0, pad_token_id=0, **TINY_MODEL)).eval()
    input_ids, attention_mask = padded_sources(2, seed=6)
    assert isinstance(decoder(model, input_ids, attention_mask, 2), IncrementalDecoder)
    assert type(decoder(model, input_ids, attention_mask, 2, incremental=False)) is ModelDecoder
    assert type(decoder(marian, input_ids, attention_mask, 2)) is ModelDecoder


def test_a_vocabulary_smaller_than_twice_the_beams_is_searched_whole():
    """Each beam offers at most the vocabulary's tokens: 6 tokens and 4 beams (8 wanted per beam) decode through both
    steps alike."""
    torch.manual_seed(0)
    config = TransformerConfig(**{**make_tiny_config().to_dict(), "vocab_size": 6})
    small = TransformerForConditionalGeneration(config).double().eval()
    input_ids, attention_mask = torch.tensor([[4, 5, 2], [5, 2, 0]]), torch.tensor([[1, 1, 1], [1, 1, 0]])
    settings = dict(num_beams=4, num_return_sequences=4, max_length_offset=3)
    ours = beam_search(small, input_ids, attention_mask, **settings)
    reference = beam_search(small, input_ids, attention_mask, incremental=False, **settings)
    assert [[h.token_ids for h in n_best] for n_best in ours] == [[h.token_ids for h in n_best] for n_best in reference]
    assert all(len(n_best) == 4 for n_best in ours)
