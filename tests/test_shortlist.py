"""The lexical shortlist (`hf_transformer.decoding.shortlist`): IBM Model 1 finds the translations of a made-up
dictionary, a sentence's list is what it should hold, scores are the model's renormalized over each sentence's list
(and equal the full model's when the list is the whole vocabulary), translations use listed tokens only, int8 projects
onto the listed rows as onto the whole, and the switch reaches `TranslationEngine`, `translate`, `serve` and the
`shortlist` command."""

import gzip
import re

import pytest
import torch
from conftest import copy_task_batch, copying_model, make_tiny_config, padded_sources, trained_model, word_tokenizer

from hf_transformer.decoding import Shortlist, beam_search, build_shortlist
from hf_transformer.decoding.engine import TranslationEngine
from hf_transformer.decoding.ensemble import Ensemble, ModelDecoder
from hf_transformer.decoding.incremental import IncrementalDecoder
from hf_transformer.decoding.int8 import quantize_int8
from hf_transformer.decoding.shortlist import SHORTLIST_FILE, co_occurrences, output_rows
from hf_transformer.errors import ConfigError
from hf_transformer.hub.push import push_folder
from lightning_modules.cli import main

EOS = 2
# Imported by pytest (not here) so that it can rewrite the module's asserts.
pytest_plugins = ["tests.hub_server"]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return copying_model()


def whole_vocabulary(vocab_size: int) -> Shortlist:
    return Shortlist(torch.full((vocab_size, 1), -1), torch.arange(vocab_size))


def narrow(vocab_size: int) -> Shortlist:
    """Each token translates to itself and the next one; </s> and tokens 3-10 are always listed."""
    tokens = torch.arange(vocab_size)
    return Shortlist(torch.stack([tokens, (tokens + 1) % vocab_size], dim=1), torch.tensor([EOS, *range(3, 11)]))


def test_ibm_model_1_finds_the_translation_of_each_word_among_frequent_function_words():
    """Source words 10-19 translate to 30-39, in shuffled order, among the target's frequent words 5 and 6."""
    generator = torch.Generator().manual_seed(0)
    pairs = []
    for _ in range(300):
        source = torch.randperm(10, generator=generator)[: int(torch.randint(2, 6, (1,), generator=generator))] + 10
        target = torch.cat([source + 20, torch.tensor([5, 6, 5])])
        pairs.append((source.tolist(), target[torch.randperm(len(target), generator=generator)].tolist()))
    shortlist = build_shortlist(pairs, 40, per_source=3, frequent=2, always=[EOS])
    assert shortlist.translations[10:20, 0].tolist() == list(range(30, 40))
    assert (shortlist.translations[:10] == -1).all()  # words never seen translate to nothing
    assert shortlist.always.tolist() == [EOS, 5, 6]


def test_learning_in_chunks_gives_the_table_of_learning_at_once(monkeypatch):
    """Corpora of millions of pairs are read in chunks, held between the rounds of EM up to a bound and read again at
    each round beyond it: the same table."""
    generator = torch.Generator().manual_seed(1)
    pairs = [(torch.randint(3, 30, (6,), generator=generator).tolist(),) * 2 for _ in range(50)]
    whole = build_shortlist(pairs, 30, per_source=4)
    monkeypatch.setattr("hf_transformer.decoding.shortlist.CHUNK_OCCURRENCES", 100)  # 17 chunks, all held
    assert torch.equal(build_shortlist(pairs, 30, per_source=4).translations, whole.translations)
    monkeypatch.setattr("hf_transformer.decoding.shortlist.HELD_OCCURRENCES", 500)  # the first 4 held, 13 read again
    assert torch.equal(build_shortlist(pairs, 30, per_source=4).translations, whole.translations)


