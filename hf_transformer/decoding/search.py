"""Translating many sentences quickly: length-sorted batches under a token budget, and a beam search that drops each
sentence from the batch as soon as its translation is final, instead of decoding it until the batch's longest is."""

import warnings
from collections.abc import Sequence
from typing import Any, NamedTuple, overload

import torch
from transformers import GenerationConfig, GenerationMixin, PreTrainedTokenizerBase

from ..errors import TranslationInputError
from ..model.configuration_transformer import MAX_LENGTH_OFFSET, max_new_tokens
from ..token_budget import pack_token_budget
from .ensemble import Ensemble, as_decodable, decoder
from .int8 import quantize_int8
from .shortlist import Shortlist

# The token budget of a decoding batch (source tokens x beams, padding included), of every tool that translates.
DECODING_MAX_TOKENS = 8192
# A score that never wins: what Hugging Face's beam search uses for "not a candidate".
EXCLUDED = -1.0e9


class Hypothesis(NamedTuple):
    """One output of beam search: its token ids, from the decoder start token to </s> (or cut at the maximum
    length), and its score, the summed log-probabilities / length ** length_penalty (`generate()`'s
    `sequences_scores`)."""

    token_ids: list[int]
    score: float


class Translation(NamedTuple):
    """A `Hypothesis` with its text."""

    text: str
    score: float
    token_ids: list[int]


class SourceTruncatedWarning(UserWarning):
    """Sources longer than the model's positions were cut: their translations miss the end. `indices` are the
    positions of the cut sentences in the input, `max_length` the number of tokens they were cut to."""

    def __init__(self, message: str, indices: list[int], max_length: int) -> None:
        super().__init__(message)
        self.indices, self.max_length = indices, max_length


def truncation_message(names: list[str], total: int, max_length: int) -> str:
    """The one wording of a cut source, for `translate()`, the command line and the server: how many of `total`
    sentences were cut to how many tokens, naming the first few (`names`: "sentence 3", "line 7 of a.txt")."""
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return (
        f"{len(names)} of {total} sentences are longer than the model's {max_length} positions and were cut to "
        f"{max_length} tokens, so their translations miss the end ({shown}): split them into shorter sentences"
    )


def prepare_sources(
    tokenizer: PreTrainedTokenizerBase, sentences: list[str], max_positions: int
) -> tuple[list[int], list[list[int]], SourceTruncatedWarning | None]:
    """The indices of the sentences to translate (the blank ones translate to ""), their token ids cut to
    `max_positions`, and the warning to give for those that were cut (None when none was)."""
    todo = [index for index, sentence in enumerate(sentences) if sentence.strip()]
    if not todo:
        return [], [], None  # tokenizers fail on an empty batch
    encoded = tokenizer([sentences[index] for index in todo], truncation=True, max_length=max_positions)
    ids = encoded["input_ids"]
    cut = [index for index, encoding in enumerate(encoded.encodings or []) if encoding.overflowing]  # fast tokenizers
    if not cut:
        return todo, ids, None
    indices = [todo[index] for index in cut]
    message = truncation_message([f"sentence {index}" for index in indices], len(sentences), max_positions)
    return todo, ids, SourceTruncatedWarning(message, indices, max_positions)


def check_sentences(sentences: Sequence[str]) -> None:
    """Refuse what is not a list of strings, naming what was passed instead (a lone string would be translated
    character by character)."""
    if isinstance(sentences, str):
        raise TranslationInputError(
            f"translate() takes a list of sentences, not one string: pass [{sentences[:40]!r}] to translate one"
        )
    for index, sentence in enumerate(sentences):
        if not isinstance(sentence, str):
            raise TranslationInputError(
                f"sentence {index} is a {type(sentence).__name__}, not a string: translate() takes a list of str"
            )


def check_decoding_settings(
    generation_config: GenerationConfig, num_beams: int | None = None, num_return_sequences: int = 1
) -> int:
    """Refuse a number of beams or an n-best list that cannot work, naming the setting and its range, and return the
    number of beams: `num_beams`, or where it is None the generation config's. The one check of `translate()`,
    `beam_search`, CTranslate2's and `TranslationEngine` (which adds the commands' limits)."""
    if num_beams is not None and num_beams < 1:
        raise TranslationInputError(f"num_beams={num_beams} must be at least 1")
    beams = (generation_config.num_beams or 1) if num_beams is None else num_beams
    if not 1 <= num_return_sequences <= beams:
        raise TranslationInputError(
            f"num_return_sequences={num_return_sequences} (the n-best list) must be between 1 and num_beams={beams}"
        )
    return beams


