import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from hf_transformer import TransformerConfig, TransformerForConditionalGeneration
from lightning_modules import TranslationDataModule, TranslationModule
from lightning_modules.checkpoint import tokenizer_state
from lightning_modules.data.tokenization import train_bpe_tokenizer

DEMO = Path(__file__).resolve().parents[1] / "configs" / "demo.yaml"  # the quick demo, which tests train in

# Under pytest-xdist (`pytest -n auto`) the workers share the cores: each takes its part, and so do the processes its
# tests start (OMP_NUM_THREADS), rather than every one spinning up a thread per core.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    _THREADS = max(1, (os.cpu_count() or 1) // _WORKERS)
    os.environ.setdefault("OMP_NUM_THREADS", str(_THREADS))
    torch.set_num_threads(_THREADS)

# transformers' own test modules, which test_hf_contract.py runs: they hold mixins, not tests of their own.
collect_ignore = ["upstream"]


@pytest.fixture(autouse=True)
def _offline_and_seeded(monkeypatch, tmp_path):
    """Tests never reach the network, write caches into their own folder and start from the same seed."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "modules-cache"))
    torch.manual_seed(0)


@pytest.fixture
def tiny_config() -> TransformerConfig:
    return make_tiny_config()


# The model of the modeling tests: two layers, so that layer stacking and caches are exercised.
TINY_CONFIG = dict(
    vocab_size=64,
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_position_embeddings=64,
)


def make_tiny_config() -> TransformerConfig:
    return TransformerConfig(**TINY_CONFIG)


@pytest.fixture
def tiny_tokenizer():
    """The project's BPE tokenizer (<pad> 0, <s> 1, </s> 2, <unk> 3, appending </s>) trained on a few sentences."""
    corpus = ["a dog runs on the grass", "two men play music", "ein hund rennt", "zwei männer spielen musik"]
    return train_bpe_tokenizer([corpus] * 10, vocab_size=64, min_frequency=0)


# A model small enough to train for a few steps in a test.
TINY_MODEL = dict(
    d_model=16,
    encoder_layers=1,
    decoder_layers=1,
    encoder_attention_heads=2,
    decoder_attention_heads=2,
    encoder_ffn_dim=32,
    decoder_ffn_dim=32,
)


def tiny_data(tmp: Path, **overrides) -> TranslationDataModule:
    """The synthetic task (numbers -> words) with a 60-token BPE vocabulary trained into `tmp/tokenizer`."""
    settings = dict(dataset="synthetic", bpe_vocab_size=60, eval_max_tokens=512, tokenizer_dir=str(tmp / "tokenizer"))
    return TranslationDataModule(**{**settings, **overrides})


def tiny_module(
    data: TranslationDataModule | None = None,
    config: dict | None = None,
    module: type[TranslationModule] = TranslationModule,
    **overrides,
) -> TranslationModule:
    """A `TINY_MODEL` training module (`config`: more TransformerConfig fields), a `TranslationModule` or a subclass of
    it (`module`); given `data`, with its tokenizer."""
    tokenizer = data.tokenizer if data is not None else None
    return module(tokenizer=tokenizer, config={**TINY_MODEL, **(config or {})}, **overrides)


SOURCE_LENGTH = 9


