"""The "hf-transformer" format, and model folders as users receive them: whole (written beside and renamed into
place), readable by whoever the umask allows, refused with the fix where a file is missing or wrong."""

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from huggingface_hub.errors import StrictDataclassError
from transformers import GenerationConfig, PreTrainedTokenizerFast

from ..errors import ConfigError, DataError, DiskFull, UserError, is_disk_full
from ..hub.model_card import FormatCard
from ..model import TransformerConfig, TransformerForConditionalGeneration

# What `PreTrainedTokenizerFast.from_pretrained` reads: the tokenizer itself, and its class and special tokens (without
# tokenizer_config.json it loads with no <pad> or </s>).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


# What the model card of an "hf-transformer" folder says of its format (`ExportFormat.card`).
HF_TRANSFORMER_CARD = FormatCard(
    # The Hub shows that loading runs the repository's code.
    tags=("custom_code",),
    requirement_note="; older releases stop with a message saying so",
    usage="""\
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline

model_id = {{ model_id | tojson }}
{% if revision -%}
revision = {{ revision | tojson }}  # the commit that pushed this model: its code is the code that runs
# The model's code (modeling_transformer.py and friends) comes with the weights: trust_remote_code runs it.
tokenizer = AutoTokenizer.from_pretrained(model_id, revision=revision, trust_remote_code=True)
model = AutoModelForSeq2SeqLM.from_pretrained(model_id, revision=revision, trust_remote_code=True)
{%- else -%}
# The model's code (modeling_transformer.py and friends) comes with the weights: trust_remote_code runs it.
tokenizer = AutoTokenizer.from_pretrained(model_id, trust_remote_code=True)
model = AutoModelForSeq2SeqLM.from_pretrained(model_id, trust_remote_code=True)
{%- endif %}

inputs = tokenizer([{{ example | tojson }}], return_tensors="pt", padding=True)
output_ids = model.generate(**inputs)  # the decoding settings come from generation_config.json
print(tokenizer.batch_decode(output_ids, skip_special_tokens=True))

translator = pipeline("translation", model=model_id, {% if revision %}revision=revision, {% endif -%}
trust_remote_code=True)
print(translator([{{ example | tojson }}]))""",
    after_usage="`trust_remote_code=True` runs the Python files of this repository (`configuration_transformer.py`, "
    "`modeling_transformer.py` and the files they import): the model written in plain PyTorch, which imports only "
    "torch, transformers and each other, reads no file but the weights and opens no connection. Read them before you "
    "run them, as any code. {% if revision %}`revision` pins the commit that pushed them: a later push to this "
    "repository, of other code included, does not change what the snippet runs, and transformers does not warn of "
    "new code files.{% else %}Pinning a `revision` (a commit of the repository) makes a later push, of other code "
    "included, leave what the snippet runs unchanged.{% endif %}\n\n"
    "With the `hf_transformer` package installed, its own classes load the model without remote code: "
    "`hf_transformer.TransformerForConditionalGeneration.from_pretrained(model_id)`; importing them also registers "
    "the model with the Auto classes (`AutoModelForSeq2SeqLM.from_pretrained(model_id)` then needs no "
    '`trust_remote_code`, nor `pipeline("translation", model=model_id, '
    "pipeline_class=hf_transformer.TranslationPipeline)`). To fine-tune it with hf-transformer: `hf-transformer fit "
    "--config ... --model.init_from {{ model_id }} --data.tokenizer {{ model_id }}`.",
)


def save_model(
    model: TransformerForConditionalGeneration,
    tokenizer: PreTrainedTokenizerFast,
    folder: str | Path,
    int8: bool = False,
) -> Path:
    """The "hf-transformer" format: the model with its code (`auto_map`), the tokenizer, the generation config and
    the translation pipeline, as `save_pretrained` writes them. With `int8`, the generation config asks this package's
    `translate` and `serve` to decode with int8 weights (`decoding.int8`); the weights are saved in float32 still, so
    that any tool loads them."""
    from ..decoding.int8 import INT8_KEY
    from ..model import TranslationPipeline  # imports transformers' pipelines: seconds, only where a folder is saved

    saved = model.generation_config
    if int8:
        # A config marked as derived from the model's config loads without the fields it does not know: this one is
        # the model's own.
        settings = {name: value for name, value in saved.to_dict().items() if name != "_from_model_config"}
        model.generation_config = GenerationConfig(**settings, **{INT8_KEY: True})
    try:
        TranslationPipeline(model=model, tokenizer=tokenizer).save_pretrained(folder)
    finally:
        model.generation_config = saved
    return Path(folder)


