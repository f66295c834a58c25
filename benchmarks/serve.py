"""Serving a trained model over HTTP on 127.0.0.1: sentences/s and p50/p99 latency for 1 and 16 concurrent clients,
each sending one sentence per request, next to one client calling `translate()` on one sentence at a time in-process.

    python benchmarks/serve.py --model exports/demo
    python benchmarks/serve.py --model exports/demo --frameworks fastapi litserve gradio   # the candidates

`fastapi` is `hf-transformer serve` (FastAPI and uvicorn; requests that wait are merged into one `translate()`
call); `litserve` runs LitServe (Lightning's server, `pip install litserve`) around the same engine with its own
batching (`max_batch_size` 16, `batch_timeout` 5 ms) in one worker process; `gradio` a Gradio interface (`pip install
gradio`) whose queue batches up to 16 calls, called through its REST API (a POST that queues the call, a GET that
streams its result). Each server runs in a process of its own, the clients are threads of this one: both share the
machine's cores. Servers and loop run torch on `--threads` threads (default 1: on a small model and a busy 2-core
machine, a second thread made each sentence several times slower, the threads waiting for each other).

Bounded: every setting sends `--requests` requests (stopping early after `--seconds`), and `--repeats` rounds each
measure every setting, the servers taking turns (the machine's load drifts); the table gives the median of the
rounds. Writes `benchmarks/results/serve.json` (or `--out`).
"""

import argparse
import http.client
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import torch

from hf_transformer import translate
from hf_transformer.decoding.engine import TranslationEngine
from lightning_modules.cli.arguments import load_engine

RESULTS = Path(__file__).resolve().parent / "results" / "serve.json"
FRAMEWORKS = ("fastapi", "litserve", "gradio")
JSON = {"Content-Type": "application/json"}
BATCH = 16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a model for `hf-transformer serve`: an exported folder")
    parser.add_argument(
        "--frameworks", nargs="+", choices=FRAMEWORKS, default=["fastapi"], help="the servers to measure, in turns"
    )
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 16], help="concurrent clients (default: 1 16)")
    parser.add_argument("--requests", type=int, default=320, help="requests per setting and repeat (default: 320)")
    parser.add_argument("--seconds", type=float, default=60, help="stop a setting after this long (default: 60)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds, each measuring every setting (default: 3)")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads of the servers and the loop (default: 1, see above)"
    )
    parser.add_argument("--sentences", help="a text file of sentences to send (default: random numbers, the demo's)")
    parser.add_argument("--out", default=str(RESULTS), help="the results file (default: benchmarks/results/serve.json)")
    args = parser.parse_args()
    sentences = _sentences(args.sentences)
    torch.set_num_threads(args.threads)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the servers', read when their torch starts

    engine = load_engine(args.model)
    runs: dict[str, list[dict[str, float]]] = defaultdict(list)
    for _ in range(args.repeats):
        runs["translate() loop, 1 client"].append(_translate_loop(engine, sentences, args.requests, args.seconds))
        for framework in args.frameworks:
            for clients, result in _measure_server(framework, args, sentences).items():
                runs[f"{framework}, {clients} client{'s' if clients > 1 else ''}"].append(result)
    results = {
        "model": args.model,
        "cores": os.cpu_count(),
        "threads": args.threads,
        "requests": args.requests,
        "repeats": args.repeats,
        "settings": {name: _median(entries) for name, entries in runs.items()},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"{'setting':<28} {'sentences/s':>12} {'p50 ms':>8} {'p99 ms':>8}")
    for name, entry in results["settings"].items():
        print(f"{name:<28} {entry['sentences_per_sec']:>12.1f} {entry['p50_ms']:>8.1f} {entry['p99_ms']:>8.1f}")
    print(f"Wrote {args.out}")


def _measure_server(framework: str, args: argparse.Namespace, sentences: list[str]) -> dict[int, dict[str, float]]:
    """Start the server, warm it up, measure every number of clients, stop it."""
    port = _free_port()
    server = _start_server(framework, args.model, port)
    try:
        _wait_until_up(port, server, "/" if framework == "gradio" else "/health")
        _run_clients(port, framework, sentences, 4, 16, args.seconds)  # warm-up
        return {
            clients: _run_clients(port, framework, sentences, clients, args.requests, args.seconds)
            for clients in args.clients
        }
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def _sentences(path: str | None) -> list[str]:
    if path:
        return [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    generator = random.Random(0)
    return [str(generator.randrange(10 ** generator.randint(1, 6))) for _ in range(1000)]


def _summary(latencies: list[float], seconds: float) -> dict[str, float]:
    ordered = sorted(latencies)
    return {
        "requests": len(ordered),
        "sentences_per_sec": len(ordered) / seconds,
        "p50_ms": 1000 * ordered[len(ordered) // 2],
        "p99_ms": 1000 * ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))],
    }