@overload
def translate(
    model: GenerationMixin | Ensemble | list[GenerationMixin],
    tokenizer: PreTrainedTokenizerBase,
    sentences: list[str],
    *,
    num_beams: int | None = ...,
    length_penalty: float | None = ...,
    max_tokens: int = ...,
    max_length_offset: int = ...,
    num_return_sequences: None = ...,
    int8: bool = ...,
    incremental: bool = ...,
    shortlist: Shortlist | None = ...,
) -> list[str]: ...


@overload
def translate(
    model: GenerationMixin | Ensemble | list[GenerationMixin],
    tokenizer: PreTrainedTokenizerBase,
    sentences: list[str],
    *,
    num_beams: int | None = ...,
    length_penalty: float | None = ...,
    max_tokens: int = ...,
    max_length_offset: int = ...,
    num_return_sequences: int,
    int8: bool = ...,
    incremental: bool = ...,
    shortlist: Shortlist | None = ...,
) -> list[list[Translation]]: ...


@torch.inference_mode()
def translate(
    model: GenerationMixin | Ensemble | list[GenerationMixin],
    tokenizer: PreTrainedTokenizerBase,
    sentences: list[str],
    *,
    num_beams: int | None = None,
    length_penalty: float | None = None,
    max_tokens: int = DECODING_MAX_TOKENS,
    max_length_offset: int = MAX_LENGTH_OFFSET,
    num_return_sequences: int | None = None,
    int8: bool = False,
    incremental: bool = True,
    shortlist: Shortlist | None = None,
) -> list[str] | list[list[Translation]]:
    """Translate `sentences` with `beam_search`, returning translations in the order of the input.

    Each translation is what `model.generate()` gives for that sentence alone, with at most its length +
    `max_length_offset` output tokens (section 6.1 of the paper: 50, the bound of `generate()` and of the pipeline too;
    `max_new_tokens`). `num_beams` and `length_penalty` default to the
    model's generation config (the paper's 4 and 0.6 for this package's models); `num_beams=1` is greedy decoding.
    Sentences of similar length are decoded together, in batches of at most `max_tokens` source tokens counted with
    padding and beams. An empty (or blank) sentence translates to an empty string; a sentence longer than the model's
    positions is cut to them, with a `SourceTruncatedWarning` that names it.

    With `num_return_sequences` n, each sentence gets its n best translations (at most `num_beams`), best first, as
    `Translation`s with their scores and token ids: the n-best list of `generate(num_return_sequences=n)`. An empty
    sentence then gets one empty translation with score 0.

    `model` may be several models that share `tokenizer`, as a list (`translate([model_a, model_b], ...)`) or an
    `Ensemble` (to choose how it averages): the same search then advances on the average of their next-token
    distributions at every step (`ensemble.py`), with the first model's generation config for the defaults.

    With `int8=True`, a copy of the model with int8 weights in its linear layers decodes, on the CPU (`int8.py`):
    faster, with translations close to float32's but not always equal. The copy is made at each call (seconds for a
    base-size model): to translate many times, make it once with `quantize_int8(model)` and pass that, or load a
    `TranslationEngine` with `int8=True`.

    `incremental=False` decodes through the model's forward() at every step (`beam_search`), as `generate()` does:
    slower, for comparison.

    With a `shortlist` (`Shortlist.from_pretrained(folder)`, built by `hf-transformer shortlist`), each sentence is
    scored over its own few hundred likely target tokens instead of the whole vocabulary (`shortlist.py`): faster, with
    translations close to the full model's, made of the list's tokens only. One model of this package only.
    """
    check_sentences(sentences)
    model = as_decodable(model)
    if int8:
        model = quantize_int8(model)
    translations: list[list[Translation]] = [[Translation("", 0.0, [])] for _ in sentences]
    todo, ids, truncated = prepare_sources(tokenizer, sentences, model.config.max_position_embeddings)
    n_best = 1 if num_return_sequences is None else num_return_sequences
    num_beams = check_decoding_settings(model.generation_config, num_beams, n_best)
    # Each sentence takes `num_beams` rows of the padded batch.
    for batch in pack_token_budget([num_beams * len(row) for row in ids], max_tokens):
        inputs = tokenizer.pad({"input_ids": [ids[i] for i in batch]}, return_tensors="pt").to(model.device)
        results = beam_search(
            model,
            inputs["input_ids"],
            inputs["attention_mask"],
            num_beams=num_beams,
            length_penalty=length_penalty,
            max_length_offset=max_length_offset,
            num_return_sequences=n_best,
            incremental=incremental,
            shortlist=shortlist,
        )
        for index, hypotheses in zip(batch, results, strict=True):
            texts = tokenizer.batch_decode([output.token_ids for output in hypotheses], skip_special_tokens=True)
            translations[todo[index]] = [
                Translation(text.strip(), hypothesis.score, hypothesis.token_ids)
                for text, hypothesis in zip(texts, hypotheses, strict=True)
            ]
    if truncated:
        warnings.warn(truncated, stacklevel=3)  # the caller's line, past inference_mode's wrapper
    if num_return_sequences is None:
        return [best[0].text for best in translations]
    return translations


