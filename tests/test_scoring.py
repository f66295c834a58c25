"""`translation_scores`: every score a paper might report, each what its label says."""

import logging
import random

import pytest
from sacrebleu.metrics import BLEU

from hf_transformer.errors import UserError
from hf_transformer.scoring import (
    format_scores,
    paired_bootstrap,
    sacrebleu_interval,
    sacrebleu_scores,
    sacrebleu_signatures,
    translation_scores,
)

REFERENCES = ["Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt.", "Ein Boston-Terrier läuft über Gras."]


def by_name(hypotheses: list[str], references: list[str] = REFERENCES, lang: str = "de") -> dict[str, float]:
    return {score.name: score.value for score in translation_scores(hypotheses, references, lang)}


def test_the_references_score_100_on_every_measure():
    scores = by_name(REFERENCES)
    assert set(scores) == {
        "sacreBLEU",
        "sacreBLEU, lowercased",
        "chrF",
        "tokenized BLEU, lowercased",
        "tokenized BLEU, compounds split",
    }
    assert all(value == pytest.approx(100) for value in scores.values())


def test_case_counts_only_where_the_label_says_so():
    lowered = by_name([reference.lower() for reference in REFERENCES])
    assert lowered["sacreBLEU, lowercased"] == pytest.approx(100)
    assert lowered["tokenized BLEU, lowercased"] == pytest.approx(100)
    assert lowered["sacreBLEU"] < 100 and lowered["tokenized BLEU, compounds split"] < 100


def test_tokenized_bleus_score_moses_tokens_and_split_compounds_as_labelled():
    hypotheses = ["Ein Mann mit einem orangen Hut, der etwas anstarrt.", "Ein Boston-Hund läuft über Gras."]
    scores = by_name(hypotheses)
    moses = ["Ein Mann mit einem orangen Hut , der etwas anstarrt .", "Ein Boston-Hund läuft über Gras ."]
    references = [
        "Ein Mann mit einem orangefarbenen Hut , der etwas anstarrt .",
        "Ein Boston-Terrier läuft über Gras .",
    ]
    lowercased = BLEU(tokenize="none", lowercase=True).corpus_score(moses, [references]).score
    assert scores["tokenized BLEU, lowercased"] == pytest.approx(lowercased)
    split = [line.replace("Boston-", "Boston ##AT##-##AT## ") for line in moses]
    split_references = [line.replace("Boston-", "Boston ##AT##-##AT## ") for line in references]
    compounds = BLEU(tokenize="none").corpus_score(split, [split_references]).score
    assert scores["tokenized BLEU, compounds split"] == pytest.approx(compounds)


def test_other_target_languages_have_no_compound_splitting_and_mismatches_are_refused():
    assert "tokenized BLEU, compounds split" not in by_name(["a dog runs"], ["a dog runs"], "en")
    with pytest.raises(ValueError, match="1 hypotheses for 2 references"):
        translation_scores(["one"], REFERENCES, "de")


def test_the_printed_table_labels_each_score_with_how_it_was_computed():
    table = format_scores(translation_scores(REFERENCES, REFERENCES, "de"))
    assert "nrefs:1|case:mixed|eff:no|tok:13a" in table and "case:lc" in table
    assert "multi-bleu.perl -lc" in table and "get_ende_bleu.sh" in table


def test_a_whole_test_set_scores_without_sacrebleus_tokenized_input_warning(caplog: pytest.LogCaptureFixture) -> None:
    # From 100 lines ending in " ." sacreBLEU warns that the input looks tokenized: the tokenized BLEUs are so on
    # purpose, and a test set of 1,000 sentences would print that warning with every score.
    references = REFERENCES * 60  # 120 lines, each ending in " ." once Moses-tokenized
    with caplog.at_level(logging.WARNING, logger="sacrebleu"):
        scores = by_name(references, references)
    assert scores["tokenized BLEU, lowercased"] == pytest.approx(100)
    assert not [record for record in caplog.records if "detokenize" in record.getMessage()]


@pytest.mark.parametrize("lang", ["de", "en"])
def test_nothing_to_score_is_refused_saying_so(lang: str) -> None:
    # sacreBLEU fails on an empty corpus with an IndexError (`: | hf-transformer translate M --reference empty.txt`).
    with pytest.raises(UserError, match="there is nothing to score"):
        translation_scores([], [], lang)


