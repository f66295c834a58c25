"""Batching concurrent requests: while the model translates one batch, the requests that arrive wait together, and
the next `translate()` call takes all of them (those with the same decoding settings), so that 16 clients cost about
one batched call each round instead of 16 calls one after the other."""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..decoding.engine import TranslationEngine
from ..decoding.search import Translation

T = TypeVar("T")


class ServerBusy(Exception):
    """More sentences are waiting than the server holds: the client should retry later (HTTP 503)."""


@dataclass
class _Job:
    sentences: list[str]
    settings: tuple[int | None, float | None]  # num_beams, length_penalty: only equal settings share a call
    future: asyncio.Future = field(repr=False)


class Batcher:
    """Runs the engine on one thread of its own (the model is used by one call at a time) and merges the requests
    that wait for it. At most `max_batch_sentences` sentences go into one call, and at most `max_waiting_sentences`
    wait: beyond that `translate` raises `ServerBusy` at once, so that a burst of requests cannot grow memory without
    bound."""

    def __init__(
        self, engine: TranslationEngine, max_batch_sentences: int = 256, max_waiting_sentences: int = 4096
    ) -> None:
        self.engine = engine
        self.max_batch_sentences, self.max_waiting_sentences = max_batch_sentences, max_waiting_sentences
        self._waiting: deque[_Job] = deque()
        self._waiting_sentences = 0
        self._wake = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="translate")
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._executor.shutdown(wait=True, cancel_futures=True)

    async def translate(
        self, sentences: list[str], num_beams: int | None = None, length_penalty: float | None = None
    ) -> list[str]:
        """The translations of `sentences`, translated together with the other requests that wait meanwhile."""
        if self._waiting_sentences + len(sentences) > self.max_waiting_sentences:
            raise ServerBusy(f"{self._waiting_sentences} sentences are waiting to be translated: retry in a moment")
        job = _Job(sentences, (num_beams, length_penalty), asyncio.get_running_loop().create_future())
        self._waiting.append(job)
        self._waiting_sentences += len(sentences)
        self._wake.set()
        return await job.future

    async def run(self, function: Callable[..., T], *args: Any) -> T:
        """`function(*args)` on the model's thread, after the translations already running (e.g. attention maps)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, function, *args)

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._waiting:
                jobs = self._take()
                sentences = [sentence for job in jobs for sentence in job.sentences]
                num_beams, length_penalty = jobs[0].settings
                try:
                    results: list[list[Translation]] = await self.run(
                        functools.partial(
                            self.engine.translate, sentences, num_beams=num_beams, length_penalty=length_penalty
                        )
                    )
                except Exception as error:  # a failed batch fails its requests, not the server
                    for job in jobs:
                        if not job.future.done():
                            job.future.set_exception(error)
                    continue
                start = 0
                for job in jobs:
                    translations = [best[0].text for best in results[start : start + len(job.sentences)]]
                    start += len(job.sentences)
                    if not job.future.done():  # the client may have gone
                        job.future.set_result(translations)

    def _take(self) -> list[_Job]:
        """The first waiting job and every later one with the same settings, up to `max_batch_sentences` in all;
        jobs whose client has gone are dropped."""
        jobs, kept, count = [], deque(), 0
        while self._waiting:
            job = self._waiting.popleft()
            if job.future.done():
                self._waiting_sentences -= len(job.sentences)
            elif (not jobs or job.settings == jobs[0].settings) and (
                not jobs or count + len(job.sentences) <= self.max_batch_sentences
            ):
                jobs.append(job)
                count += len(job.sentences)
                self._waiting_sentences -= len(job.sentences)
            else:
                kept.append(job)
        self._waiting = kept
        return jobs