def copy_task_batch(size: int, vocab_size: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    """Random sources of 2-8 tokens plus </s> (id 2), right-padded with <pad> (id 0); the target is the source."""
    lengths = torch.randint(2, SOURCE_LENGTH, (size,), generator=generator)
    positions = torch.arange(SOURCE_LENGTH)
    tokens = torch.randint(3, vocab_size, (size, SOURCE_LENGTH), generator=generator)
    source = torch.where(positions < lengths[:, None], tokens, 0)
    source[torch.arange(size), lengths] = 2
    attention_mask = (positions <= lengths[:, None]).long()
    return source, attention_mask, source.masked_fill(attention_mask == 0, -100)


def trained_model(config: TransformerConfig, steps: int = 60) -> TransformerForConditionalGeneration:
    """A model trained for a few steps to copy its input: its outputs vary from token to token and from row to row,
    and end with </s> at different lengths, so generation exercises finished beams and padding (a freshly initialised
    model repeats one token until max_length)."""
    model = TransformerForConditionalGeneration(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        source, attention_mask, labels = copy_task_batch(32, config.vocab_size, generator)
        loss = model(input_ids=source, attention_mask=attention_mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def copying_model(**overrides) -> TransformerForConditionalGeneration:
    """A `trained_model` of the tiny config (with `overrides`), in float64 so that two orders of the same sums give the
    same search (no near ties within float64 rounding)."""
    config = TransformerConfig(**{**make_tiny_config().to_dict(), **overrides})
    return trained_model(config).double()


def padded_sources(size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded sources of the copy task, of different lengths: input ids and attention mask."""
    source, attention_mask, _ = copy_task_batch(size, 64, torch.Generator().manual_seed(seed))
    return source.masked_fill(attention_mask == 0, 0), attention_mask


def parts_only_at_near_ties(
    model: TransformerForConditionalGeneration,
    source: list[int],
    ours: list[int],
    theirs: list[int],
    tolerance: float = 1e-3,
) -> bool:
    """True when two greedy decodings of `source` (token ids from the decoder start on) are equal, or first differ
    where `model` gives both tokens log-probabilities within `tolerance` of each other. Another library or another
    batch computes the same model in another summation order: where the best two next tokens score within that
    rounding, either may win, and all that follows differs. Greedy decoding guarantees nothing more."""
    common = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), None)
    if common is None:
        return len(ours) == len(theirs)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([source]), decoder_input_ids=torch.tensor([ours[:common]])).logits
    log_probs = logits[0, -1].log_softmax(-1)
    return abs(float(log_probs[ours[common]] - log_probs[theirs[common]])) < tolerance


def output_rows(generated: torch.Tensor, eos_token_id: int) -> list[list[int]]:
    """The rows of a `generate()` output without the padding after each row's EOS."""
    rows = []
    for row in generated.tolist():
        rows.append(row[: row.index(eos_token_id, 1) + 1] if eos_token_id in row[1:] else row)
    return rows


def equal_fraction(first: list, second: list) -> float:
    """The fraction of positions where two lists of outputs agree."""
    return sum(a == b for a, b in zip(first, second, strict=True)) / len(first)


def multi30k_dir() -> str:
    """The Multi30k folder from MULTI30K_DIR, or skip the test saying how to enable it."""
    path = os.environ.get("MULTI30K_DIR")
    if not path or not os.path.isdir(path):
        pytest.skip(
            "set MULTI30K_DIR to a folder of Multi30k's files ({train,val,test_2016_flickr}.{en,de}[.gz], from "
            "github.com/multi30k/dataset, data/task1/raw) to run this test"
        )
    return path


# A model small enough for a few seconds of training, with checkpoints every 3 steps.
TINY_RUN = """
checkpoint:
  every_n_train_steps: 3
trainer:
  enable_model_summary: false
  num_sanity_val_steps: 0
  limit_val_batches: 1
model:
  config:
    d_model: 32
    encoder_layers: 1
    decoder_layers: 1
    encoder_attention_heads: 2
    decoder_attention_heads: 2
    encoder_ffn_dim: 64
    decoder_ffn_dim: 64
    max_position_embeddings: 128
  generation:
    num_beams: 2
data:
  bpe_vocab_size: 120
  synthetic_train_size: 400
  synthetic_eval_size: 16
  max_tokens: 256
"""


@pytest.fixture
def run_dir(tmp_path, monkeypatch) -> Path:
    """Runs write `runs/demo/...` relative to the working directory: keep them in the test's folder."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.yaml").write_text(TINY_RUN)
    return tmp_path


REMOTE_LOAD = textwrap.dedent(
    """
    import sys
    sys.modules["hf_transformer"] = None  # as if this package were not installed
    import torch
    from transformers import AutoModelForSeq2SeqLM
    folder, inputs_path, outputs_path = sys.argv[1:]
    inputs = torch.load(inputs_path)
    model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).to(inputs["dtype"]).eval()
    assert type(model).__module__.startswith("transformers_modules."), type(model).__module__
    with torch.no_grad():
        logits = model(input_ids=inputs["source"], decoder_input_ids=inputs["target"]).logits
        asked = dict(output_attentions=True, output_hidden_states=True)
        outputs = model(input_ids=inputs["source"], decoder_input_ids=inputs["target"], **asked)
    recorded = {name: torch.stack(getattr(outputs, name)) for name in RECORDED}
    beams = model.generate(inputs["source"], max_new_tokens=5)
    # The decoder alone continues from a cache passed by either name (renamed `cache` in transformers 5.24).
    decoder, encoded = model.get_decoder(), model.get_encoder()(inputs["source"]).last_hidden_state
    continued = {}
    with torch.no_grad():
        for name in ("past_key_values", "cache"):
            first = decoder(inputs["target"][:, :-2], encoder_hidden_states=encoded, use_cache=True).to_tuple()
            continued[name] = decoder(inputs["target"][:, -2:], encoder_hidden_states=encoded, **{name: first[1]})[0]
        last_two = decoder(inputs["target"], encoder_hidden_states=encoded)[0][:, -2:]
    saved = {"logits": logits, "recorded": recorded, "beams": beams, "continued": continued, "last_two": last_two}
    torch.save(saved, outputs_path)
    """
)
# What `capture_outputs` records when `output_attentions` and `output_hidden_states` ask.
RECORDED = (
    "encoder_hidden_states",
    "encoder_attentions",
    "decoder_hidden_states",
    "decoder_attentions",
    "cross_attentions",
)


def load_without_the_package(
    folder: Path,
    source: torch.Tensor,
    target: torch.Tensor,
    pythonpath: str = "",
    expect_failure: bool = False,
    dtype: torch.dtype = torch.float32,
) -> dict[str, torch.Tensor] | str:
    """Load a saved folder with `trust_remote_code=True` in a fresh interpreter where `hf_transformer` cannot be
    imported (`pythonpath` first on its path, e.g. another transformers release), cast to `dtype`, and return its
    logits for (source, target), the hidden states and attention weights it records for them (`recorded`: `RECORDED`,
    each stacked over the layers), its beam search output for source, and its decoder's last two outputs of target,
    from one pass (`last_two`) and continued from a cache passed by each name (`continued`); with `expect_failure`, the
    error output instead."""
    work = Path(folder).parent
    torch.save({"source": source, "target": target, "dtype": dtype}, work / "inputs.pt")
    (work / "load.py").write_text(f"RECORDED = {RECORDED!r}\n{REMOTE_LOAD}")
    result = subprocess.run(
        [sys.executable, str(work / "load.py"), str(folder), str(work / "inputs.pt"), str(work / "outputs.pt")],
        cwd=work,
        env={**os.environ, "PYTHONPATH": pythonpath, "HF_MODULES_CACHE": str(work / "modules-cache")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    if expect_failure:
        assert result.returncode != 0, "loading was expected to fail"
        return result.stderr
    assert result.returncode == 0, result.stderr[-3000:]
    return torch.load(work / "outputs.pt")


def assert_continues_under_both_cache_names(remote: dict) -> None:
    """The remote-loaded decoder's outputs continued from a cache (`load_without_the_package`) equal one pass's, with
    the cache passed by its name before transformers 5.24 (`past_key_values`) and after (`cache`)."""
    assert set(remote["continued"]) == {"past_key_values", "cache"}
    for name, continued in remote["continued"].items():
        torch.testing.assert_close(continued, remote["last_two"], atol=1e-5, rtol=0, msg=name)


def word_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """One token per id (<pad> 0, <s> 1, </s> 2, <unk> 3, then w4, w5, ...), appending </s>: ids and text convert
    into each other exactly, so the copy task's token sequences can go through text."""
    vocab = {token: index for index, token in enumerate(["<pad>", "<s>", "</s>", "<unk>"])}
    vocab.update({f"w{index}": index for index in range(4, vocab_size)})
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def write_checkpoint(model: TransformerForConditionalGeneration, tokenizer, path: Path) -> Path:
    """`model` and `tokenizer` at `path` as training writes a checkpoint (weights, config, tokenizer)."""
    torch.save(
        {
            "state_dict": {f"model.{name}": tensor for name, tensor in model.state_dict().items()},
            "hf_config": model.config.to_dict(),
            "generation_config": model.generation_config.to_dict(),
            "tokenizer": tokenizer_state(tokenizer),
            "global_step": 1,
        },
        path,
    )
    return path