def test_the_signatures_given_without_scoring_are_those_the_scores_carry() -> None:
    # A model card labels the test scores with `sacrebleu_signatures()` before (or without) any scoring.
    scores = translation_scores(["Ein Hund läuft."], ["Ein Hund rennt."], "de")
    signatures = sacrebleu_signatures()
    assert signatures == {score.name: score.how for score in scores if score.name in signatures}
    assert set(signatures) == {"sacreBLEU", "sacreBLEU, lowercased", "chrF"}
    assert "smooth:exp" in signatures["sacreBLEU"]  # sacreBLEU's default, not torchmetrics' unsmoothed BLEU


def test_the_confidence_interval_is_zero_without_doubt_and_narrows_with_more_sentences():
    """sacreBLEU's bootstrap over the sentences: translations all right leave no doubt; half right, half wrong do, and
    four times as many such sentences narrow the interval (by about half: it falls with the square root of the size)."""
    assert sacrebleu_interval(REFERENCES * 10, REFERENCES * 10) == 0.0
    wrong = ["Zwei Kinder spielen im Schnee.", "Eine Frau kocht Suppe in der Küche."]
    few = sacrebleu_interval((REFERENCES + wrong) * 5, (REFERENCES + REFERENCES) * 5)
    many = sacrebleu_interval((REFERENCES + wrong) * 20, (REFERENCES + REFERENCES) * 20)
    assert 0 < many < few


def test_the_scores_printed_carry_sacrebleus_interval():
    # `hf-transformer test`, `translate --reference` and quality.py print these lines: sacreBLEU with its interval.
    hypotheses = REFERENCES + ["Zwei Kinder spielen im Schnee.", "Eine Frau kocht Suppe in der Küche."]
    references = REFERENCES * 2
    scores = translation_scores(hypotheses * 5, references * 5, "de")
    intervals = {score.name: score.interval for score in scores if score.interval is not None}
    assert intervals == {"sacreBLEU": sacrebleu_interval(hypotheses * 5, references * 5)}
    lines = format_scores(scores).splitlines()
    assert f"± {intervals['sacreBLEU']:.2f}" in lines[0] and all("±" not in line for line in lines[1:])
    assert len({line.index("nrefs:1") for line in lines[:2]}) == 1  # the "how" column stays aligned


def test_a_paired_comparison_tells_a_better_system_from_one_sentence_of_luck():
    """Paired bootstrap resampling on 300 made-up sentences: each side's score is its corpus sacreBLEU (the mean of its
    runs'); the references beat a system with 30% of its words wrong beyond doubt; that system with one sentence made
    right scores higher, but by a difference that the sentences drawn explain; a system against itself differs by
    nothing in every resample (p-value 1). Runs of other lengths are refused."""
    generator = random.Random(0)
    words = ["Mann", "Frau", "Kind", "Hund", "fährt", "läuft", "spielt", "liest", "auf", "der", "Straße", "im", "Park"]
    references = [" ".join(generator.choices(words, k=generator.randint(6, 14))) + "." for _ in range(300)]

    def garbled() -> list[str]:
        return [
            " ".join(w if generator.random() > 0.3 else generator.choice(words) for w in line.split())
            for line in references
        ]

    worse, other = garbled(), garbled()
    lucky = [references[0], *worse[1:]]
    sacrebleu = {name: sacrebleu_scores(run, references)[0].value for name, run in (("worse", worse), ("other", other))}
    better = paired_bootstrap([references], [worse], references)
    assert better.system == pytest.approx(100) and better.baseline == pytest.approx(sacrebleu["worse"])
    assert better.difference_interval[0] > 0 and better.p_value < 0.01
    luck = paired_bootstrap([lucky], [worse], references)
    assert luck.system > luck.baseline and luck.difference_interval[0] == 0.0 and luck.p_value > 0.05
    same = paired_bootstrap([worse], [worse], references)
    assert same.system == same.baseline and same.difference_interval == (0.0, 0.0) and same.p_value == 1.0
    seeds = paired_bootstrap([worse, other], [references], references)  # a setting of two seeds: their mean
    assert seeds.system == pytest.approx((sacrebleu["worse"] + sacrebleu["other"]) / 2)
    with pytest.raises(ValueError, match=r"runs of \[1\] and \[300\] translations for 300 references"):
        paired_bootstrap([worse[:1]], [worse], references)
