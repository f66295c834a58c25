"""The web server of `hf-transformer serve`: a page to try the model at `/`, the JSON API (`POST /translate`,
`POST /attention`, `GET /health`) and its OpenAPI description at `/openapi.json`, on FastAPI and uvicorn.

Every refusal is a 4xx answer `{"error": "..."}` that names the problem: a body that is not JSON or too large, no
sentences, too many, a field the endpoint does not know, settings out of range. A sentence longer than the model's
positions is translated cut to them, and the answer says so in `warnings`, as `translate()` warns and the `translate`
command prints. A client has `request_timeout` seconds to send its whole request, so that idle and slow ones cannot
hold connections open.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from contextlib import asynccontextmanager
from importlib.resources import files
from typing import Any

from ..decoding.attention_maps import alignment, format_alignment
from ..decoding.engine import MAX_BEAMS, TranslationEngine
from ..decoding.search import prepare_sources
from ..errors import MissingExtra, UserError
from .batcher import Batcher, ServerBusy

try:
    import h11
    import uvicorn
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import HTMLResponse, JSONResponse
    from pydantic import BaseModel, ConfigDict, Field
    from starlette.exceptions import HTTPException as StarletteHTTPException
    from uvicorn.protocols.http.h11_impl import H11Protocol
except ImportError as err:
    raise MissingExtra("serving needs FastAPI and uvicorn: pip install 'hf-transformer[serve]'") from err

logger = logging.getLogger(__name__)

# What one request may hold.
MAX_SENTENCES = 64
MAX_BODY_BYTES = 1 << 20
# Requests served at once (beyond them: 503), and the seconds a client has to send one whole.
MAX_REQUESTS = 256
REQUEST_TIMEOUT = 10.0


class TranslateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt setting ("num_beam") is refused, not ignored

    text: list[str] = Field(description="the sentences to translate", examples=[["4821", "17"]])
    num_beams: int | None = Field(None, ge=1, le=MAX_BEAMS, description="beams of the beam search (default: model's)")
    length_penalty: float | None = Field(None, ge=-10, le=10, description="alpha of the length penalty")


class TranslateResponse(BaseModel):
    translations: list[str] = Field(description="one translation per sentence, in order")
    warnings: list[str] = Field(default_factory=list, description="sentences that were cut to the model's positions")


class AttentionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str = Field(description="one sentence", examples=["4821"])
    layer: int = Field(-1, description="the decoder layer, from 0 (-1: the last)")


class AttentionResponse(BaseModel):
    translation: str
    source_tokens: list[str]
    target_tokens: list[str]
    weights: list[list[float]] = Field(description="target x source: the layer's encoder-decoder attention, head mean")
    alignment: str = Field(description="source-target token index pairs, fairseq's format: '0-0 1-2'")
    warnings: list[str] = Field(default_factory=list)


class ErrorResponse(BaseModel):
    error: str


def create_app(
    engine: TranslationEngine,
    *,
    max_sentences: int = MAX_SENTENCES,
    max_body_bytes: int = MAX_BODY_BYTES,
    max_waiting_sentences: int = 4096,
    max_requests: int = MAX_REQUESTS,
) -> FastAPI:
    """The FastAPI application serving `engine`; requests that arrive together are translated in one batch."""
    batcher = Batcher(
        engine,
        max_batch_sentences=max(256, max_sentences),
        # Room for one request of `max_sentences` at least: a smaller queue would refuse it for ever ("retry").
        max_waiting_sentences=max(max_waiting_sentences, max_sentences),
    )
    # The body of each POST endpoint, whose fields a request with an unknown one is told.
    bodies = {"/translate": TranslateRequest, "/attention": AttentionRequest}

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        batcher.start()
        yield
        await batcher.stop()

    app = FastAPI(
        title="hf-transformer",
        summary=f"Translation with {engine.name or 'a Transformer'} ({engine.engine})",
        lifespan=lifespan,
        responses={status: {"model": ErrorResponse} for status in (400, 413, 415, 422, 503)},
    )
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    app.add_middleware(RequestLimit, max_requests=max_requests)  # the outer one: it counts requests being read too
    page = files(__package__).joinpath("page.html").read_text(encoding="utf-8")

    def too_long(sentences: list[str]) -> list[str]:
        _, _, truncated = prepare_sources(engine.tokenizer, sentences, engine.max_positions)
        if truncated is None:
            return []
        logger.warning(str(truncated))
        return [str(truncated)]

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, error: RequestValidationError) -> JSONResponse:
        content_type = request.headers.get("content-type", "application/json")
        if "json" not in content_type:
            return _error(415, f"the body is {content_type}: send JSON with the header Content-Type: application/json")
        errors = error.errors()
        # An unknown field first: a misspelt one also makes the field it stands for missing.
        first = next((e for e in errors if e.get("type") == "extra_forbidden"), errors[0])
        where = ".".join(str(part) for part in first.get("loc", ()) if part != "body") or "body"
        if first.get("type") == "extra_forbidden" and request.url.path in bodies:
            known = ", ".join(bodies[request.url.path].model_fields)
            return _error(422, f"{where}: {request.url.path} has no such field; its fields are {known}")
        if first.get("type") == "json_invalid":
            return JSONResponse({"error": f"the body is not valid JSON: {first.get('msg')}"}, status_code=400)
        if first.get("type") == "missing" and where == "body":
            return _error(422, 'the body is empty: send JSON such as {"text": ["a sentence"]}')
        return _error(422, f"{where}: {first.get('msg')}")

    @app.exception_handler(UserError)
    async def user_error(request: Request, error: UserError) -> JSONResponse:
        return _error(422, str(error))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        # Starlette's own refusals (no such path, a method the path does not take) answered {"detail": ...}.
        routes = {"/translate": "POST", "/attention": "POST", "/health": "GET", "/": "GET"}
        problem = f"{request.method} {request.url.path}: {str(error.detail).lower()}"
        if request.url.path in routes and error.status_code == 405:
            problem += f"; send {routes[request.url.path]} {request.url.path}"
        return JSONResponse({"error": problem}, status_code=error.status_code, headers=error.headers)

    @app.exception_handler(ServerBusy)
    async def busy(request: Request, error: ServerBusy) -> JSONResponse:
        return JSONResponse({"error": str(error)}, status_code=503, headers={"Retry-After": "1"})

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def index() -> str:
        return page

    @app.get("/health")
    async def health() -> dict[str, Any]:
        """Whether the server is up, and the model it serves."""
        return {"status": "ok", "model": engine.name, "engine": engine.engine, "max_sentences": max_sentences}

    @app.post("/translate", response_model=TranslateResponse)
    async def translate(request: TranslateRequest) -> TranslateResponse:
        """Translate sentences (at most `max_sentences` per request; empty ones stay empty)."""
        if not request.text:
            return _error(422, 'text is empty: send at least one sentence, {"text": ["a sentence"]}')
        if len(request.text) > max_sentences:
            return _error(
                413, f"text holds {len(request.text)} sentences, more than {max_sentences} per request: split it"
            )
        warnings = too_long(request.text)
        translations = await batcher.translate(request.text, request.num_beams, request.length_penalty)
        return TranslateResponse(translations=translations, warnings=warnings)

    @app.post("/attention", response_model=AttentionResponse)
    async def attention(request: AttentionRequest) -> AttentionResponse:
        """The translation of one sentence and its encoder-decoder attention (one layer, averaged over heads)."""
        if not request.text.strip():
            return _error(422, "text is empty: send a sentence")
        engine.require_one_model("attention weights")
        layers = engine.model.config.decoder_layers
        if not -layers <= request.layer < layers:
            return _error(422, f"layer {request.layer}: the model has {layers} layers, 0 to {layers - 1}")
        warnings = too_long([request.text])
        (maps,) = await batcher.run(engine.attention, [request.text])
        return AttentionResponse(
            translation=maps.translation,
            source_tokens=maps.source_tokens,
            target_tokens=maps.target_tokens,
            weights=maps.cross_attentions[request.layer].mean(dim=0).tolist(),
            alignment=format_alignment(alignment(maps, request.layer)),
            warnings=warnings,
        )

    return app


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


class BodyLimit:
    """Reads the whole body before the application does, refusing one larger than `max_bytes` with 413 as soon as it
    is known to be (by its Content-Length, or as it arrives), so that no request makes the server hold more."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = _error(413, f"the body is larger than {self.max_bytes:,} bytes: send fewer or shorter sentences")
        length = dict(scope["headers"]).get(b"content-length", b"0")
        if not length.isdigit() or int(length) > self.max_bytes:
            await too_large(scope, receive, send)
            return
        body, more = b"", True
        while more:
            event = await receive()
            if event["type"] == "http.disconnect":
                return
            body += event.get("body", b"")
            more = event.get("more_body", False)
            if len(body) > self.max_bytes:
                await too_large(scope, receive, send)
                return
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


