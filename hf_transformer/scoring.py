"""Scores of translations against references, each labelled with how it was computed, so that a user holding a
published table knows which number to compare with.

- sacreBLEU (cased, detokenized, 13a tokenization): the number to compare across papers that report sacreBLEU, with
  its signature.
- sacreBLEU lowercased: the same, case-insensitive.
- chrF: character n-gram F-score (sacreBLEU's), less sensitive to morphology than BLEU.
- tokenized BLEU, lowercased: Moses-tokenized hypotheses and references scored on their tokens, as `multi-bleu.perl
  -lc` does on the tokenized, lowercased files most Multi30k papers use (e.g. the Revisit-MMT baselines).
- tokenized BLEU with compound splitting (German targets): Moses-tokenized, cased, with hyphenated compounds split as
  tensor2tensor's `get_ende_bleu.sh` does, the measure behind the paper's 27.3 (base) and 28.4 (big) on WMT14 en-de.
"""

import copy
import json
import os
import re
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from sacrebleu.metrics import BLEU, CHRF
from sacremoses import MosesTokenizer

from .errors import UserError

# tensor2tensor's get_ende_bleu.sh: `perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'`, after Moses tokenization.
_COMPOUND = re.compile(r"(\S)-(\S)")
# The names of the sacreBLEU scores: the two BLEU scores callers choose a model on, and chrF.
SACREBLEU = "sacreBLEU"
SACREBLEU_LOWERCASED = "sacreBLEU, lowercased"
CHRF_SCORE = "chrF"
# The scores a trained model reports under short names (test/bleu, test/chrf; the model card's metric types).
LOGGED_SCORES = {"bleu": SACREBLEU, "chrf": CHRF_SCORE}


@dataclass(frozen=True)
class ValidationBLEU:
    """The BLEU that training logs at each validation (`val/bleu`), its settings written once: torchmetrics'
    `SacreBLEUScore`, whose states are sums over batches and ranks, computes it (no smoothing: an n-gram order without
    a match scores 0), and its sacreBLEU signature labels it on the model card."""

    tokenize: str = "13a"
    lowercase: bool = False

    def torchmetrics(self) -> Any:
        from torchmetrics.text import SacreBLEUScore  # a metric of training: the rest of the package needs none

        return SacreBLEUScore(tokenize=self.tokenize, lowercase=self.lowercase, smooth=False)

    def signature(self) -> str:
        """sacreBLEU's signature of the same computation against one reference per sentence."""
        metric = BLEU(tokenize=self.tokenize, lowercase=self.lowercase, smooth_method="none")
        metric.num_refs = 1  # sacreBLEU only knows it after scoring; validation scores against one reference
        return metric.get_signature().format()


@dataclass(frozen=True)
class ValidationChrF:
    """The chrF that training logs at each validation (`val/chrf`): character 6-grams, no word n-grams (chrF, not
    chrF++), beta 2, whitespace ignored; torchmetrics' `CHRFScore` computes it, sacreBLEU's signature labels it."""

    char_order: int = 6
    word_order: int = 0
    beta: int = 2

    def torchmetrics(self) -> Any:
        from torchmetrics.text import CHRFScore

        return CHRFScore(n_char_order=self.char_order, n_word_order=self.word_order, beta=float(self.beta))

    def signature(self) -> str:
        metric = CHRF(char_order=self.char_order, word_order=self.word_order, beta=self.beta)
        metric.num_refs = 1
        return metric.get_signature().format()


# The scores of validation, under their short names (val/bleu, val/chrf; the model card's metric types).
VALIDATION_BLEU, VALIDATION_CHRF = ValidationBLEU(), ValidationChrF()
VALIDATION_SCORES = {"bleu": VALIDATION_BLEU, "chrf": VALIDATION_CHRF}


@dataclass(frozen=True)
class Score:
    name: str
    value: float
    how: str  # the signature or the procedure: what a published number must share to be compared with this one
    interval: float | None = None  # the half-width of its 95% confidence interval over the sentences, where measured


def _sacrebleu_metrics() -> dict[str, BLEU | CHRF]:
    """The sacreBLEU metric behind each sacreBLEU score, by name: the one place their settings are written."""
    return {SACREBLEU: BLEU(), SACREBLEU_LOWERCASED: BLEU(lowercase=True), CHRF_SCORE: CHRF()}