def test_a_chunks_co_occurrences_are_every_source_token_with_every_target_token_of_each_pair():
    generator = torch.Generator().manual_seed(3)
    lengths = torch.randint(1, 7, (20, 2), generator=generator).tolist()
    chunk = [
        (line, *(torch.randint(0, 50, (length,), generator=generator).tolist() for length in pair))
        for line, pair in enumerate(lengths, start=1)
    ]
    keys, positions = co_occurrences(chunk, 50)
    expected, start = [], 0
    for _, source, target in chunk:
        expected += [(s * 50 + t, start + j) for j, t in enumerate(target) for s in source]
        start += len(target)
    assert list(zip(keys.tolist(), positions.tolist(), strict=True)) == expected


def test_bad_pairs_and_settings_are_refused():
    with pytest.raises(ConfigError, match="pair 2 holds a token id outside the vocabulary of 10 tokens"):
        build_shortlist([([1], [2]), ([3], [12])], 10)
    with pytest.raises(ConfigError, match="a target holds a token id outside the vocabulary of 10 tokens"):
        build_shortlist([([1], [2]), ([], [12])], 10)
    with pytest.raises(ConfigError, match="no pair with tokens on both sides"):
        build_shortlist([([1], [])], 10)
    with pytest.raises(ConfigError, match="per_source >= 1"):
        build_shortlist([([1], [2])], 10, per_source=0)


def test_a_sentences_list_holds_its_tokens_their_translations_and_the_tokens_always_listed(tmp_path):
    shortlist = narrow(64)
    shortlist.save_pretrained(tmp_path / "new")  # a folder not made yet, as save_pretrained of a model makes it
    loaded = Shortlist.from_pretrained(tmp_path / "new")
    assert torch.equal(loaded.translations, shortlist.translations) and torch.equal(loaded.always, shortlist.always)
    input_ids, attention_mask = padded_sources(5, seed=2)
    tokens, listed = loaded.batch_lists(input_ids, attention_mask)
    assert torch.equal(tokens, tokens.unique())
    for row, (ids, mask) in enumerate(zip(input_ids, attention_mask.bool(), strict=True)):
        expected = {EOS, *range(3, 11)} | {int(i) for i in ids[mask]} | {(int(i) + 1) % 64 for i in ids[mask]}
        assert set(tokens[listed[row]].tolist()) == expected


@torch.inference_mode()
def test_each_step_gives_the_models_log_probabilities_renormalized_over_each_sentences_list(model):
    input_ids, attention_mask = padded_sources(6, seed=3)
    beams, shortlist = 2, narrow(model.config.vocab_size)
    ours = IncrementalDecoder(model, input_ids, attention_mask, beams, shortlist)
    reference = ModelDecoder(model, input_ids, attention_mask, beams)
    tokens, listed = shortlist.batch_lists(input_ids, attention_mask)
    allowed = torch.zeros(len(listed), model.config.vocab_size, dtype=torch.bool)
    allowed[:, tokens] = listed
    allowed = allowed.repeat_interleave(beams, dim=0)
    step_tokens = torch.full((len(allowed), 1), model.config.decoder_start_token_id)
    for _ in range(3):
        full, got = reference.step(step_tokens), ours.step(step_tokens)
        expected = torch.log_softmax(full.masked_fill(~allowed, -torch.inf), dim=-1)
        # Both in fp32 (the decoders' log-probabilities), renormalized along two roundings.
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        step_tokens = got.argmax(dim=-1, keepdim=True)
        ours.reorder(torch.arange(len(allowed)))
        reference.reorder(torch.arange(len(allowed)))


@torch.inference_mode()
def test_the_candidates_are_the_best_listed_tokens_over_several_chunks_of_sentences(model):
    input_ids, attention_mask = padded_sources(40, seed=4)  # 40 sentences x 4 beams: more rows than one chunk
    beams, shortlist = 4, narrow(model.config.vocab_size)
    start = torch.full((len(input_ids) * beams, 1), model.config.decoder_start_token_id)
    expected = IncrementalDecoder(model, input_ids, attention_mask, beams, shortlist).step(start).topk(8, dim=-1)
    scores, token_ids = IncrementalDecoder(model, input_ids, attention_mask, beams, shortlist).candidates(start, 8)
    torch.testing.assert_close(scores, expected.values)
    assert torch.equal(token_ids, expected.indices)


