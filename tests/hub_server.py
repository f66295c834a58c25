"""An in-process fake of the Hugging Face Hub HTTP API, for tests, and the `hub_endpoint` fixture that serves it.

The server (stdlib `ThreadingHTTPServer`, bound to 127.0.0.1 on a free port) keeps repos in memory and answers the
routes that `huggingface_hub` 2.4 and `transformers` use to push and load a model:

    GET  /api/whoami-v2                                  token check
    GET  /api/agent-harnesses                            empty registry (the client fetches it once per process)
    POST /api/validate-yaml                              README metadata check made by `upload_folder`
    POST /api/repos/create                               409 when the repo exists (`exist_ok` relies on it)
    GET  /api/models/{repo}[/revision/{rev}]             model info: `sha`, `siblings`, ...
    GET  /api/models/{repo}/tree/{rev}[/{path}]          file listing (always recursive, files only)
    GET  /api/models/{repo}/refs                         branches, tags, PR refs (`?include_prs=1`)
    POST /api/models/{repo}/branch/{branch}              409 when the branch exists
    POST /api/models/{repo}/preupload/{rev}              every file is "regular": no LFS, no Xet
    POST /api/models/{repo}/commit/{rev}                 NDJSON, files inline in base64; `?create_pr=1`
    POST /api/models/{repo}/discussions                  pull requests only (the Xet upload path opens PRs so)
    GET  /api/models/{repo}/discussions/{num}
    HEAD/GET /{repo}/resolve/{rev}/{path}                `X-Repo-Commit`, `ETag` (git blob id), `Content-Length`

Errors carry the `X-Error-Code` / `X-Error-Message` headers that `huggingface_hub.utils.hf_raise_for_status` maps to
`RepositoryNotFoundError`, `RevisionNotFoundError` and `EntryNotFoundError`. Writes need a known bearer token (401
otherwise) and the token's user must own the repo's namespace (403 otherwise), except that anyone who can read a repo
may open a pull request on it, as on the real Hub. Each commit gets a new random 40-hex sha and keeps a full snapshot,
so older commits stay loadable by sha and by branch. The server answers HTTP/1.0 (one connection per request), so a
stopped server refuses the next request instead of serving it on a pooled keep-alive connection.

What huggingface_hub 2.4 reads once, at import (`huggingface_hub/constants.py`), and what it reads per call:

- Import time: `HF_ENDPOINT` (`constants.ENDPOINT` and the resolve URL template `HUGGINGFACE_CO_URL_TEMPLATE`),
  `HF_HOME` (and the paths derived from it: token file, agent-harness registry file), `HF_HUB_CACHE`,
  `HF_TOKEN_PATH`, `HF_HUB_OFFLINE` (`constants.is_offline_mode()` returns the cached value), `HF_HUB_DISABLE_XET`,
  `HF_XET_CACHE`. The module-level `huggingface_hub.hf_api.api` (behind top-level functions such as
  `huggingface_hub.model_info`) keeps the endpoint it was built with, as does every `HfApi()` built before a change.
  Setting these variables after `import huggingface_hub` has no effect, so the fixture patches the constants and
  `api.endpoint` too; transformers reads the same constants at call time. A subprocess started with the fixture's
  `os.environ` needs nothing more. (`utils._http._HUB_ORIGINS`, also from import time, only matters for redirects,
  which this server never sends.)
- Per call: `HF_TOKEN` (`get_token()` reads `os.environ` each time).

Xet: `hf_xet` is a hard dependency of huggingface_hub 2.4, and with it installed `upload_folder` takes a pipelined
path that opens pull requests through `/discussions` and retries a failed commit for about 20 s. The server never
advertises Xet: no `X-Xet-*` headers on resolve (so downloads are plain HTTP GETs) and "regular" for every file at
preupload (so nothing goes through Xet or LFS; the client never insists on LFS for .safetensors, it follows the
server's answer). The fixture also sets `HF_HUB_DISABLE_XET=1` (and patches the constant), which makes `upload_folder`
use the single `create_commit` path; a test may flip `constants.HF_HUB_DISABLE_XET` back to cover the pipelined path.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

ALICE_TOKEN = "hf_fake_alice_0123456789"
BOB_TOKEN = "hf_fake_bob_0123456789"
TOKENS = {ALICE_TOKEN: "alice", BOB_TOKEN: "bob"}
GITATTRIBUTES = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"


def git_blob_id(data: bytes) -> str:
    """The git object id of a file: what the Hub sends as `ETag` and what the client compares for no-op uploads."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")