@contextmanager
def written_whole(folder: str | Path, keep_other_files: bool = False) -> Iterator[Path]:
    """A new hidden folder beside `folder` to write into, put in the place of `folder` when the block ends: a kill or
    an error midway leaves `folder` as it was (and the hidden folder after a kill), never half written; a full disk is
    a `DiskFull` that names the folder. With `keep_other_files`, the files of an existing `folder` that the block did
    not write are kept."""
    folder = Path(folder).resolve()
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", suffix=".tmp", dir=folder.parent))
    except OSError as err:
        raise UserError(f"cannot write into {folder.parent} ({err.strerror}): give a folder you can write to") from err
    staging.chmod(umask_mode(0o777))  # mkdtemp makes it private to the user; a model folder is not
    try:
        yield staging
        if folder.is_dir():
            if keep_other_files:
                shutil.copytree(folder, staging, dirs_exist_ok=True, copy_function=_link_if_new)
            # A folder cannot be renamed over a full one: move the old one aside first (the two renames take
            # microseconds; a kill between them leaves the old folder under the hidden name).
            old = tempfile.mkdtemp(prefix=f".{folder.name}-old-", suffix=".tmp", dir=folder.parent)
            os.replace(folder, old)
            os.replace(staging, folder)
            shutil.rmtree(old)
        else:
            os.replace(staging, folder)
    except Exception as err:
        if not is_disk_full(err):
            raise
        # Each writer says it in its own way (safetensors: "os error 28" in its message), and none names the folder.
        shutil.rmtree(staging, ignore_errors=True)
        free = shutil.disk_usage(folder.parent).free / 2**20
        raise DiskFull(
            f"no space left on the disk of {folder.parent} while writing {folder.name} ({free:,.0f} MiB free there): "
            f"{folder} is as it was before. Free space there, or export to another disk"
        ) from err
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _link_if_new(src: str, dst: str) -> str:
    """`link_or_copy` for a file that the new folder has none of under that name."""
    return dst if os.path.lexists(dst) else link_or_copy(src, dst)


def link_or_copy(src: str, dst: str) -> str:
    """A hard link of `src` at `dst` (model weights can be large), or a copy where links cannot be made."""
    try:
        os.link(src, dst, follow_symlinks=False)
        return dst
    except OSError:  # another file system, or links not allowed
        return shutil.copy2(src, dst, follow_symlinks=False)


def umask_mode(mode: int = 0o666) -> int:
    """The permissions the user's umask gives a new file (`mode` 0o666) or folder (0o777)."""
    umask = os.umask(0)
    os.umask(umask)
    return mode & ~umask


def make_shareable(folder: Path) -> None:
    """Give every file the permissions the user's umask gives new files: safetensors writes its files readable by
    their owner only (-rw-------), which breaks a folder shared with a team or served by another user."""
    mode = umask_mode()
    for path in folder.iterdir():
        if path.is_file():
            path.chmod(mode)


def saved_config(name_or_path: str | Path) -> TransformerConfig:
    """`TransformerConfig.from_pretrained`, with a field of the wrong type in config.json (`"d_model": "256"`) named as
    one line, with the file and the fix."""
    try:
        return TransformerConfig.from_pretrained(name_or_path)
    except StrictDataclassError as error:
        raise ConfigError(
            f"{name_or_path}/config.json: {error.__cause__ or error}. Fix that field in the file (or export the model "
            "again)"
        ) from error


def check_model_folder(folder: str | Path) -> None:
    """Refuse, before anything is written, a model folder that cannot be converted: a config.json field of the wrong
    type, or no tokenizer (a conversion would write a model that no one can feed)."""
    saved_config(folder)
    check_tokenizer_files(folder)


def check_tokenizer_files(folder: str | Path) -> None:
    """Refuse a model folder without its tokenizer files, saying how to put them back (transformers' own error asks
    for sentencepiece or tiktoken, which would not help)."""
    folder = Path(folder)
    missing = [name for name in TOKENIZER_FILES if not (folder / name).is_file()]
    if missing:
        raise DataError(
            f"{folder} has no {' or '.join(missing)}: a model folder needs the tokenizer it was trained with. Export "
            "it again from its checkpoint (hf-transformer export CHECKPOINT FOLDER, which writes the tokenizer), or "
            f"copy the run's tokenizer files ({', '.join(TOKENIZER_FILES)}; the run summary names their folder) into "
            f"{folder}"
        )