def test_a_list_of_the_whole_vocabulary_translates_as_the_full_model(model):
    input_ids, attention_mask = padded_sources(9, seed=5)
    settings = dict(num_beams=4, num_return_sequences=4, max_length_offset=5)
    ours = beam_search(model, input_ids, attention_mask, shortlist=whole_vocabulary(64), **settings)
    full = beam_search(model, input_ids, attention_mask, **settings)
    assert [[h.token_ids for h in n_best] for n_best in ours] == [[h.token_ids for h in n_best] for n_best in full]
    torch.testing.assert_close(
        torch.tensor([[h.score for h in n_best] for n_best in ours]),
        torch.tensor([[h.score for h in n_best] for n_best in full]),
    )


def test_translations_hold_only_their_sentences_listed_tokens(model):
    input_ids, attention_mask = padded_sources(12, seed=6)
    shortlist = narrow(64)
    tokens, listed = shortlist.batch_lists(input_ids, attention_mask)
    results = beam_search(model, input_ids, attention_mask, num_beams=3, num_return_sequences=3, shortlist=shortlist)
    for row, n_best in enumerate(results):
        allowed = set(tokens[listed[row]].tolist()) | {model.config.decoder_start_token_id}
        assert all(set(hypothesis.token_ids) <= allowed for hypothesis in n_best)