@dataclass
class Commit:
    files: dict[str, bytes]
    message: str
    date: str = field(default_factory=_now)


@dataclass
class Repo:
    owner: str
    private: bool
    commits: dict[str, Commit] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)  # full ref name ("refs/heads/main", "refs/pr/1") -> sha
    pull_requests: dict[int, dict[str, str]] = field(default_factory=dict)

    def resolve(self, revision: str) -> str | None:
        """Sha of a commit sha, branch, tag or full ref name; None when unknown."""
        if revision in self.commits:
            return revision
        for ref in (revision, f"refs/heads/{revision}", f"refs/tags/{revision}"):
            if ref in self.refs:
                return self.refs[ref]
        return None

    def add_commit(self, parent: str | None, changes: dict[str, bytes], message: str) -> str:
        files = dict(self.commits[parent].files) if parent else {}
        files.update(changes)
        sha = secrets.token_hex(20)
        self.commits[sha] = Commit(files, message)
        return sha

    def open_pull_request(self, title: str, author: str, sha: str) -> int:
        num = len(self.pull_requests) + 1
        self.pull_requests[num] = {"title": title, "author": author, "createdAt": _now()}
        self.refs[f"refs/pr/{num}"] = sha
        return num


class HubHTTPError(Exception):
    """Turned into an error response; `code` goes to `X-Error-Code`, the message to `X-Error-Message`."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        body: dict[str, Any] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code
        self.headers, self.body = headers or {}, body or {}


class FakeHub:
    """The in-memory Hub: users by token, repos by id, and the HTTP server that exposes them."""

    def __init__(self) -> None:
        self.tokens = dict(TOKENS)
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request, for assertions
        self.drop_commits = False  # when set, commit requests get their connection closed without a response
        self.lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def token_for(self, user: str) -> str:
        return next(token for token, name in self.tokens.items() if name == user)

    @property
    def url(self) -> str:
        assert self._server is not None, "server not started"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeHub:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.hub = self  # type: ignore[attr-defined]
        # A short poll interval keeps `stop()`, hence every test's teardown, fast.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, name="fake-hub", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and free the port: later requests fail with a connection error."""
        if self._thread is not None and self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join()
            self._thread = None

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    server: Any  # the ThreadingHTTPServer, which carries `.hub`

    # --------------------------------------------------------------- plumbing

    @property
    def hub(self) -> FakeHub:
        return self.server.hub

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output clean; `FakeHub.requests` records the traffic

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def _dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        self.query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        self.hub.requests.append((method, url.path))
        for route_method, pattern, handler in _ROUTES:
            match = pattern.fullmatch(url.path)
            if match and method in route_method.split("|"):
                args = {k: unquote(v) for k, v in match.groupdict().items() if v is not None}
                try:
                    with self.hub.lock:
                        handler(self, **args)
                except HubHTTPError as err:
                    self._send_error(err)
                return
        self._send_error(HubHTTPError(404, f"No route for {method} {url.path}"))

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _json_body(self) -> dict[str, Any]:
        return json.loads(self._body() or b"{}")

    def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send_json(self, data: Any, status: int = 200) -> None:
        self._send(status, json.dumps(data).encode(), {"Content-Type": "application/json"})

    def _send_error(self, err: HubHTTPError) -> None:
        headers = {"Content-Type": "application/json", "X-Error-Message": err.message, **err.headers}
        if err.code:
            headers["X-Error-Code"] = err.code
        self._send(err.status, json.dumps({"error": err.message, **err.body}).encode(), headers)

    # --------------------------------------------------------------- auth and lookups

    def _user(self) -> str | None:
        """The token's user; None without a token, 401 for a token the hub does not know."""
        auth = self.headers.get("Authorization")
        if auth is None:
            return None
        user = self.hub.tokens.get(auth.removeprefix("Bearer ").strip())
        if user is None:
            raise HubHTTPError(401, "Invalid credentials in Authorization header")
        return user

    def _require_user(self) -> str:
        user = self._user()
        if user is None:
            raise HubHTTPError(401, "You must be authenticated to write to the Hub: pass a token")
        return user

    def _readable_repo(self, repo_id: str) -> Repo:
        repo = self.hub.repos.get(repo_id)
        if repo is None or (repo.private and self._user() != repo.owner):
            raise HubHTTPError(404, "Repository not found", code="RepoNotFound")
        return repo

    def _writable_repo(self, repo_id: str, create_pr: bool = False) -> tuple[str, Repo]:
        """Writes need the namespace's owner; opening a pull request only needs read access."""
        user = self._require_user()
        repo = self._readable_repo(repo_id)
        if repo.owner != user and not create_pr:
            raise HubHTTPError(403, f"User '{user}' has no write access to '{repo_id}'")
        return user, repo

    def _sha(self, repo: Repo, revision: str) -> str:
        sha = repo.resolve(revision)
        if sha is None:
            raise HubHTTPError(404, f"Invalid rev id: {revision}", code="RevisionNotFound")
        return sha

    def _branch_ref(self, repo: Repo, revision: str) -> str:
        """The full ref a commit to `revision` moves: a branch name or a `refs/pr/N` ref."""
        ref = revision if revision.startswith("refs/") else f"refs/heads/{revision}"
        if ref not in repo.refs:
            raise HubHTTPError(404, f"Invalid rev id: {revision}", code="RevisionNotFound")
        return ref

    # --------------------------------------------------------------- routes

    def whoami(self) -> None:
        user = self._require_user()
        token = {"displayName": "fake", "role": "write"}
        self._send_json(
            {"type": "user", "name": user, "orgs": [], "auth": {"type": "access_token", "accessToken": token}}
        )

    def agent_harnesses(self) -> None:
        self._send_json({"standardEnvVars": [], "harnesses": {}})

    def validate_yaml(self) -> None:
        self._body()
        self._send_json({"errors": [], "warnings": []})

    def create_repo(self) -> None:
        user = self._require_user()
        payload = self._json_body()
        namespace = payload.get("organization") or user
        repo_id = f"{namespace}/{payload['name']}"
        if namespace != user:
            raise HubHTTPError(403, f"You don't have the rights to create a model under the namespace '{namespace}'")
        if repo_id in self.hub.repos:
            # `create_repo(exist_ok=True)` reads the repo URL from this 409 body
            raise HubHTTPError(409, "You already created this model repo", body={"url": f"{self.hub.url}/{repo_id}"})
        repo = Repo(owner=user, private=payload.get("visibility") == "private" or bool(payload.get("private")))
        repo.refs["refs/heads/main"] = repo.add_commit(None, {".gitattributes": GITATTRIBUTES}, "initial commit")
        self.hub.repos[repo_id] = repo
        self._send_json({"url": f"{self.hub.url}/{repo_id}", "name": repo_id, "id": repo_id})

    def model_info(self, repo: str, rev: str = "main") -> None:
        record = self._readable_repo(repo)
        sha = self._sha(record, rev)
        commit = record.commits[sha]
        with_blobs = self.query.get("blobs", "").lower() == "true"
        siblings = [
            {"rfilename": path, **({"size": len(data), "blobId": git_blob_id(data)} if with_blobs else {})}
            for path, data in sorted(commit.files.items())
        ]
        info = {"id": repo, "modelId": repo, "author": record.owner, "sha": sha, "private": record.private}
        self._send_json(
            {**info, "gated": False, "disabled": False, "lastModified": commit.date, "tags": [], "siblings": siblings}
        )

    def tree(self, repo: str, rev: str, path: str = "") -> None:
        record = self._readable_repo(repo)
        files = record.commits[self._sha(record, rev)].files
        prefix = f"{path.strip('/')}/" if path.strip("/") else ""
        self._send_json(
            [
                {"type": "file", "oid": git_blob_id(data), "size": len(data), "path": name}
                for name, data in sorted(files.items())
                if name.startswith(prefix)
            ]
        )

    def refs(self, repo: str) -> None:
        record = self._readable_repo(repo)

        def listed(prefix: str) -> list[dict[str, str]]:
            return [
                {"name": ref.removeprefix(prefix), "ref": ref, "targetCommit": sha}
                for ref, sha in sorted(record.refs.items())
                if ref.startswith(prefix)
            ]

        refs = {"branches": listed("refs/heads/"), "converts": [], "tags": listed("refs/tags/")}
        if self.query.get("include_prs"):
            refs["pullRequests"] = listed("refs/pr/")
        self._send_json(refs)

    def create_branch(self, repo: str, branch: str) -> None:
        _, record = self._writable_repo(repo)
        start = self._sha(record, self._json_body().get("startingPoint") or "main")
        if f"refs/heads/{branch}" in record.refs:
            raise HubHTTPError(409, f"Reference refs/heads/{branch} already exists")
        record.refs[f"refs/heads/{branch}"] = start
        self._send_json({})

    def preupload(self, repo: str, rev: str) -> None:
        _, record = self._writable_repo(repo, create_pr=bool(self.query.get("create_pr")))
        files = record.commits[self._sha(record, rev)].files
        answers = [
            {
                "path": item["path"],
                "uploadMode": "regular",  # never "lfs": the client then never talks LFS or Xet
                "shouldIgnore": False,
                "oid": git_blob_id(files[item["path"]]) if item["path"] in files else None,
            }
            for item in self._json_body()["files"]
        ]
        self._send_json({"files": answers, "commitOid": self._sha(record, rev)})

    def commit(self, repo: str, rev: str) -> None:
        create_pr = bool(self.query.get("create_pr"))
        user, record = self._writable_repo(repo, create_pr=create_pr)
        lines = [json.loads(line) for line in self._body().splitlines() if line.strip()]
        if self.hub.drop_commits:
            self.close_connection = True
            return  # no response at all: the client sees the connection drop mid-push
        ref = self._branch_ref(record, rev)
        header, changes = _parse_commit_lines(lines)
        sha = record.add_commit(record.refs[ref], changes, header["summary"])
        commit_url = f"{self.hub.url}/{repo}/commit/{sha}"
        if create_pr:
            num = record.open_pull_request(header["summary"], user, sha)
            pr_url = f"{self.hub.url}/{repo}/discussions/{num}"
            self._send_json({"success": True, "commitOid": sha, "commitUrl": commit_url, "pullRequestUrl": pr_url})
            return
        record.refs[ref] = sha
        self._send_json({"success": True, "commitOid": sha, "commitUrl": commit_url})

    def create_discussion(self, repo: str) -> None:
        user = self._require_user()
        record = self._readable_repo(repo)
        payload = self._json_body()
        if not payload.get("pullRequest"):
            raise HubHTTPError(400, "This fake hub only supports discussions that are pull requests")
        num = record.open_pull_request(payload["title"], user, record.refs["refs/heads/main"])
        self._send_json({"num": num, "pullRequest": True, "url": f"{self.hub.url}/{repo}/discussions/{num}"})

    def discussion(self, repo: str, num: str) -> None:
        record = self._readable_repo(repo)
        pr = record.pull_requests.get(int(num))
        if pr is None:
            raise HubHTTPError(404, f"Discussion {num} not found")
        self._send_json(
            {
                "num": int(num),
                "title": pr["title"],
                "author": {"name": pr["author"]},
                "createdAt": pr["createdAt"],
                "status": "open",
                "isPullRequest": True,
                "repo": {"name": repo, "type": "model"},
                "events": [],
                "changes": {"base": "refs/heads/main"},
                "filesWithConflicts": [],
                "diff": "",
            }
        )

    def resolve(self, repo: str, rev: str, path: str) -> None:
        record = self._readable_repo(repo)
        sha = self._sha(record, rev)
        data = record.commits[sha].files.get(path)
        if data is None:
            raise HubHTTPError(404, f"Entry not found: {path}", code="EntryNotFound", headers={"X-Repo-Commit": sha})
        headers = {
            "X-Repo-Commit": sha,
            "ETag": f'"{git_blob_id(data)}"',
            "Content-Type": "application/octet-stream",
            "Accept-Ranges": "none",
        }
        self._send(200, data, headers)


