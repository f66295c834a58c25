"""Serving a trained model: a web page to try it and a JSON API, on FastAPI and uvicorn (the `serve` extra)."""

from .app import create_app, serve

__all__ = ["create_app", "serve"]
