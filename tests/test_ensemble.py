"""Ensembles: beam search over several models (`hf_transformer.decoding.ensemble`), which must be the search of one
model when the ensemble has one member, combine the members' distributions by the stated rule, and keep every
property of `translate()` (batch and padding independence, n-best lists, the length penalty)."""

import copy
import json

import pytest
import torch
from conftest import TINY_CONFIG, word_tokenizer

from hf_transformer import TransformerConfig, TransformerForConditionalGeneration, translate
from hf_transformer.decoding import Ensemble, beam_search
from hf_transformer.decoding.engine import TranslationEngine
from hf_transformer.decoding.ensemble import EnsembleDecoder, check_same_tokenizer
from hf_transformer.errors import ConfigError, TranslationInputError

# Two members of different sizes and depths. Their </s> is made likelier, so that some outputs end with it early and
# others run to the length limit; being untrained, the two disagree, and the ensemble differs from each.
SMALL = TINY_CONFIG
LARGER = {**TINY_CONFIG, "d_model": 48, "encoder_layers": 1, "decoder_layers": 3, "encoder_ffn_dim": 96}
SETTINGS = dict(num_beams=3, max_length_offset=4)


def member(config: dict, seed: int) -> TransformerForConditionalGeneration:
    torch.manual_seed(seed)
    model = TransformerForConditionalGeneration(TransformerConfig(**config)).eval()
    with torch.no_grad():
        model.lm_head.weight[model.config.eos_token_id] *= 3
    return model


@pytest.fixture(scope="module")
def members() -> tuple[TransformerForConditionalGeneration, TransformerForConditionalGeneration]:
    return member(SMALL, seed=0), member(LARGER, seed=1)


@pytest.fixture(scope="module")
def tokenizer():
    return word_tokenizer(SMALL["vocab_size"])


def sentences(count: int, seed: int = 0) -> list[str]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 9, (count,), generator=generator).tolist()
    return [" ".join(f"w{int(i)}" for i in torch.randint(4, 64, (n,), generator=generator)) for n in lengths]


def doubled(*models: TransformerForConditionalGeneration) -> list[TransformerForConditionalGeneration]:
    """float64 copies: padding and batching change nothing but the last bits, which the fp32 log-probabilities drop."""
    return [copy.deepcopy(model).double() for model in models]


@pytest.mark.parametrize(("average", "length_penalty"), [("probabilities", 0.6), ("log-probabilities", -0.5)])
def test_an_ensemble_of_one_is_that_model_exactly(members, tokenizer, average, length_penalty):
    """The same search in the same process: the n-best lists, their token ids and their scores are equal to the bit."""
    model = members[0]
    texts = sentences(10)
    settings = dict(SETTINGS, length_penalty=length_penalty, num_return_sequences=3, max_tokens=60)
    alone = translate(model, tokenizer, texts, **settings)
    assert translate(Ensemble([model], average=average), tokenizer, texts, **settings) == alone
    assert translate([model], tokenizer, texts, **settings) == alone
    ended_by_eos = [best[0].token_ids[-1] == model.config.eos_token_id for best in alone]
    assert any(ended_by_eos) and not all(ended_by_eos)  # finished beams and the length limit both exercised


@pytest.mark.parametrize("average", ["probabilities", "log-probabilities"])
def test_a_model_with_itself_gives_its_translations(members, tokenizer, average):
    """The mean of p and p is p: the same translations, scores equal up to rounding (exactly so for the mean of the
    log-probabilities, (x + x) / 2 = x)."""
    model = members[0]
    texts = sentences(8, seed=1)
    alone = translate(model, tokenizer, texts, num_return_sequences=2, **SETTINGS)
    twice = translate(Ensemble([model, model], average=average), tokenizer, texts, num_return_sequences=2, **SETTINGS)
    assert [[h.token_ids for h in best] for best in twice] == [[h.token_ids for h in best] for best in alone]
    scores = [[h.score for h in best] for best in twice], [[h.score for h in best] for best in alone]
    if average == "log-probabilities":
        assert scores[0] == scores[1]
    else:
        assert torch.allclose(torch.tensor(scores[0]), torch.tensor(scores[1]), rtol=0, atol=1e-5)


