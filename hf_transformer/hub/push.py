"""Share a model folder on the Hugging Face Hub: `push_folder` uploads a folder written by `hf-transformer export` (or
`save_pretrained`) as one commit (and its model card's pinned revision as a second), with errors that say what went
wrong and how to fix it, never containing the token."""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path

from huggingface_hub import CommitInfo, HfApi, get_token
from huggingface_hub.errors import HfHubHTTPError, HFValidationError, OfflineModeIsEnabled

# Connection errors come out of huggingface_hub as raw errors of its HTTP client (httpx, httpx2 since version 2);
# `errors.HTTPError` re-exports that client's base error class, whichever it is.
from huggingface_hub.errors import HTTPError as TransportError
from huggingface_hub.utils import validate_repo_id

from ..errors import HubError
from ..model_folder import TOKENIZER_FILES

logger = logging.getLogger(__name__)

WEIGHTS_INDEX = "model.safetensors.index.json"


def push_folder(
    folder: str | Path,
    repo_id: str,
    *,
    private: bool = False,
    revision: str | None = None,
    commit_message: str | None = None,
    create_pr: bool = False,
    token: str | None = None,
) -> CommitInfo:
    """Upload an exported model folder to `repo_id` as one commit and return its `CommitInfo`; where the folder's
    model card loads the model's own code, a second commit pins the first in the card's usage snippet.

    `CommitInfo` is a `str` (the commit URL) with `.oid` (the commit sha) and `.pr_url`. The repo is created if
    needed (`private` only applies then). `revision` names a branch, created from `main` if missing, or an open
    pull request (`refs/pr/N`) to add a commit to; `create_pr` opens a pull request against `main` instead of
    committing to it. The token defaults to `HF_TOKEN` or the one saved by `hf auth login`. The folder is only read.
    """
    folder = Path(folder)
    check_repo_id(repo_id)
    check_export_folder(folder)
    if create_pr and revision not in (None, "main"):
        raise HubError(f"create_pr=True opens a pull request against 'main': drop revision={revision!r}.")
    api = HfApi(token=token or find_token())
    message = commit_message or f"Upload {folder.name} with hf-transformer"
    logger.info("Pushing %s to %s/%s", folder, api.endpoint, repo_id)
    try:
        api.create_repo(repo_id, private=private, exist_ok=True)
        if revision not in (None, "main") and not revision.startswith("refs/pr/"):
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        commit = api.upload_folder(
            folder_path=folder, repo_id=repo_id, revision=revision, commit_message=message, create_pr=create_pr
        )
        _pin_card_snippet(api, folder, repo_id, commit, revision)
    except HfHubHTTPError as err:
        raise HubError(_explain_http_error(err, api, repo_id)) from err
    except OfflineModeIsEnabled as err:
        raise HubError(f"Cannot push {repo_id}: HF_HUB_OFFLINE is set. Unset it and re-run the push.") from err
    except TransportError as err:
        raise HubError(
            f"Could not reach the Hub at {api.endpoint} while pushing {folder} to {repo_id} "
            f"({type(err).__name__}: {err}). The local folder is intact; re-run the push when the Hub is reachable "
            "(files already on the Hub are skipped)."
        ) from err
    logger.info("Pushed %s as %s", folder, commit.pr_url or commit)
    return commit