def _median(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def _translate_loop(engine: TranslationEngine, sentences: list[str], requests: int, limit: float) -> dict[str, float]:
    """One client calling `translate()` on one sentence at a time, in this process: the cost without HTTP."""
    translate(engine.model, engine.tokenizer, sentences[:4])  # warm-up
    latencies, started = [], time.perf_counter()
    for sentence in sentences[:requests]:
        before = time.perf_counter()
        translate(engine.model, engine.tokenizer, [sentence])
        latencies.append(time.perf_counter() - before)
        if time.perf_counter() - started > limit:
            break
    return _summary(latencies, time.perf_counter() - started)


def _run_clients(
    port: int, framework: str, sentences: list[str], clients: int, requests: int, limit: float
) -> dict[str, float]:
    """`clients` threads, each with its own keep-alive connection, sending one sentence per request until
    `requests` have been sent in all or `limit` seconds have passed."""
    latencies: list[float] = []
    counter = iter(range(requests))
    lock = threading.Lock()
    started = time.perf_counter()

    def client() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        while time.perf_counter() - started < limit:
            with lock:
                index = next(counter, None)
            if index is None:
                break
            before = time.perf_counter()
            _request(connection, framework, sentences[index % len(sentences)])
            with lock:
                latencies.append(time.perf_counter() - before)
        connection.close()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return _summary(latencies, time.perf_counter() - started)


def _request(connection: http.client.HTTPConnection, framework: str, sentence: str) -> str:
    """One sentence translated over `connection`: POST /translate, or Gradio's two calls (a POST that queues the
    event, a GET that streams its result as server-sent events)."""
    if framework == "gradio":
        connection.request("POST", "/gradio_api/call/translate", json.dumps({"data": [sentence]}), JSON)
        event = json.loads(_read(connection))["event_id"]
        connection.request("GET", f"/gradio_api/call/translate/{event}")
        stream = _read(connection).decode()
        return json.loads(stream.split("event: complete\ndata: ", 1)[1].split("\n", 1)[0])[0]
    connection.request("POST", "/translate", json.dumps({"text": [sentence]}), JSON)
    return json.loads(_read(connection))["translations"][0]


def _read(connection: http.client.HTTPConnection) -> bytes:
    response = connection.getresponse()
    body = response.read()
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}: {body[:200]!r}")
    return body


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _start_server(framework: str, model: str, port: int) -> subprocess.Popen:
    if framework == "fastapi":
        command = [sys.executable, "-m", "lightning_modules.cli", "serve", model, "--port", str(port)]
    else:
        command = [sys.executable, __file__, f"--{framework}-server", model, str(port)]
    # A session of its own, so that stopping it stops the worker processes it started too.
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def _wait_until_up(port: int, server: subprocess.Popen, path: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with status {server.returncode}")
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("GET", path)
            if connection.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the server did not answer /health within {timeout} s")


def _litserve(model: str, port: int) -> None:
    """LitServe around the same engine, batching up to 16 requests: what `--framework litserve` measures."""
    api = LitServeTranslation(model, max_batch_size=BATCH, batch_timeout=0.005, api_path="/translate")
    litserve.LitServer(api, accelerator="cpu", devices=1).run(host="127.0.0.1", port=port, generate_client_file=False)


def _gradio(model: str, port: int) -> None:
    """A Gradio interface around the same engine, batching up to 16 queued calls: what `--framework gradio`
    measures (`pip install gradio`)."""
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # no calls home from a benchmark
    import gradio

    engine = load_engine(model)

    def translate_batch(texts: list[str]) -> list[list[str]]:
        return [[best[0].text for best in engine.translate(list(texts))]]

    interface = gradio.Interface(
        translate_batch, "text", "text", batch=True, max_batch_size=BATCH, api_name="translate"
    )
    interface.queue(default_concurrency_limit=1).launch(server_name="127.0.0.1", server_port=port)


try:  # only `--framework litserve` needs it
    import litserve
except ImportError:
    litserve = None

if litserve is not None:

    class LitServeTranslation(litserve.LitAPI):
        """At module level: LitServe pickles it into its worker process."""

        def __init__(self, model: str, **kwargs) -> None:
            super().__init__(**kwargs)
            self.model = model

        def setup(self, device: str) -> None:
            self.engine = load_engine(self.model)

        def decode_request(self, request: dict) -> list[str]:
            return request["text"]

        def batch(self, inputs: list[list[str]]) -> list[list[str]]:
            return inputs

        def predict(self, batch: list[list[str]]) -> list[list[str]]:
            flat = [sentence for sentences in batch for sentence in sentences]
            translations = [best[0].text for best in self.engine.translate(flat)]
            outputs, start = [], 0
            for sentences in batch:
                outputs.append(translations[start : start + len(sentences)])
                start += len(sentences)
            return outputs

        def unbatch(self, output: list[list[str]]) -> list[list[str]]:
            return output

        def encode_response(self, output: list[str]) -> dict:
            return {"translations": output}


if __name__ == "__main__":
    if sys.argv[1:2] == ["--litserve-server"]:
        _litserve(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1:2] == ["--gradio-server"]:
        _gradio(sys.argv[2], int(sys.argv[3]))
    else:
        main()