@pytest.mark.parametrize("average", ["probabilities", "log-probabilities"])
def test_one_step_combines_the_members_distributions_by_the_stated_rule(members, tokenizer, average):
    """The first step's log-probabilities against each member's computed by a plain forward pass: log of the mean
    probability (a distribution), or the mean log-probability (a geometric mean: sums to at most 1)."""
    inputs = tokenizer(sentences(5, seed=2), return_tensors="pt", padding=True)
    ensemble = Ensemble(members, average=average)
    start = torch.full((5, 1), members[0].config.decoder_start_token_id)
    with torch.inference_mode():
        combined = EnsembleDecoder(ensemble, inputs["input_ids"], inputs["attention_mask"], num_beams=1).step(start)
        by_hand = [model(**inputs, decoder_input_ids=start).logits[:, -1].double().log_softmax(-1) for model in members]
    if average == "probabilities":
        expected = ((by_hand[0].exp() + by_hand[1].exp()) / 2).log()
        torch.testing.assert_close(combined.double().exp().sum(-1), torch.ones(5, dtype=torch.float64))
    else:
        expected = (by_hand[0] + by_hand[1]) / 2
        assert (combined.double().exp().sum(-1) <= 1 + 1e-6).all()
    torch.testing.assert_close(combined.double(), expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(by_hand[0], by_hand[1], atol=1e-2)  # two different members: the rule is exercised
    assert not torch.allclose(
        Ensemble(members, average="probabilities").combine(by_hand),
        Ensemble(members, average="log-probabilities").combine(by_hand),
    )


def test_an_ensemble_is_independent_of_batching_and_padding(members, tokenizer):
    """Each sentence alone, and with others in batches of several lengths (padded): the same translations; scores equal
    up to the rounding that padding changes."""
    ensemble = Ensemble(doubled(*members))
    texts = sentences(10, seed=3)
    batched = translate(ensemble, tokenizer, texts, num_return_sequences=2, max_tokens=48, **SETTINGS)
    for text, hypotheses in zip(texts, batched, strict=True):
        (alone,) = translate(ensemble, tokenizer, [text], num_return_sequences=2, **SETTINGS)
        assert [h.token_ids for h in hypotheses] == [h.token_ids for h in alone]
        assert [h.score for h in hypotheses] == pytest.approx([h.score for h in alone], abs=1e-5)
    # Not one member's output: the ensemble decides differently from each on some sentence.
    for member in ensemble.models:
        assert translate(member, tokenizer, texts, **SETTINGS) != [best[0].text for best in batched]


@pytest.mark.parametrize(("average", "length_penalty"), [("probabilities", 0.6), ("log-probabilities", 2.0)])
def test_n_best_scores_are_the_combined_log_probabilities_over_the_length_penalty(
    members, tokenizer, average, length_penalty
):
    """Each hypothesis of an n-best list scores its tokens' combined log-probabilities, summed, over its length (the
    tokens after the start token) ** length_penalty, as one model's do; the list is best first and its head is the
    translation."""
    ensemble = Ensemble(members, average=average)
    texts = sentences(4, seed=4)
    settings = dict(SETTINGS, length_penalty=length_penalty)
    results = translate(ensemble, tokenizer, texts, num_return_sequences=3, **settings)
    assert [best[0].text for best in results] == translate(ensemble, tokenizer, texts, **settings)
    for text, hypotheses in zip(texts, results, strict=True):
        scores = [h.score for h in hypotheses]
        assert len(hypotheses) == 3 and scores == sorted(scores, reverse=True)
        inputs = tokenizer([text], return_tensors="pt")
        for hypothesis in hypotheses:
            output = torch.tensor([hypothesis.token_ids])
            with torch.inference_mode():
                log_probs = [
                    model(**inputs, decoder_input_ids=output[:, :-1]).logits.float().log_softmax(-1)
                    for model in members
                ]
            combined = ensemble.combine(log_probs)[0].gather(-1, output[0, 1:, None]).sum()
            length = len(hypothesis.token_ids) - 1
            assert hypothesis.score == pytest.approx(float(combined) / length**length_penalty, abs=1e-4)


def test_beam_search_takes_a_list_of_models_and_greedy_search(members, tokenizer):
    inputs = tokenizer(sentences(4, seed=5), return_tensors="pt", padding=True)
    settings = dict(num_beams=1, max_length_offset=4)
    as_list = beam_search(list(members), inputs["input_ids"], inputs["attention_mask"], **settings)
    as_ensemble = beam_search(Ensemble(members), inputs["input_ids"], inputs["attention_mask"], **settings)
    assert as_list == as_ensemble and all(len(best) == 1 for best in as_list)


def test_members_with_fewer_positions_bound_the_sources_and_outputs(members, tokenizer):
    short = TransformerForConditionalGeneration(TransformerConfig(**{**SMALL, "max_position_embeddings": 8})).eval()
    ensemble = Ensemble([members[0], short])
    assert ensemble.config.max_position_embeddings == 8 and members[0].config.max_position_embeddings == 64
    with pytest.warns(UserWarning, match="8 positions"):
        (best,) = translate(ensemble, tokenizer, ["w5 " * 20], num_return_sequences=1, max_length_offset=50)
    assert len(best[0].token_ids) <= 8


def test_models_of_other_vocabularies_are_refused_naming_them_and_what_differs(members):
    other = TransformerForConditionalGeneration(TransformerConfig(**{**SMALL, "vocab_size": 80})).eval()
    with pytest.raises(ConfigError, match=r"^model 0 and model 1 do not share one vocabulary \(vocab_size 64 and 80\)"):
        Ensemble([members[0], other])
    moved = TransformerForConditionalGeneration(TransformerConfig(**{**SMALL, "eos_token_id": 3})).eval()
    with pytest.raises(ConfigError, match=r"^a and b do not share .*eos_token_id 2 and 3"):
        Ensemble([members[0], moved], names=["a", "b"])
    with pytest.raises(ConfigError, match="at least one model"):
        Ensemble([])
    with pytest.raises(ConfigError, match="average='geometric'"):
        Ensemble(members, average="geometric")


def test_other_tokenizers_are_refused_naming_the_models_and_what_differs(tokenizer):
    check_same_tokenizer("a", tokenizer, "b", word_tokenizer(64))  # the same tokenizer built twice
    with pytest.raises(ConfigError, match=r"^a and b do not share one tokenizer \(vocabulary size 64 and 70\)"):
        check_same_tokenizer("a", tokenizer, "b", word_tokenizer(70))
    renamed = word_tokenizer(64)
    renamed.backend_tokenizer.pre_tokenizer = None
    with pytest.raises(ConfigError, match=r"\(the pre_tokenizer of their tokenizer.json\)"):
        check_same_tokenizer("a", tokenizer, "b", renamed)


def test_the_engine_of_an_ensemble_translates_and_refuses_attention_and_ctranslate2(members, tokenizer):
    engines = [TranslationEngine(tokenizer, model=model, name=f"run{index}") for index, model in enumerate(members)]
    engine = TranslationEngine.ensemble(engines, average="log-probabilities")
    assert engine.name == "run0 + run1" and engine.model.average == "log-probabilities"
    texts = sentences(3, seed=6)
    expected = translate(Ensemble(members, average="log-probabilities"), tokenizer, texts, num_return_sequences=2)
    assert engine.translate(texts, num_return_sequences=2) == expected
    with pytest.raises(TranslationInputError, match="attention weights come from one model's attention, not from an "):
        engine.attention(texts)

    class CTranslate2:  # what the engine reads of a CTranslate2Translator
        generation_config = members[0].generation_config

    converted = TranslationEngine(tokenizer, ctranslate2=CTranslate2(), name="exports/ct2")
    with pytest.raises(TranslationInputError, match="^exports/ct2 is a CTranslate2 model: an ensemble averages"):
        TranslationEngine.ensemble([engines[0], converted])


def test_the_log_of_the_mean_probability_is_fairseqs_formula(members):
    """logsumexp - log n, as fairseq computes it, is log((p_1 + ... + p_n) / n)."""
    log_probs = [torch.randn(2, 7).log_softmax(-1) for _ in range(3)]
    expected = (sum(each.exp() for each in log_probs) / 3).log()
    torch.testing.assert_close(Ensemble(members + members[:1]).combine(log_probs), expected)
    assert torch.equal(Ensemble(members[:1]).combine(log_probs[:1]), log_probs[0])  # one member: its own, exactly


# --- the test command ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_test_command_scores_the_ensemble_of_its_checkpoint_and_other_runs(run_dir, capsys):
    """`test --ensemble_with` translates the test split with the ensemble of the --ckpt_path model and the other runs'
    models, sharing their tokenizer (a second seed of the run), and logs no loss; fit refuses the option, and a model
    of another tokenizer is refused naming both."""
    from conftest import DEMO, equal_fraction

    from lightning_modules.checkpoint import load_checkpoint, model_from_checkpoint, tokenizer_from_checkpoint
    from lightning_modules.cli import main
    from lightning_modules.cli.training import TranslationCLI

    tiny = ("--config", str(DEMO), "--config", "tiny.yaml")
    main(["fit", *tiny, "--trainer.max_steps=4"])
    seed1 = ("--seed_everything=1", "--trainer.default_root_dir=runs/seed1", "--data.tokenizer_dir=runs/demo/tokenizer")
    main(["fit", *tiny, *seed1, "--trainer.max_steps=4"])
    first, second = "runs/demo/checkpoints/last.ckpt", "runs/seed1/checkpoints/last.ckpt"
    capsys.readouterr()
    main(["test", *tiny, f"--ckpt_path={first}", "--ensemble_with", second, "--ensemble_average", "log-probabilities"])
    assert f"Translated by the ensemble of the model and {second} (mean of the log-probabilities)" in (
        capsys.readouterr().out
    )
    folder = max(run_dir.glob("runs/demo/logs/version_*"), key=lambda path: int(path.name[8:]))
    hypotheses = (folder / "test_hypotheses.txt").read_text().splitlines()
    scores = json.loads((folder / "test_scores.json").read_text())
    assert "test/bleu" in scores and "test/loss" not in scores  # the loss would be one model's

    data = TranslationCLI(args=[*tiny], run=False).datamodule
    sources = list(data.raw_pairs(data.hparams.test_split)["source_text"])
    checkpoints = [load_checkpoint(run_dir / path) for path in (first, second)]
    models = [model_from_checkpoint(checkpoint) for checkpoint in checkpoints]
    ensemble = Ensemble(models, average="log-probabilities")
    # Other batches than the test loader's: the same translations but where rounding breaks a near tie.
    tokenizer = tokenizer_from_checkpoint(checkpoints[0])
    assert equal_fraction(hypotheses, translate(ensemble, tokenizer, sources)) > 0.9
    assert equal_fraction(hypotheses, translate(models[0], tokenizer, sources)) < 0.9  # not the first model's

    other = run_dir / "other"
    TransformerForConditionalGeneration(TransformerConfig(**SMALL)).save_pretrained(other)
    word_tokenizer(SMALL["vocab_size"]).save_pretrained(other)
    for command, extra, message in (
        ("test", ["--ensemble_with", str(other)], f"{first} and {other} do not share one tokenizer (vocabulary size"),
        ("fit", ["--ensemble_with", second], "--ensemble_with is for validate and test, which translate with an"),
    ):
        with pytest.raises(SystemExit):
            main([command, *tiny, f"--ckpt_path={first}", *extra])
        err = capsys.readouterr().err.strip().splitlines()
        assert message in err[-1] and "Traceback" not in "\n".join(err)
