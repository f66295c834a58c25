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

import json
import re
from dataclasses import dataclass, replace

from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.significance import PairedTest
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
    """sacreBLEU (`SACREBLEU`) of a system and of a baseline on the same sentences, by paired bootstrap resampling."""

    system: float
    baseline: float
    p_value: float  # the chance of a difference at least this large between two equally good systems
    system_interval: float  # the half-width of the system's 95% confidence interval over the resamples


def paired_bootstrap(
    hypotheses: list[str], baseline_hypotheses: list[str], references: list[str], resamples: int = 1000
) -> PairedComparison:
    """Is `hypotheses` better or worse than `baseline_hypotheses` on these sentences, or could the difference come from
    which sentences were drawn? Paired bootstrap resampling (Koehn 2004) as `sacrebleu --paired-bs` computes it: both
    systems scored on the same resamples of the sentences, its seed `SACREBLEU_SEED` (12345 unless set). Two systems
    compared this way are told apart by smaller differences than each score's own interval (`sacrebleu_interval`)
    suggests, since the sentences that are hard for one are hard for the other."""
    if not len(hypotheses) == len(baseline_hypotheses) == len(references):
        raise ValueError(
            f"{len(hypotheses)} hypotheses and {len(baseline_hypotheses)} baseline hypotheses for {len(references)} "
            "references: a paired comparison needs both systems' translations of the same sentences, one each."
        )
    test = PairedTest(
        [("baseline", baseline_hypotheses), ("system", hypotheses)],
        {SACREBLEU: _sacrebleu_metrics()[SACREBLEU]},
        [references],
        test_type="bs",
        n_samples=resamples,
    )
    baseline, system = test()[1]["BLEU"]  # sacreBLEU names the results by its own name of the score
    # sacreBLEU counts the resamples whose difference exceeds the observed one strictly, so that two equal scores get
    # its smallest p-value, as if they differed: no difference needs no chance to explain it.
    p_value = 1.0 if system.score == baseline.score else system.p_value
    return PairedComparison(system.score, baseline.score, p_value, float(system.ci))


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