def sacrebleu_signatures() -> dict[str, str]:
    """The signature that `sacrebleu_scores` labels each of its scores with (one reference per sentence), by name,
    without scoring anything: for a model card, whose test scores these are."""
    signatures = {}
    for name, metric in _sacrebleu_metrics().items():
        metric.num_refs = 1  # sacreBLEU learns it from the references it scores; `sacrebleu_scores` gives one each
        signatures[name] = str(metric.get_signature())
    return signatures


def sacrebleu_scores(hypotheses: list[str], references: list[str]) -> list[Score]:
    """sacreBLEU's BLEU (cased, lowercased) and chrF of `hypotheses` against one reference each: the scores that need
    no knowledge of the language."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references: give one per reference.")
    if not hypotheses:  # sacreBLEU fails on an empty corpus with an IndexError
        raise UserError(
            "there is nothing to score: no translations and no references. Give at least one sentence and its reference"
        )
    return [
        Score(name, metric.corpus_score(hypotheses, [references]).score, str(metric.get_signature()))
        for name, metric in _sacrebleu_metrics().items()
    ]


def sacrebleu_interval(hypotheses: list[str], references: list[str], resamples: int = 1000) -> float:
    """The half-width of the 95% confidence interval of sacreBLEU (`SACREBLEU`) over the sentences scored, by bootstrap
    resampling (Koehn 2004, "Statistical Significance Tests for Machine Translation Evaluation") as `sacrebleu
    --confidence` computes it, its seed `SACREBLEU_SEED` (12345 unless set): how far the score of another test set of
    this size and kind could lie. It measures the test set's sampling, not the training's (another seed)."""
    metric = _sacrebleu_metrics()[SACREBLEU]
    score = metric.corpus_score(hypotheses, [references], n_bootstrap=resamples)
    formatted = json.loads(score.format(is_json=True, signature=str(metric.get_signature())))
    # sacreBLEU leaves the interval out where the resamples' mean is 0: every resample scored 0, an interval of 0.
    return formatted.get("confidence_var", 0.0)


@dataclass(frozen=True)
class PairedComparison:
    """sacreBLEU (`SACREBLEU`) of a system and of a baseline on the same sentences, each the mean over its runs (the
    seeds of a setting), compared by paired bootstrap resampling (`paired_bootstrap`)."""

    system: float
    baseline: float
    difference_interval: tuple[float, float]  # the 95% interval of system - baseline over the resamples
    p_value: float  # two-sided: twice the share of resamples whose difference lies on the rarer side of 0


def paired_bootstrap(
    systems: list[list[str]], baselines: list[list[str]], references: list[str], resamples: int = 1000
) -> PairedComparison:
    """Is a system better or worse than a baseline on these sentences, or could the difference come from which
    sentences were drawn? Each side is one or more runs' translations of `references` (several seeds of one setting:
    its score is their mean). Paired bootstrap resampling (Koehn 2004, "Statistical Significance Tests for Machine
    Translation Evaluation"): `resamples` draws of the sentences with replacement, seeded by `SACREBLEU_SEED` (12345
    unless set) as sacreBLEU's own tests are, and in each draw every run's corpus sacreBLEU of the same sentences, from
    the sentences' n-gram statistics. Paired, a comparison tells apart smaller differences than each score's own
    interval (`sacrebleu_interval`) suggests, since the sentences that are hard for one system are hard for the other.
    """
    runs = [*systems, *baselines]
    if resamples < 1:
        raise ValueError(f"resamples={resamples}: a paired bootstrap draws at least 1 resample of the sentences")
    if not systems or not baselines or any(len(run) != len(references) for run in runs):
        raise ValueError(
            f"runs of {[len(run) for run in systems]} and {[len(run) for run in baselines]} translations for "
            f"{len(references)} references: a paired comparison needs at least one run on each side, each with one "
            "translation of every reference."
        )
    metric = _sacrebleu_metrics()[SACREBLEU]
    per_sentence = copy.copy(metric)
    per_sentence.effective_order = True  # what sentence scores should use; the n-gram statistics are the same

    def sentence_statistics(hypotheses: list[str]) -> list[list[int]]:
        """Each sentence's statistics, which the corpus score sums: output and reference lengths, the matching
        n-grams and the output's n-grams of each order."""
        scores = (per_sentence.sentence_score(h, [r]) for h, r in zip(hypotheses, references, strict=True))
        return [[score.sys_len, score.ref_len, *score.counts, *score.totals] for score in scores]

    statistics = np.array([sentence_statistics(run) for run in runs], dtype=np.int64)  # [runs, sentences, statistics]
    seed = os.environ.get("SACREBLEU_SEED", "12345")
    generator = np.random.default_rng(None if seed.lower() == "none" else int(seed))
    # How often each sentence is drawn in each resample, the whole corpus as the first row.
    draws = generator.multinomial(len(references), np.full(len(references), 1 / len(references)), size=resamples)
    weights = np.vstack([np.ones(len(references), dtype=np.int64), draws])
    order = metric.max_ngram_order

    def bleu(summed: np.ndarray) -> float:
        return BLEU.compute_bleu(
            correct=summed[2 : 2 + order].tolist(),
            total=summed[2 + order :].tolist(),
            sys_len=int(summed[0]),
            ref_len=int(summed[1]),
            smooth_method=metric.smooth_method,
            smooth_value=metric.smooth_value,
            effective_order=metric.effective_order,
            max_ngram_order=order,
        ).score

    scores = np.array([[bleu(summed) for summed in weights @ run] for run in statistics])  # [runs, 1 + resamples]
    system, baseline = scores[: len(systems)].mean(0), scores[len(systems) :].mean(0)
    differences = system[1:] - baseline[1:]
    other_sign = min((differences <= 0).sum(), (differences >= 0).sum())
    low, high = np.percentile(differences, [2.5, 97.5])
    return PairedComparison(
        float(system[0]),
        float(baseline[0]),
        (float(low), float(high)),
        min(1.0, 2 * (int(other_sign) + 1) / (resamples + 1)),
    )


