"""llamba-bench-serve: aggregate tokens/s and time to first token at several concurrency levels.

Starts a real llamba-server on 127.0.0.1 (or uses --url), then for each concurrency level C sends
C streams at a time (C x --rounds requests in all) of fixed-length greedy generations with distinct
prompts, and reports aggregate generated tokens/s and TTFT p50/p95 as a markdown table.

`--json-schema builtin` (or a schema file) runs every request under a JSON-schema `response_format`:
compare its table with the unconstrained one, same command otherwise, for the cost of constrained
decoding. The built-in schema is a long array of records, so no generation ends before -n tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx


@dataclass(frozen=True)
class StreamResult:
    ttft: float
    n_tokens: int
    draft_n: int = 0  # speculative tokens verified, and accepted (from the final timings)
    draft_accepted: int = 0
    decode_s: float = 0.0  # the server's own decode time (timings.predicted_ms): no prompt, no HTTP


@dataclass(frozen=True)
class LevelResult:
    concurrency: int
    n_requests: int
    seconds: float
    tokens: int
    ttft_p50: float
    ttft_p95: float
    draft_n: int = 0
    draft_accepted: int = 0
    decode_s: float = 0.0

    @property
    def decode_per_stream(self) -> float:
        """One stream's decode rate, prompt processing left out: where speculation acts."""
        return self.tokens / self.decode_s if self.decode_s else 0.0

    @property
    def acceptance(self) -> str:
        return f"{self.draft_accepted / self.draft_n:.2f}" if self.draft_n else "-"

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds


# A list of at least 200 records: the grammar never lets a generation end before -n tokens, so both
# tables count the same tokens (an array the model may close ends greedy runs after a few records).
RECORDS_SCHEMA = {
    "type": "array",
    "minItems": 200,
    "maxItems": 1000,
    "items": {
        "type": "object",
        "properties": {
            "id": {"type": "integer", "minimum": 0, "maximum": 100000},
            "name": {"type": "string", "maxLength": 32},
            "kind": {"enum": ["book", "film", "song", "game"]},
            "score": {"type": "number", "minimum": 0, "maximum": 10},
        },
        "required": ["id", "name", "kind", "score"],
        "additionalProperties": False,
    },
}


# The copy workload: a long prompt whose answer repeats most of it (code editing, quoting): where
# n-gram speculation pays. Each request varies its last line, so no two prompts are the same.
COPY_TEXT = """def parse_args(argv):
    parser = argparse.ArgumentParser(description="Resize every image in a folder.")
    parser.add_argument("folder", help="the folder with the images")
    parser.add_argument("--width", type=int, default=800, help="the width to resize to")
    parser.add_argument("--height", type=int, default=600, help="the height to resize to")
    parser.add_argument("--quality", type=int, default=90, help="the JPEG quality")
    return parser.parse_args(argv)


def resize_all(folder, width, height, quality):
    for name in sorted(os.listdir(folder)):
        if not name.lower().endswith((".jpg", ".jpeg", ".png")):
            continue
        path = os.path.join(folder, name)
        with Image.open(path) as image:
            resized = image.resize((width, height))
            resized.save(path, quality=quality)
        print(f"resized {name} to {width}x{height}")


def main(argv=None):
    args = parse_args(argv)
    resize_all(args.folder, args.width, args.height, args.quality)
"""


# The repeat workload: prose to repeat word for word. SmolLM2 and Gemma 3 repeat it (one ';' becomes '.')
# where they rewrite parts of COPY_TEXT (renamed flags, a changed call), so their drafts run longer.
REPEAT_TEXT = (
    "The river rises in the hills north of the town and runs for about forty miles before it reaches the"
    " sea. In spring the snow melts and the water is high and fast; in late summer it is low enough to"
    " cross on foot in some places. The old mill stood by the bridge for two hundred years, grinding"
    " wheat for the farms around it, until a flood in the winter of 1921 took away its wheel. The town"
    " bought the building in 1950 and it is now a small museum, open on weekends from May to October."
    " Visitors can see the millstones, a model of the wheel, and photographs of the town as it was a"
    " century ago. A path follows the river from the museum to the harbour, passing the church, the"
    " school and the market square, where farmers sell vegetables, cheese and bread every Saturday"
    " morning. At the harbour there are fishing boats, a lighthouse painted red and white, and a cafe"
    " that serves the best fish soup on the coast. In the evening the lights of the boats come on one by"
    " one, and the sound of the water against the harbour wall is the only thing you can hear."
)
WORKLOADS = ("chat", "copy", "repeat")


def workload_prompts(workload: str, n: int) -> list[str]:
    if workload == "copy":
        return [f"Repeat this code exactly:\n{COPY_TEXT}\n# request {i}" for i in range(n)]
    if workload == "repeat":
        ask = "Repeat the following text exactly, word for word, with no changes:"
        return [f"Request {i}. {ask}\n\n{REPEAT_TEXT}" for i in range(n)]
    return [f"Request {i}: write about the number {i * 7 % 101}." for i in range(n)]