def _parse_commit_lines(lines: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, bytes]]:
    """Split the NDJSON commit payload into its header and the added files (inline base64 only)."""
    header, changes = {}, {}
    for line in lines:
        key, value = line["key"], line["value"]
        if key == "header":
            header = value
        elif key == "file" and value.get("encoding") == "base64":
            changes[value["path"]] = base64.b64decode(value["content"])
        else:
            raise HubHTTPError(400, f"Unsupported commit operation '{key}' (this fake hub takes inline files only)")
    return header, changes


_REPO = r"/api/models/(?P<repo>[^/]+/[^/]+)"
_ROUTES: list[tuple[str, re.Pattern[str], Callable[..., None]]] = [
    (method, re.compile(pattern), handler)
    for method, pattern, handler in [
        ("GET", r"/api/whoami-v2", _Handler.whoami),
        ("GET", r"/api/agent-harnesses", _Handler.agent_harnesses),
        ("POST", r"/api/validate-yaml", _Handler.validate_yaml),
        ("POST", r"/api/repos/create", _Handler.create_repo),
        ("GET", _REPO, _Handler.model_info),
        ("GET", _REPO + r"/revision/(?P<rev>[^/]+)", _Handler.model_info),
        ("GET", _REPO + r"/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?", _Handler.tree),
        ("GET", _REPO + r"/refs", _Handler.refs),
        ("POST", _REPO + r"/branch/(?P<branch>[^/]+)", _Handler.create_branch),
        ("POST", _REPO + r"/preupload/(?P<rev>[^/]+)", _Handler.preupload),
        ("POST", _REPO + r"/commit/(?P<rev>[^/]+)", _Handler.commit),
        ("POST", _REPO + r"/discussions", _Handler.create_discussion),
        ("GET", _REPO + r"/discussions/(?P<num>\d+)", _Handler.discussion),
        ("GET|HEAD", r"/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)", _Handler.resolve),
    ]
]