def translate_hypotheses(
    model: GenerationMixin, tokenizer: PreTrainedTokenizerBase, sentences: list[str], **settings: Any
) -> list[list[Translation]]:
    """Deprecated since 0.4: `translate(..., num_return_sequences=n)` gives the same n-best lists."""
    warnings.warn(
        "translate_hypotheses() is deprecated: call translate(model, tokenizer, sentences, num_return_sequences=n)",
        FutureWarning,
        stacklevel=2,
    )
    return translate(model, tokenizer, sentences, **{"num_return_sequences": 1, **settings})


@torch.inference_mode()
def beam_search(
    model: GenerationMixin | Ensemble | list[GenerationMixin],
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    num_beams: int | None = None,
    length_penalty: float | None = None,
    max_length_offset: int = MAX_LENGTH_OFFSET,
    num_return_sequences: int = 1,
    incremental: bool = True,
    shortlist: Shortlist | None = None,
) -> list[list[Hypothesis]]:
    """Beam search over a batch of right-padded sources, returning the `num_return_sequences` best hypotheses of
    each (at most `num_beams`), best first. Each list equals what `model.generate(num_return_sequences=...)` gives for
    that source alone with `max_length` = its length + `max_length_offset` + 1, capped at `max_position_embeddings`,
    and the scores its `sequences_scores`; `num_beams` and `length_penalty` default to the model's generation config,
    and `num_beams=1` is greedy decoding.

    The rules are those of `generate()` with `early_stopping=False`: a hypothesis ending in EOS (or at the maximum
    length) is scored by its summed log-probabilities / length ** `length_penalty`; a sentence is final once it has
    `num_beams` of them and its best running beam, scored at the current length, cannot beat the worst. Unlike
    `generate()`, a final sentence leaves the batch with its rows of the key/value cache, so the other sentences no
    longer pay for it.

    The search sees the model through a decoder (`ensemble.py`), which encodes the sources once and gives each step's
    best next tokens: for this package's model an `IncrementalDecoder` (`incremental.py`), which runs its layers on the
    new tokens only; with `incremental=False`, or for a model of another class, a `ModelDecoder`, which runs the model's
    forward() at each step as `generate()` does (slower; the reference the other is tested against). `model` may also be
    an `Ensemble` (or a list of models), whose members' log-probabilities are averaged at every step. A `shortlist`
    restricts each sentence's next tokens to its list (`shortlist.py`; one model of this package).
    """
    model = as_decodable(model)
    config = model.config
    eos, start = config.eos_token_id, config.decoder_start_token_id
    k = check_decoding_settings(model.generation_config, num_beams, num_return_sequences)
    length_penalty = model.generation_config.length_penalty if length_penalty is None else length_penalty
    # + 1 for the decoder start token
    max_lengths = max_new_tokens(attention_mask.sum(dim=1), config.max_position_embeddings, max_length_offset) + 1
    batch_size = input_ids.shape[0]
    longest = int(max_lengths.max())
    device = input_ids.device

    def rows_of(sentences: torch.Tensor) -> torch.Tensor:
        """The flat [sentence * k + beam] row indices of `sentences`."""
        return (sentences[:, None] * k + torch.arange(k, device=device)).flatten()

    decoding = decoder(model, input_ids, attention_mask, k, incremental, shortlist)  # encodes the sources once
    per_beam = min(2 * k, config.vocab_size)  # each beam's best tokens; a vocabulary may be smaller than 2k

    sentence_ids = torch.arange(batch_size, device=device)  # which input sentence each active one is
    running = torch.full((batch_size, k, longest), -1, dtype=torch.long, device=device)  # -1: not decoded yet
    running[:, :, 0] = start
    running_scores = torch.zeros(batch_size, k, device=device)
    running_scores[:, 1:] = EXCLUDED  # all beams start alike: take the candidates of the first only
    finished = running.clone()
    finished_scores = torch.full((batch_size, k), EXCLUDED, device=device)
    is_finished = torch.zeros(batch_size, k, dtype=torch.bool, device=device)
    best = [[] for _ in range(batch_size)]

    for length in range(1, longest):  # `length` tokens decoded so far, counting the start token
        active = len(sentence_ids)
        # The 2k best continuations, so that k remain even if k of them end here: among the 2k best of each beam.
        row_scores, row_tokens = decoding.candidates(running[:, :, length - 1].reshape(-1, 1), per_beam)
        scores = (row_scores.view(active, k, -1) + running_scores[:, :, None]).view(active, -1)
        candidate_scores, flat_indices = scores.topk(2 * k)
        candidate_beams = flat_indices // per_beam
        candidate_tokens = row_tokens.view(active, -1).gather(1, flat_indices)
        candidates = running.gather(1, candidate_beams[:, :, None].expand(-1, -1, longest))
        candidates[:, :, length] = candidate_tokens
        at_max_length = length + 1 >= max_lengths[sentence_ids]
        ends = (candidate_tokens == eos) | at_max_length[:, None]

        # Running beams: the k best candidates that did not end.
        keep_scores, keep = (candidate_scores + ends * EXCLUDED).topk(k)
        running = candidates.gather(1, keep[:, :, None].expand(-1, -1, longest))
        running_scores = keep_scores
        beam_rows = (candidate_beams.gather(1, keep) + torch.arange(active, device=device)[:, None] * k).flatten()

        # Finished hypotheses: the k best of those kept so far and those among the top k candidates that ended now.
        ended_now = ends.clone()
        ended_now[:, k:] = False
        normalized = candidate_scores / length**length_penalty + ~ended_now * EXCLUDED
        merged_scores = torch.cat([finished_scores, normalized], dim=1)
        finished_scores, top = merged_scores.topk(k)
        finished = torch.cat([finished, candidates], dim=1).gather(1, top[:, :, None].expand(-1, -1, longest))
        is_finished = torch.cat([is_finished, ended_now], dim=1).gather(1, top)

        if k == 1:
            final = at_max_length | is_finished[:, 0]
        else:
            best_possible = running_scores[:, 0] / length**length_penalty
            final = at_max_length | is_finished.all(dim=1) & (best_possible <= finished_scores.min(dim=1).values)
        final_positions = final.nonzero().flatten().tolist()  # the step's one read from the device
        for position in final_positions:
            scores = finished_scores[position, :num_return_sequences].tolist()
            outputs = finished[position, :num_return_sequences, : length + 1].tolist()
            best[sentence_ids[position]] = [
                Hypothesis(output[: output.index(eos, 1) + 1 if eos in output[1:] else None], score)
                for output, score in zip(outputs, scores, strict=True)
                if score > EXCLUDED / 2  # a hypothesis, not an empty slot
            ]
        if len(final_positions) == active:
            break
        if final_positions:
            remaining = (~final).nonzero().flatten()
            rows = rows_of(remaining)
            beam_rows = beam_rows[rows]
            decoding.keep(rows)
            sentence_ids, running, running_scores = (
                sentence_ids[remaining],
                running[remaining],
                running_scores[remaining],
            )
            finished, finished_scores = finished[remaining], finished_scores[remaining]
            is_finished = is_finished[remaining]
        decoding.reorder(beam_rows)
    return best