def _pin_card_snippet(api: HfApi, folder: Path, repo_id: str, commit: CommitInfo, branch: str | None) -> None:
    """Pin the commit just made in the usage snippet of the folder's model card, by a second commit that changes the
    card alone, where the card loads the model's own code (trust_remote_code): transformers warns of every code file
    it downloads without a pinned revision ("make sure to double-check they do not contain any added malicious
    code"), six of them, and a pinned commit runs the code that was pushed with these weights whatever is pushed
    later. A folder without the card's facts (`save_pretrained`) or holding a stock Marian model is left as it is."""
    from ..hub.model_card import CARD_FACTS, CARD_NAME, rewrite_model_card

    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    if not (folder / CARD_FACTS).is_file() or "auto_map" not in config:
        return
    with tempfile.TemporaryDirectory(prefix="hf-transformer-card-") as card_folder:
        rewrite_model_card(folder, card_folder, format="hf-transformer", repo_id=repo_id, revision=commit.oid)
        api.upload_file(
            path_or_fileobj=Path(card_folder) / CARD_NAME,
            path_in_repo=CARD_NAME,
            repo_id=repo_id,
            revision=commit.pr_revision or branch,
            commit_message=f"Model card: pin the code revision {commit.oid[:12]} in the usage snippet",
        )


def check_repo_id(repo_id: str) -> None:
    """Refuse anything but `namespace/name`, before any network call."""
    problem = None if repo_id.count("/") == 1 else "it must have exactly one '/'"
    if problem is None:
        try:
            validate_repo_id(repo_id)
        except HFValidationError as err:
            problem = str(err)
    if problem:
        raise HubError(
            f"Invalid repo id {repo_id!r}: expected 'namespace/name' (for example 'alice/transformer-de-en'), "
            f"made of letters, digits, '-', '_' and '.'; {problem}"
        )


def check_export_folder(folder: Path, tokenizer: bool = False) -> None:
    """Refuse a folder that does not hold what loading it needs: `config.json`, safetensors weights and, with
    `tokenizer` (a translation model), the tokenizer files, which an export cut short by a kill lacked."""
    if not folder.is_dir():
        raise HubError(f"Cannot push {folder}: it is not a folder. Pass the folder written by the model export.")
    missing = []
    config = folder / "config.json"
    if not config.is_file():
        missing.append("config.json")
    else:
        try:
            json.loads(config.read_text(encoding="utf-8"))
        except ValueError as err:
            raise HubError(f"Cannot push {folder}: config.json is not valid JSON ({err}).") from err
    missing += _missing_weights(folder)
    if tokenizer:
        missing += [name for name in TOKENIZER_FILES if not (folder / name).is_file()]
    if missing:
        raise HubError(
            f"Cannot push {folder}: it does not look like an exported model, missing {', '.join(missing)}. "
            "Export it again (hf-transformer export CHECKPOINT FOLDER writes all of these; or save_pretrained the "
            "model and its tokenizer), then push."
        )


def _missing_weights(folder: Path) -> list[str]:
    index = folder / WEIGHTS_INDEX
    if index.is_file():
        shards = set(json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}).values())
        return sorted(shard for shard in shards if not (folder / shard).is_file())
    if any(folder.glob("*.safetensors")):
        return []
    return ["weights (model.safetensors or a sharded model-*.safetensors set with its index)"]


def find_token() -> str:
    token = get_token()
    if token is None:
        raise HubError("No Hugging Face token found: set HF_TOKEN or run `hf auth login`")
    return token


def _explain_http_error(err: HfHubHTTPError, api: HfApi, repo_id: str) -> str:
    status = err.response.status_code if err.response is not None else None
    if status == 401:
        return (
            f"The Hub at {api.endpoint} rejected the token (401). Set HF_TOKEN to a valid write token "
            "or run `hf auth login`, then re-run the push."
        )
    if status == 403:
        namespace, name = repo_id.split("/")
        user = _user_name(api)
        return (
            f"User {user!r} may not write to {repo_id!r} (403): it belongs to {namespace!r}. "
            f"Push to your own namespace (e.g. '{user}/{name}') or ask {namespace!r} for write access."
        )
    return f"Pushing to {repo_id!r} on {api.endpoint} failed: {err.server_message or err}"


def _user_name(api: HfApi) -> str:
    """The token's user, for error messages; '<your user>' when the Hub cannot say."""
    try:
        return api.whoami()["name"]
    except (HfHubHTTPError, TransportError, KeyError):
        return "<your user>"