def test_an_int8_model_projects_onto_its_listed_rows_as_onto_the_whole_vocabulary():
    torch.manual_seed(2)
    float_model = trained_model(make_tiny_config())
    model = quantize_int8(float_model)
    tokens = torch.tensor([2, 5, 17, 40, 63])
    hidden_states = torch.randn(7, model.config.d_model)
    with torch.inference_mode():
        # The same int8 rows and scales, the same quantized input: equal up to the kernel's float rounding.
        (sliced,) = output_rows(model.lm_head, [tokens])
        assert sliced.out_features == len(tokens) and sliced.weight().shape == (len(tokens), model.config.d_model)
        torch.testing.assert_close(sliced(hidden_states), model.lm_head(hidden_states)[:, tokens], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(
            output_rows(float_model.lm_head, [tokens])[0](hidden_states), float_model.lm_head(hidden_states)[:, tokens]
        )


def test_a_shortlist_that_cannot_serve_the_search_is_refused_naming_the_fix(model):
    input_ids, attention_mask = padded_sources(2, seed=7)
    few = Shortlist(torch.full((64, 1), -1), torch.tensor([EOS]))
    with pytest.raises(ConfigError, match="only .* target tokens, and beam search with 4 beams takes 8"):
        beam_search(model, input_ids, attention_mask, num_beams=4, shortlist=few)
    with pytest.raises(ConfigError, match="covers 100 tokens and the model's vocabulary 64"):
        beam_search(model, input_ids, attention_mask, shortlist=whole_vocabulary(100))
    with pytest.raises(ConfigError, match="not an ensemble"):
        beam_search(Ensemble([model, model]), input_ids, attention_mask, shortlist=narrow(64))
    with pytest.raises(ConfigError, match="incremental=True"):
        beam_search(model, input_ids, attention_mask, incremental=False, shortlist=narrow(64))
    with pytest.raises(ConfigError, match="hf-transformer shortlist"):
        Shortlist.from_pretrained(".")


def test_the_shortlist_command_writes_the_folders_list_which_translate_and_serve_use(tmp_path, capsys, monkeypatch):
    torch.manual_seed(3)
    config = make_tiny_config()
    model, tokenizer = trained_model(config), word_tokenizer(config.vocab_size)
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    source, mask, _ = copy_task_batch(200, config.vocab_size, torch.Generator().manual_seed(4))
    lines = [tokenizer.decode(row[keep.bool()][:-1]) for row, keep in zip(source, mask, strict=True)]
    (tmp_path / "train.en").write_text("\n".join(lines) + "\n")
    with gzip.open(tmp_path / "train.de.gz", "wt") as file:  # the copy task: the target is the source
        file.write("\n".join(lines) + "\n")

    main(["shortlist", str(folder), "--source", str(tmp_path / "train.en"), "--target", str(tmp_path / "train.de.gz")])
    assert f"Saved to {folder / SHORTLIST_FILE}" in capsys.readouterr().out
    shortlist = Shortlist.from_pretrained(folder)
    seen = {int(token) for token in source[mask.bool()] if token != EOS}
    assert all(int(shortlist.translations[token, 0]) == token for token in seen)  # each word copies itself

    assert TranslationEngine.from_pretrained(folder).shortlist is not None  # used where the folder has one
    assert TranslationEngine.from_pretrained(folder, shortlist=False).shortlist is None
    engine = TranslationEngine.from_pretrained(folder)
    translations = engine.translate(lines[:20], num_beams=2)
    assert all(len(n_best) == 1 for n_best in translations)
    served = []
    monkeypatch.setattr("hf_transformer.serving.serve", lambda engine, **settings: served.append(engine))
    main(["serve", str(folder), "--no-shortlist"])
    assert served[0].shortlist is None
    capsys.readouterr()
    (tmp_path / "input.txt").write_text("\n".join(lines[:5]) + "\n")
    main(["translate", str(folder), str(tmp_path / "input.txt"), "--shortlist"])
    assert len(capsys.readouterr().out.splitlines()) == 5

    (tmp_path / "short.de").write_text("\n".join(lines[:10]) + "\n")
    (tmp_path / "latin1.de").write_bytes("\n".join(lines[:2] + ["Gr\xfc\xdfe"]).encode("latin-1"))
    for folder_given, target, message in [
        (folder, "short.de", "train.en has 200 lines and .*short.de 10: a shortlist is learnt from parallel text"),
        (folder, "latin1.de", "latin1.de, line 3: bytes .* are not UTF-8; re-encode the file as UTF-8"),
        (tmp_path, "short.de", "no exported model folder"),
        (folder, "missing.de", "missing.de: no such file"),
    ]:
        with pytest.raises(SystemExit):
            main(
                [
                    "shortlist",
                    str(folder_given),
                    "--source",
                    str(tmp_path / "train.en"),
                    "--target",
                    str(tmp_path / target),
                ]
            )
        assert re.search(message, capsys.readouterr().err)


def test_a_hub_repositorys_shortlist_is_downloaded_with_the_model(hub_endpoint, tmp_path):
    """What `hf-transformer push` uploads of a folder with a shortlist, loading by repository id brings back: used
    where the repository has one, also from the cache once the Hub is out of reach; one without it decodes without."""
    torch.manual_seed(5)
    config = make_tiny_config()
    model, tokenizer = trained_model(config), word_tokenizer(config.vocab_size)
    for name, shortlist in [("listed", narrow(config.vocab_size)), ("plain", None)]:
        model.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
        if shortlist is not None:
            shortlist.save_pretrained(tmp_path / name)
        push_folder(tmp_path / name, f"alice/{name}")

    engine = TranslationEngine.from_pretrained("alice/listed")
    assert torch.equal(engine.shortlist.translations, narrow(config.vocab_size).translations)
    assert TranslationEngine.from_pretrained("alice/listed", shortlist=False).shortlist is None
    assert TranslationEngine.from_pretrained("alice/plain").shortlist is None
    with pytest.raises(ConfigError, match="alice/plain has no shortlist.safetensors"):
        TranslationEngine.from_pretrained("alice/plain", shortlist=True)

    hub_endpoint.stop()  # the Hub out of reach: from the cache
    assert Shortlist.from_pretrained("alice/listed") is not None
    assert Shortlist.from_pretrained("alice/plain", missing_ok=True) is None