async def one_stream(client: httpx.AsyncClient, prompt: str, n_predict: int, extra: dict) -> StreamResult:
    body: dict = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": n_predict,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "cache_prompt": False,
        **extra,
    }
    start = time.perf_counter()
    ttft, n_tokens, drafted, decode_s = 0.0, 0, (0, 0), 0.0
    async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if not ttft and any(c["delta"].get("content") for c in chunk["choices"]):
                ttft = time.perf_counter() - start
            if chunk.get("usage"):
                n_tokens = chunk["usage"]["completion_tokens"]
            timings = chunk.get("timings") or {}
            if timings:
                drafted = timings.get("draft_n", 0), timings.get("draft_n_accepted", 0)
                decode_s = timings["predicted_ms"] / 1e3
    return StreamResult(ttft, n_tokens, *drafted, decode_s)


async def run_level(
    url: str, concurrency: int, rounds: int, n_predict: int, workload: str = "chat", extra: dict | None = None
) -> LevelResult:
    prompts = workload_prompts(workload, concurrency * rounds)
    sem = asyncio.Semaphore(concurrency)

    async def limited(client: httpx.AsyncClient, p: str) -> StreamResult:
        async with sem:
            return await one_stream(client, p, n_predict, extra or {})

    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        start = time.perf_counter()
        results = await asyncio.gather(*(limited(client, p) for p in prompts))
        seconds = time.perf_counter() - start
    ttfts = sorted(r.ttft for r in results)
    p95 = ttfts[min(len(ttfts) - 1, int(round(0.95 * (len(ttfts) - 1))))]
    drafted = sum(r.draft_n for r in results), sum(r.draft_accepted for r in results)
    tokens = sum(r.n_tokens for r in results)
    decode_s = sum(r.decode_s for r in results)
    median = statistics.median(ttfts)
    return LevelResult(concurrency, len(results), seconds, tokens, median, p95, *drafted, decode_s)


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    port = 18000 + int(time.time()) % 1000
    cmd = [
        sys.executable,
        "-m",
        "server",
        "--port",
        str(port),
        "-np",
        str(args.parallel),
        "-c",
        str(args.ctx_size),
    ]
    if args.model:
        cmd += ["-m", args.model]
    cmd += args.server_args.split()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.3)
    proc.kill()
    raise SystemExit("llamba-bench-serve: the server did not become healthy")


def request_extras(schema: dict | None, spec: str | None, spec_n_max: int) -> dict:
    """The fields every request adds: a JSON-schema response_format, llama-server's speculative.*."""
    extra: dict = {}
    if schema is not None:
        extra["response_format"] = {"type": "json_schema", "json_schema": {"name": "bench", "schema": schema}}
    if spec is not None:
        extra |= {"speculative.type": spec, "speculative.n_max": spec_n_max}
    return extra


def load_schema(choice: str | None) -> dict | None:
    if choice is None:
        return None
    return RECORDS_SCHEMA if choice == "builtin" else json.loads(Path(choice).read_text())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="llamba-bench-serve", description=__doc__.splitlines()[0])
    p.add_argument("--url", help="an already running server; otherwise one is started")
    p.add_argument("-m", "--model", default=None)
    p.add_argument("-np", "--parallel", type=int, default=16)
    p.add_argument("-c", "--ctx-size", type=int, default=16 * 512)
    p.add_argument("--concurrency", default="1,4,16")
    p.add_argument("--rounds", type=int, default=2, help="requests per stream slot at each level")
    p.add_argument("-n", "--n-predict", type=int, default=64)
    p.add_argument(
        "--json-schema", default=None, help="'builtin' or a JSON schema file: constrained decoding"
    )
    p.add_argument(
        "--workload",
        choices=WORKLOADS,
        default="chat",
        help="copy: answers repeat (and partly rewrite) code; repeat: answers repeat prose",
    )
    p.add_argument("--spec", default=None, help="speculative.type of every request (e.g. ngram-simple)")
    p.add_argument("--spec-n-max", type=int, default=16)
    p.add_argument("--server-args", default="", help="more flags for the started server")
    args = p.parse_args(argv)
    extra = request_extras(load_schema(args.json_schema), args.spec, args.spec_n_max)
    proc, url = (None, args.url) if args.url else start_server(args)
    try:
        asyncio.run(run_level(url, 1, 1, 4))  # warm-up
        columns = (
            "streams",
            "requests",
            "gen tokens",
            "seconds",
            "aggregate t/s",
            "decode t/s per stream",
            "TTFT p50 ms",
            "TTFT p95 ms",
        )
        print("| " + " | ".join((*columns, "accepted")) + " |")
        print("|" + " ---: |" * (len(columns) + 1))
        for level in (int(c) for c in args.concurrency.split(",")):
            r = asyncio.run(run_level(url, level, args.rounds, args.n_predict, args.workload, extra))
            print(
                f"| {r.concurrency} | {r.n_requests} | {r.tokens} | {r.seconds:.2f} "
                f"| {r.tokens_per_second:.2f} | {r.decode_per_stream:.2f} "
                f"| {1e3 * r.ttft_p50:.0f} | {1e3 * r.ttft_p95:.0f} | {r.acceptance} |",
                flush=True,
            )
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