class RequestLimit:
    """Answers 503 at once to a request beyond `max_requests` being served, except `/health`: without a bound,
    attention requests would queue without end on the model's thread. uvicorn's own `limit_concurrency` counts open
    connections instead, so idle ones locked every client out, health included; this counts requests, from their
    headers on."""

    def __init__(self, app, max_requests: int) -> None:
        self.app, self.max_requests, self.serving = app, max_requests, 0

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] == "/health":
            await self.app(scope, receive, send)
            return
        if self.serving >= self.max_requests:
            busy = f"{self.serving} requests are being served, the most at once: retry in a moment"
            await JSONResponse({"error": busy}, status_code=503, headers={"Retry-After": "1"})(scope, receive, send)
            return
        self.serving += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.serving -= 1


class DeadlineProtocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, closing a connection whose request has not arrived whole (headers and body)
    `request_timeout` seconds after the connection opened or its previous answer. uvicorn's `timeout_keep_alive`
    starts only after an answer and restarts at every byte, so a client that sends nothing, or a byte at a time,
    would hold its connection for ever."""

    def __init__(self, *args: Any, request_timeout: float = REQUEST_TIMEOUT, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.request_timeout = request_timeout
        self.deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)
        self._watch()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self.deadline is not None:
            self.deadline.cancel()

    def _watch(self) -> None:
        """Start the deadline when the server begins to wait for a request, stop it once the request is in."""
        waiting = self.conn.their_state in (h11.IDLE, h11.SEND_BODY)
        if waiting and self.deadline is None:
            self.deadline = self.loop.call_later(self.request_timeout, self.transport.close)
        elif not waiting and self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None


def server_config(
    app: FastAPI,
    host: str = "127.0.0.1",
    port: int = 8000,
    request_timeout: float = REQUEST_TIMEOUT,
    log_level: str = "info",
) -> uvicorn.Config:
    """uvicorn's settings for serving `app`: its HTTP/1.1 protocol with a deadline for each request to arrive."""
    protocol = functools.partial(DeadlineProtocol, request_timeout=request_timeout)
    return uvicorn.Config(app, host=host, port=port, http=protocol, log_level=log_level)


def serve(engine: TranslationEngine, host: str = "127.0.0.1", port: int = 8000, **settings: Any) -> None:
    """Serve `engine` until interrupted (`settings`: those of `create_app`)."""
    uvicorn.Server(server_config(create_app(engine, **settings), host, port)).run()