def point_huggingface_hub_at(monkeypatch: pytest.MonkeyPatch, endpoint: str, home: Path) -> None:
    """Point this process's huggingface_hub at `endpoint` and `home`, patching what it read at import too."""
    import huggingface_hub.constants as constants
    from huggingface_hub import hf_api

    env = {"HF_ENDPOINT": endpoint, "HF_HOME": str(home), "HF_HUB_CACHE": str(home / "hub"), "HF_HUB_DISABLE_XET": "1"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for name in (
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HF_TOKEN_PATH",
        "HUGGINGFACE_HUB_CACHE",
        "HF_OIDC_RESOURCE",
        "HUGGING_FACE_HUB_TOKEN",
    ):
        monkeypatch.delenv(name, raising=False)
    patched = {
        "ENDPOINT": endpoint,
        "HUGGINGFACE_CO_URL_TEMPLATE": endpoint + "/{repo_id}/resolve/{revision}/{filename}",
        "HF_HOME": str(home),
        "HF_HUB_CACHE": str(home / "hub"),
        "HF_ASSETS_CACHE": str(home / "assets"),
        "HF_XET_CACHE": str(home / "xet"),
        "HF_TOKEN_PATH": str(home / "token"),
        "HF_STORED_TOKENS_PATH": str(home / "stored_tokens"),
        "AGENT_HARNESSES_PATH": str(home / ".agent_harnesses.json"),
        "HF_HUB_OFFLINE": False,
        "HF_HUB_DISABLE_XET": True,
    }
    for name, value in patched.items():
        if hasattr(constants, name):  # an older huggingface_hub lacks the newer ones
            monkeypatch.setattr(constants, name, value)
    monkeypatch.setattr(hf_api.api, "endpoint", endpoint)


@pytest.fixture
def hub_endpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    """A running `FakeHub` that huggingface_hub talks to, as user `alice` (`HF_TOKEN`), with a fresh cache.

    `os.environ` is set too, so a subprocess started with `env=os.environ.copy()` talks to it. Stops after the test.
    """
    with FakeHub() as hub:
        point_huggingface_hub_at(monkeypatch, hub.url, tmp_path / "hf_home")
        monkeypatch.setenv("HF_TOKEN", ALICE_TOKEN)
        yield hub
