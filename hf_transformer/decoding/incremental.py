"""A decoding step of this package's model without its forward(): speed machinery for beam search, beside the paper's
path in `modeling_transformer.py`, which it calls layer by layer.

`ModelDecoder` (`ensemble.py`) runs the model's forward() at every step, as `generate()` does: Hugging Face's masks,
checks, output records and cache object for each new token of each row. `IncrementalDecoder` runs the same layers on
the new tokens only, and changes three things that give the same numbers to float rounding (tested against forward()):

- Encoder-decoder attention reads its keys and values once per sentence, not once per beam: the beams of a sentence
  are its queries ([sentences, heads, beams, d_k]), so the keys and values of the source are projected once (not
  `num_beams` times) and a sentence leaving the batch drops one row of them.
- The self-attention cache is a pair of plain tensors per layer, and the reordering of beams waits for the next step,
  where the kept rows are copied into a new tensor with the new keys and values after them, in one copy.
- `candidates` gives each row's n most likely next tokens, computing the projection onto the vocabulary, its
  log-softmax and top n over a few rows at a time: the search needs no more than 2 * num_beams of each row, and the
  logits of a whole batch (rows x vocabulary) are never held at once. The top n of a row is searched for only in the
  blocks of the vocabulary that can hold it (`top_n`). With a `Shortlist` (`shortlist.py`), each sentence's rows are
  projected onto its own list of target tokens only, and normalized over them.

`benchmarks/deploy.py` measures the whole against `ModelDecoder` (`translate(..., incremental=False)`); each part was
measured alone on the benchmark's two models while this was written, and kept where it paid.
"""

from collections.abc import Iterator

import torch
import torch.nn.functional as F
from transformers import GenerationMixin

from ..errors import ConfigError
from ..model import TransformerForConditionalGeneration
from .shortlist import ListedGroup, Shortlist, listed_groups

# Rows projected onto the vocabulary at a time by `candidates` on a CPU (logits of 64 rows of a 32,000-token vocabulary
# are 8 MB): the whole batch at once ran slower at the base size, and no faster at the small one.
CANDIDATE_ROWS = 64


def top_n(scores: torch.Tensor, n: int, block: int = 128) -> torch.Tensor:
    """The columns of the `n` highest scores of each row of `scores` [rows, columns], highest first: `topk(n).indices`
    but for the order of equal scores. The n highest lie in the n blocks of `block` columns whose maxima are highest
    (any other block holds nothing above those n maxima), so the top n is taken over those blocks and the last,
    partial one only, after one pass over the row for the maxima."""
    rows, columns = scores.shape
    whole = columns // block
    if whole <= n:
        return scores.topk(n, dim=-1).indices
    maxima = scores[:, : whole * block].view(rows, whole, block).amax(dim=-1)
    starts = maxima.topk(n, dim=-1).indices * block  # [rows, n]
    candidates = (starts[:, :, None] + torch.arange(block, device=scores.device)).flatten(1)
    rest = torch.arange(whole * block, columns, device=scores.device).expand(rows, -1)
    candidates = torch.cat([candidates, rest], dim=1)
    best = scores.gather(1, candidates).topk(n, dim=-1).indices
    return candidates.gather(1, best)


