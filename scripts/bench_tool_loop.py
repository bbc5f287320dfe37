"""What one round of the server-side tool loop costs: prompt tokens processed and reused per round, and
where a run's time goes (model rounds, the MCP call), on a running llamba-server with mcp-server-time.

    llamba-server -m smollm2 --mcp-servers-json '{"mcpServers": {"time": {"command": "mcp-server-time"}}}'
    python scripts/bench_tool_loop.py --url http://127.0.0.1:8080 --runs 5

Each run forces one time-tool call (max_tool_rounds 1), so it has two rounds. Figures are ratios within
this one run of the script; the load average is printed before and after, since the machine is shared.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import httpx

BODY = {
    "messages": [{"role": "user", "content": "What time is it now in UTC?"}],
    "tools": [{"type": "mcp", "server_label": "time", "allowed_tools": ["get_current_time"]}],
    "tool_choice": {"type": "function", "function": {"name": "time_get_current_time"}},
    "max_tool_rounds": 1,
    "temperature": 0,
    "max_tokens": 200,
    "verbose": True,
}


def one_run(client: httpx.Client) -> dict[str, float]:
    begin = time.perf_counter()
    reply = client.post("/v1/chat/completions", json=BODY)
    reply.raise_for_status()
    wall = time.perf_counter() - begin
    first, second = (r["timings"] for r in reply.json()["__verbose"]["rounds"])
    model_s = sum((t["prompt_ms"] + t["predicted_ms"]) / 1e3 for t in (first, second))
    return {
        "round2_prompt": second["cache_n"] + second["prompt_n"],
        "round2_processed": second["prompt_n"],
        "round2_cached": second["cache_n"],
        "round1_prompt_ms": first["prompt_ms"],
        "round2_prompt_ms": second["prompt_ms"],
        "wall_s": wall,
        "outside_model_s": wall - model_s,  # the MCP call, HTTP, templating and tokenizing
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()}")
    with httpx.Client(base_url=args.url, timeout=600) as client:
        one_run(client)  # warm-up (JIT, first slot fill)
        runs = [one_run(client) for _ in range(args.runs)]
    print(f"load average after: {os.getloadavg()}")
    for key in runs[0]:
        values = [r[key] for r in runs]
        median = statistics.median(values)
        print(f"{key:>20}: median {median:9.2f}  min {min(values):9.2f}  max {max(values):9.2f}")
    share = statistics.median(r["round2_cached"] / r["round2_prompt"] for r in runs)
    print(f"round 2 reused {share:.0%} of its prompt from the cache")


if __name__ == "__main__":
    main()