def translation_scores(hypotheses: list[str], references: list[str], target_lang: str) -> list[Score]:
    """Every score of `hypotheses` against one reference each (`sacrebleu_scores` and the tokenized BLEU of papers),
    in the target language `target_lang` (an ISO code such as "de"; it picks the Moses tokenizer's rules); sacreBLEU
    with its 95% confidence interval (`sacrebleu_interval`)."""
    scores = [
        replace(score, interval=sacrebleu_interval(hypotheses, references)) if score.name == SACREBLEU else score
        for score in sacrebleu_scores(hypotheses, references)
    ]
    tokenizer = MosesTokenizer(lang=target_lang)

    def tokenized(texts: list[str], split_compounds: bool = False) -> list[str]:
        lines = [tokenizer.tokenize(text, escape=False, return_str=True) for text in texts]
        return [_COMPOUND.sub(r"\1 ##AT##-##AT## \2", line) for line in lines] if split_compounds else lines

    # The tokens are the point here: force=True stops sacreBLEU warning that the text looks tokenized (it warns
    # from 100 lines ending in " .", every test set); it changes no score.
    on_tokens = BLEU(tokenize="none", lowercase=True, force=True)
    scores.append(
        Score(
            "tokenized BLEU, lowercased",
            on_tokens.corpus_score(tokenized(hypotheses), [tokenized(references)]).score,
            f"Moses tokenizer ({target_lang}), lowercased, as multi-bleu.perl -lc: Multi30k papers",
        )
    )
    if target_lang == "de":
        split = BLEU(tokenize="none", force=True)
        scores.append(
            Score(
                "tokenized BLEU, compounds split",
                split.corpus_score(tokenized(hypotheses, True), [tokenized(references, True)]).score,
                "Moses tokenizer (de), cased, compounds split as get_ende_bleu.sh: WMT14 en-de papers",
            )
        )
    return scores


def format_scores(scores: list[Score]) -> str:
    """One line per score: name, value (± the half-width of its 95% confidence interval, where measured) and how it
    was computed."""
    values = [
        f"{score.value:6.2f}" + (f" ± {score.interval:.2f}" if score.interval is not None else "") for score in scores
    ]
    name_width, value_width = max(len(score.name) for score in scores), max(map(len, values))
    return "\n".join(
        f"{score.name:<{name_width}}  {value:<{value_width}}  {score.how}"
        for score, value in zip(scores, values, strict=True)
    )