class IncrementalDecoder:
    """The part of this package's model (`TransformerForConditionalGeneration`) in beam search over a batch of
    right-padded sources, row sentence * num_beams + beam, with the interface of `ModelDecoder`: `step` (every
    row's log-probabilities), `candidates` (its best n), `keep` and `reorder`."""

    def __init__(
        self,
        model: TransformerForConditionalGeneration,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        num_beams: int,
        shortlist: Shortlist | None = None,
    ) -> None:
        self.model, self.num_beams = model, num_beams
        self.decoder = model.get_decoder()
        encoder_states = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        # [sentences, heads, source length, d_k] per layer, one row per sentence.
        self.cross_attention_cache = [
            layer.encoder_attn.split_heads(layer.encoder_attn.kv_proj(encoder_states)) for layer in self.decoder.layers
        ]
        # [sentences, 1, 1, source length], True = attend; None without padding (sdpa's fastest path).
        padded = not bool(attention_mask.all())
        self.cross_attention_mask = attention_mask.bool()[:, None, None, :] if padded else None
        self.self_attention_cache: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.beam_rows: torch.Tensor | None = None  # the reordering that waits for the next step
        self.length = 0  # target positions decoded so far
        # With a shortlist: the batch's sentences in groups of those whose rows `candidates` projects at once, each
        # group projected onto the union of its sentences' lists (`listed_groups`); a group shrinks as its sentences
        # end, and keeps its projection.
        self.shortlist: list[ListedGroup] | None = None
        if shortlist is not None:
            if shortlist.vocab_size != model.config.vocab_size:
                raise ConfigError(
                    f"the shortlist covers {shortlist.vocab_size} tokens and the model's vocabulary "
                    f"{model.config.vocab_size}: build the model's own with `hf-transformer shortlist`"
                )
            self.shortlist = listed_groups(
                shortlist, input_ids, attention_mask, model.lm_head, self.rows_at_once // num_beams
            )
            fewest = min(int(group.excluded.isfinite().sum(dim=-1).min()) for group in self.shortlist)
            if fewest < 2 * num_beams:
                raise ConfigError(
                    f"the shortlist gives a sentence only {fewest} target tokens, and beam search "
                    f"with {num_beams} beams takes {2 * num_beams} candidates from each beam: build it with more "
                    "frequent tokens"
                )

    @staticmethod
    def supports(model: GenerationMixin) -> bool:
        """Whether `model` is this package's model (not a model of another class, nor this one's remote code loaded
        from a folder with `trust_remote_code`, whose layers may differ)."""
        return isinstance(model, TransformerForConditionalGeneration)

    def hidden_states(self, tokens: torch.Tensor) -> torch.Tensor:
        """The decoder's output [rows, d_model] at the position of `tokens` ([rows, 1]), which join the cache."""
        rows = tokens.shape[0]
        sentences = rows // self.num_beams
        hidden_states = self.decoder.embed(tokens, None, self.length)  # [rows, 1, d_model]
        for index, layer in enumerate(self.decoder.layers):
            attention = layer.self_attn
            query, key, value = attention.split_heads(
                attention.qkv_proj(layer.self_attn_add_norm.sublayer_input(hidden_states))
            )
            if self.length:
                cached_keys, cached_values = self.self_attention_cache[index]
                key, value = self.joined(cached_keys, key), self.joined(cached_values, value)
                self.self_attention_cache[index] = (key, value)
            else:
                self.self_attention_cache.append((key, value))
            # Every row holds the same positions, all earlier than the query's: nothing to mask.
            attended = F.scaled_dot_product_attention(query, key, value, scale=attention.scaling)
            attended = attention.out_proj(attended.transpose(1, 2).reshape(rows, 1, -1))
            hidden_states = layer.self_attn_add_norm(hidden_states, attended)

            attention = layer.encoder_attn
            query = attention.q_proj(layer.encoder_attn_add_norm.sublayer_input(hidden_states))
            # The beams of a sentence as its queries: [sentences, heads, beams, d_k].
            query = query.view(sentences, self.num_beams, attention.num_heads, attention.head_dim).transpose(1, 2)
            key, value = self.cross_attention_cache[index]
            attended = F.scaled_dot_product_attention(
                query, key, value, attn_mask=self.cross_attention_mask, scale=attention.scaling
            )
            attended = attention.out_proj(attended.transpose(1, 2).reshape(rows, 1, -1))
            hidden_states = layer.encoder_attn_add_norm(hidden_states, attended)

            add_norm = layer.feed_forward_add_norm
            hidden_states = add_norm(hidden_states, layer.feed_forward(add_norm.sublayer_input(hidden_states)))
        if self.decoder.layer_norm is not None:
            hidden_states = self.decoder.layer_norm(hidden_states)
        self.beam_rows = None
        self.length += 1
        return hidden_states[:, -1]

    def joined(self, cached: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        """The cached keys (or values) [rows, heads, length, d_k] of the beam each row continues, then `new`
        [rows, heads, 1, d_k]: written into one new tensor, each cached row copied once (`index_select`, which copies
        whole rows, faster than indexing)."""
        joined = new.new_empty(*new.shape[:2], self.length + 1, new.shape[3])
        if self.beam_rows is None:
            joined[:, :, : self.length] = cached
        else:
            torch.index_select(cached, 0, self.beam_rows, out=joined[:, :, : self.length])
        joined[:, :, self.length :] = new
        return joined

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """The fp32 log-probabilities [rows, vocabulary] of the next token after `tokens` ([rows, 1])."""
        return self.log_probs(self.hidden_states(tokens))

    def log_probs(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The fp32 log-probabilities over the vocabulary of the decoder's output `hidden_states` [rows, d_model];
        with a shortlist, -inf outside each sentence's list."""
        if self.shortlist is None:
            return F.log_softmax(self.model.lm_head(hidden_states).float(), dim=-1)
        full = hidden_states.new_full(
            (hidden_states.shape[0], self.model.config.vocab_size), -torch.inf, dtype=torch.float32
        )
        for group, rows in self.shortlisted_rows():
            full[rows].index_copy_(1, group.tokens, self.shortlisted(group, hidden_states[rows]))
        return full

    @property
    def rows_at_once(self) -> int:
        """The rows `candidates` projects onto the vocabulary at a time on a CPU: whole sentences' beams."""
        return max(CANDIDATE_ROWS // self.num_beams, 1) * self.num_beams

    def shortlisted_rows(self) -> Iterator[tuple[ListedGroup, slice]]:
        """Each shortlist group that still holds sentences, and the slice of the batch's rows that are its beams."""
        start = 0
        for group in self.shortlist:
            end = start + group.excluded.shape[0] * self.num_beams
            if end > start:
                yield group, slice(start, end)
            start = end

    def shortlisted(self, group: ListedGroup, hidden_states: torch.Tensor) -> torch.Tensor:
        """The fp32 log-probabilities [rows, the group's tokens] after the decoder's output `hidden_states` for the
        beams of the group's sentences: normalized over each sentence's list, -inf outside it."""
        logits = group.projection(hidden_states).float().view(group.excluded.shape[0], self.num_beams, -1)
        return F.log_softmax(logits + group.excluded, dim=-1).flatten(0, 1)

    def candidates(self, tokens: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The `n` most likely next tokens of every row after `tokens` ([rows, 1]) and their fp32 log-probabilities,
        each [rows, n], best first: `step(tokens).topk(n)` without the whole batch's logits at once."""
        hidden_states = self.hidden_states(tokens)
        scores, token_ids = [], []
        if self.shortlist is not None:  # on any device: the groups' lists, not the whole vocabulary
            for group, rows in self.shortlisted_rows():
                log_probs = self.shortlisted(group, hidden_states[rows])
                best = top_n(log_probs, n)
                scores.append(log_probs.gather(1, best))
                token_ids.append(group.tokens[best])
            return torch.cat(scores), torch.cat(token_ids)
        if hidden_states.device.type != "cpu":  # the means below were measured on CPUs
            return self.log_probs(hidden_states).topk(n, dim=-1)
        for start in range(0, hidden_states.shape[0], self.rows_at_once):
            logits = self.model.lm_head(hidden_states[start : start + self.rows_at_once]).float()
            best = top_n(logits, n)
            scores.append(F.log_softmax(logits, dim=-1).gather(1, best))
            token_ids.append(best)
        return torch.cat(scores), torch.cat(token_ids)

    def keep(self, rows: torch.Tensor) -> None:
        """Keep only `rows`, the rows of whole sentences still searched, in order. The self-attention cache follows at
        the next `reorder`, whose rows index the rows before this call."""
        sentences = rows[:: self.num_beams] // self.num_beams
        self.cross_attention_cache = [(key[sentences], value[sentences]) for key, value in self.cross_attention_cache]
        if self.cross_attention_mask is not None:
            self.cross_attention_mask = self.cross_attention_mask[sentences]
        if self.shortlist is not None:  # each group keeps the rows of its sentences that remain
            start, groups = 0, []
            for group in self.shortlist:
                end = start + group.excluded.shape[0]
                remaining = sentences[(sentences >= start) & (sentences < end)] - start
                groups.append(group._replace(excluded=group.excluded[remaining]))
                start = end
            self.shortlist = groups

    def reorder(self, beam_rows: torch.Tensor) -> None:
        """Row i of the self-attention cache becomes row `beam_rows[i]`'s (the beam each surviving beam continues),
        at the next step."""
        self.beam_rows = beam_rows
