"""The hand-offs of one streamed chat completion with tools: every distinct call from one server/ file
into another, from the route handler until the engine's submit, traced with sys.setprofile on a real
request (SmolLM2, in process). How docs/architecture.md's seam is measured (issue #38):

    .venv/bin/python scripts/trace_handoffs.py
"""

import asyncio
import sys
from pathlib import Path

import engine  # noqa
from engine.model_files import resolve
from server.app import create_app
from server.config.parse import parse_settings

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SERVER = str(REPO / "server") + "/"
ENGINE = str(REPO / "engine") + "/"
edges: list[tuple[str, str]] = []
state = {"on": False, "done": False}


def mod(path: str) -> str:
    return path[len(str(REPO)) + 1 :]


def prof(frame, event, arg):
    if event != "call" or state["done"]:
        return
    code = frame.f_code
    fn = code.co_filename
    if not state["on"]:
        if code.co_name == "chat_completions" and fn.startswith(SERVER):
            state["on"] = True
        else:
            return
    if fn.startswith(ENGINE) and code.co_name in ("submit", "submit_choices") and fn.endswith("engine.py"):
        state["done"] = True
        back = frame.f_back
        edges.append(
            (f"{mod(back.f_code.co_filename)}:{back.f_code.co_name}", f"ENGINE {mod(fn)}:{code.co_name}")
        )
        return
    back = frame.f_back
    if back is None or not fn.startswith(SERVER):
        return
    bfn = back.f_code.co_filename
    if not bfn.startswith(SERVER) or bfn == fn:
        return
    edge = (f"{mod(bfn)}:{back.f_code.co_qualname}", f"{mod(fn)}:{code.co_qualname}")
    if edge not in edges:
        edges.append(edge)


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


async def main() -> None:
    settings, _ = parse_settings(["-m", str(resolve("smollm2")), "-c", "2048", "-np", "1"])
    app = create_app(settings)
    async with app.test_app() as test_app:
        client = test_app.test_client()
        for _ in range(600):
            r = await client.get("/health")
            if r.status_code == 200:
                break
            await asyncio.sleep(0.2)
        body = {
            "messages": [{"role": "user", "content": "Weather in Paris?"}],
            "tools": TOOLS,
            "tool_choice": "auto",
            "stream": True,
            "max_tokens": 8,
        }
        sys.setprofile(prof)
        r = await client.post("/v1/chat/completions", json=body)
        data = await r.get_data()
        sys.setprofile(None)
        print(r.status_code, data[:200])
    n_model = n_inner = 0
    for i, (a, b) in enumerate(edges, 1):
        into_model = b.startswith("server/model/") and not a.startswith("server/model/")
        inner = b.startswith("server/model/") and a.startswith("server/model/")
        n_model += into_model
        n_inner += inner
        tag = "   [into model/]" if into_model else ("   [inside model/]" if inner else "")
        print(f"{i:2d}. {a} -> {b}{tag}")
    print(
        f"total {len(edges)} cross-file hand-offs; {n_model} into server/model/ from outside; "
        f"{n_inner} inside server/model/"
    )


asyncio.run(main())
