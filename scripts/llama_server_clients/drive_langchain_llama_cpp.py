"""langchain-llama-cpp 0.1.0 (`ChatLlama`) against a server, the way its README uses it.

Starts `<bin> -m <model> -c 4096 -np 2` and, through ChatLlama's public API only: invoke (usage, timings,
finish_reason), llama.cpp sampling fields, n_probs, logprobs/top_logprobs, n=2, streaming (usage + timings in
the last chunk), async invoke and stream, tool binding (tool_choice "required"), streamed tool calls, the
three with_structured_output methods, and the context-overflow error class.

usage: python drive_langchain_llama_cpp.py --bin BIN --model GGUF --port N --workdir DIR
"""

from __future__ import annotations

import asyncio
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Checks, Server, driver_args, short  # noqa: E402
from langchain_core.messages import HumanMessage, SystemMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langchain_llama_cpp import ChatLlama, LlamaContextOverflowError  # noqa: E402
from pydantic import BaseModel, Field  # noqa: E402


@tool
def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    return f"Sunny in {city}"


class Person(BaseModel):
    """A person mentioned in the text."""

    name: str
    age: int = Field(description="Age in years")


def main() -> int:
    a = driver_args()
    c = Checks("langchain-llama-cpp")
    log = os.path.join(a.workdir, "server.log")
    with Server(a.bin, a.model, a.port, ["-c", "4096", "-np", "2", *a.server_args], log_path=log) as srv:
        # `model` is only a llama-swap entry name; a bare server ignores it.
        llm = ChatLlama(
            model="smollm2", base_url=srv.url, max_tokens=24, temperature=0, timeout=300, max_retries=0
        )
        run(c, llm)
    return c.finish()


def run(c: Checks, llm: ChatLlama) -> None:
    def basic():
        msg = llm.invoke("What is 17 * 23? Answer with the number only.")
        assert isinstance(msg.content, str) and msg.content.strip(), f"empty content: {msg!r}"
        um = msg.usage_metadata or {}
        assert um.get("input_tokens", 0) > 0 and um.get("output_tokens", 0) > 0, f"usage_metadata {um}"
        assert "cache_read" in (um.get("input_token_details") or {}), (
            f"usage.prompt_tokens_details.cached_tokens missing: usage_metadata {um}"
        )
        t = msg.response_metadata.get("timings") or {}
        for k in ("prompt_n", "predicted_n", "prompt_ms", "predicted_ms", "cache_n"):
            assert k in t, f"timings lacks {k!r}: {t}"
        fr = msg.response_metadata.get("finish_reason")
        assert fr in ("stop", "length"), f"finish_reason {fr!r}"
        assert msg.response_metadata.get("id", "").startswith("chatcmpl"), (
            f"id {msg.response_metadata.get('id')!r}"
        )
        return f"content={msg.content[:40]!r} usage={um['input_tokens']}/{um['output_tokens']} finish={fr}"

    c.check("invoke: content, usage_metadata, timings, finish_reason", basic)

    def sampling_fields():
        msg = llm.invoke(
            "Name a color.",
            top_k=40,
            min_p=0.05,
            top_p=0.95,
            typical_p=1.0,
            repeat_penalty=1.1,
            repeat_last_n=64,
            presence_penalty=0.0,
            frequency_penalty=0.0,
            dry_multiplier=0.8,
            dry_base=1.75,
            dry_allowed_length=2,
            dry_penalty_last_n=64,
            xtc_probability=0.0,
            xtc_threshold=0.1,
            mirostat=0,
            seed=42,
            min_keep=1,
            samplers=["top_k", "min_p", "temperature"],
            cache_prompt=True,
            n_keep=0,
            return_tokens=True,
            timings_per_token=True,
            logit_bias={"hello": -1.0},
            stop=["\n\n"],
            ignore_eos=False,
            top_n_sigma=-1.0,
            dynatemp_range=0.0,
            dynatemp_exponent=1.0,
        )
        assert isinstance(msg.content, str), msg
        return f"content={msg.content[:40]!r}"

    c.check("invoke with llama.cpp sampling fields", sampling_fields)

    def template_fields():
        msg = llm.invoke(
            "Name a river.",
            chat_template_kwargs={"enable_thinking": False},
            reasoning_format="none",
            reasoning_budget_tokens=-1,
            id_slot=0,
            n_cache_reuse=0,
            n_discard=0,
            t_max_predict_ms=20000,
            n_indent=0,
            add_generation_prompt=True,
        )
        assert isinstance(msg.content, str) and msg.content.strip(), f"empty content: {msg!r}"
        return f"content={msg.content[:40]!r}"

    c.check("invoke with template/reasoning/slot fields", template_fields)

    def stream_extra(**fields):
        chunks = list(llm.stream("Tell me about rivers. " * 20, max_tokens=8, **fields))
        text = "".join(ch.content for ch in chunks if isinstance(ch.content, str))
        assert text.strip(), f"no content in {len(chunks)} chunks"
        timed = [ch for ch in chunks if (ch.response_metadata or {}).get("timings")]
        assert timed, "no chunk carried timings"
        return f"{len(chunks)} chunks, {len(timed)} with timings"

    c.check("stream with timings_per_token", stream_extra, timings_per_token=True)
    c.check("stream with return_progress (prompt_progress chunks)", stream_extra, return_progress=True)
    c.check(
        "stream with return_progress + timings_per_token",
        stream_extra,
        return_progress=True,
        timings_per_token=True,
    )

    def n_probs():
        msg = llm.invoke("Say hello.", n_probs=3, max_tokens=5)
        lp = msg.response_metadata.get("logprobs")
        assert lp and lp.get("content"), (
            f"no choices[0].logprobs.content; response_metadata keys {list(msg.response_metadata)}"
        )
        first = lp["content"][0]
        for k in ("id", "token", "logprob", "bytes", "top_logprobs"):
            assert k in first, f"logprobs.content[0] lacks {k!r}: {short(first)}"
        assert len(first["top_logprobs"]) == 3, (
            f"{len(first['top_logprobs'])} top_logprobs for n_probs=3: {short(first)}"
        )
        return f"{len(lp['content'])} tokens, first {first['token']!r} logprob {first['logprob']:.3f}"

    c.check("invoke n_probs=3: choices[].logprobs", n_probs)

    def logprobs():
        msg = llm.invoke("Say hello.", logprobs=True, top_logprobs=2, max_tokens=5)
        lp = msg.response_metadata.get("logprobs")
        assert lp and lp.get("content"), f"no logprobs; response_metadata keys {list(msg.response_metadata)}"
        first = lp["content"][0]
        assert len(first.get("top_logprobs") or []) == 2, f"top_logprobs=2 gave {short(first)}"
        return f"{len(lp['content'])} tokens"

    c.check("invoke logprobs=True top_logprobs=2", logprobs)

    def post_sampling():
        msg = llm.invoke("Say hello.", n_probs=2, post_sampling_probs=True, max_tokens=3)
        lp = msg.response_metadata.get("logprobs") or {}
        first = (lp.get("content") or [{}])[0]
        assert "prob" in first and "top_probs" in first, (
            f"post_sampling_probs: expected prob/top_probs, got {short(first)}"
        )
        return f"prob={first['prob']:.3f}"

    c.check("invoke n_probs + post_sampling_probs: prob/top_probs", post_sampling)

    def n_two():
        res = llm.generate([[HumanMessage("Name a fruit.")]], n=2, temperature=0.9, seed=1)
        gens = res.generations[0]
        assert len(gens) == 2, f"n=2 gave {len(gens)} generations"
        return f"{[g.text[:20] for g in gens]}"

    c.check("generate n=2", n_two)

    def stream():
        chunks = list(llm.stream("Count to five."))
        text = "".join(ch.content for ch in chunks if isinstance(ch.content, str))
        assert text.strip(), f"no streamed content in {len(chunks)} chunks"
        merged = chunks[0]
        for ch in chunks[1:]:
            merged = merged + ch
        um = merged.usage_metadata or {}
        assert um.get("output_tokens", 0) > 0, (
            f"no usage in the stream (stream_options.include_usage); merged usage {um}"
        )
        t = merged.response_metadata.get("timings") or {}
        assert t.get("predicted_n"), (
            f"no timings in the last chunk: response_metadata {short(merged.response_metadata)}"
        )
        assert merged.response_metadata.get("finish_reason") in ("stop", "length"), short(
            merged.response_metadata
        )
        return (
            f"{len(chunks)} chunks, {text[:30]!r}, usage {um.get('input_tokens')}/{um.get('output_tokens')}"
        )

    c.check("stream: content, final usage chunk, timings", stream)

    def stream_logprobs():
        chunks = list(llm.stream("Say hi.", n_probs=2, max_tokens=4))
        got = [ch for ch in chunks if (ch.response_metadata or {}).get("logprobs")]
        assert got, "no logprobs in any streamed chunk"
        return f"{len(got)} chunks with logprobs"

    c.check("stream n_probs=2: per-chunk logprobs", stream_logprobs)

    def async_calls():
        async def go():
            msg = await llm.ainvoke("Hello!")
            parts = [ch.content async for ch in llm.astream("Hello again!")]
            return msg, parts

        msg, parts = asyncio.run(go())
        assert msg.content, "ainvoke: empty content"
        assert "".join(parts).strip(), "astream: no content"
        return f"ainvoke {msg.content[:20]!r}, astream {len(parts)} chunks"

    c.check("ainvoke + astream", async_calls)

    def tools():
        bound = llm.bind_tools([get_weather], tool_choice="required")
        msg = bound.invoke("What's the weather in Paris?", max_tokens=64)
        assert msg.tool_calls, f"no tool_calls; content={msg.content!r} invalid={msg.invalid_tool_calls}"
        call = msg.tool_calls[0]
        assert call["name"] == "get_weather", f"called {call['name']!r}"
        assert isinstance(call["args"].get("city"), str), f"args {call['args']}"
        assert msg.response_metadata.get("finish_reason") == "tool_calls", (
            f"finish_reason {msg.response_metadata.get('finish_reason')!r}"
        )
        return f"{call['name']}({call['args']}) id={call.get('id')!r}"

    c.check("bind_tools + tool_choice=required: tool_calls", tools)

    def tools_auto_stream():
        bound = llm.bind_tools([get_weather], tool_choice="required")
        chunks = list(bound.stream("What's the weather in Paris?", max_tokens=64))
        merged = chunks[0]
        for ch in chunks[1:]:
            merged = merged + ch
        assert merged.tool_calls, (
            f"no tool call assembled from {len(chunks)} chunks: {short(merged.tool_call_chunks)}"
        )
        assert merged.tool_calls[0]["name"] == "get_weather", merged.tool_calls
        return f"{merged.tool_calls[0]['name']}({merged.tool_calls[0]['args']}) from {len(chunks)} chunks"

    c.check("stream with tools: tool_call_chunks", tools_auto_stream)

    def tool_roundtrip():
        bound = llm.bind_tools([get_weather])
        msgs = [HumanMessage("What's the weather in Paris?")]
        first = llm.bind_tools([get_weather], tool_choice="required").invoke(msgs, max_tokens=64)
        assert first.tool_calls, "no tool call to answer"
        result = get_weather.invoke(first.tool_calls[0])
        second = bound.invoke(msgs + [first, result], max_tokens=24)
        assert isinstance(second.content, str), second
        return f"answer after ToolMessage: {second.content[:40]!r}"

    c.check("tool round trip (AIMessage tool_calls + ToolMessage back)", tool_roundtrip)

    def structured_fc():
        out = llm.with_structured_output(Person).invoke("Alice is 30.", max_tokens=64)
        assert isinstance(out, Person), f"{type(out)} {out!r}"
        return repr(out)

    c.check("with_structured_output(Person) function_calling", structured_fc)

    def structured_js():
        out = llm.with_structured_output(Person, method="json_schema").invoke("Alice is 30.", max_tokens=64)
        assert isinstance(out, Person), f"{type(out)} {out!r}"
        return repr(out)

    c.check("with_structured_output(Person, json_schema)", structured_js)

    def structured_jm():
        out = llm.with_structured_output(None, method="json_mode").invoke(
            [SystemMessage("Reply with a JSON object."), HumanMessage("Alice is 30. Give name and age.")],
            max_tokens=48,
        )
        assert isinstance(out, dict), f"{type(out)} {out!r}"
        return short(out, 80)

    c.check("with_structured_output json_mode", structured_jm)

    def overflow():
        try:
            llm.invoke("hello " * 5000, max_tokens=4)
        except LlamaContextOverflowError as e:
            assert e.n_prompt_tokens and e.n_ctx, f"n_prompt_tokens={e.n_prompt_tokens} n_ctx={e.n_ctx}"
            return f"LlamaContextOverflowError n_prompt_tokens={e.n_prompt_tokens} n_ctx={e.n_ctx}"
        raise AssertionError("no LlamaContextOverflowError for a prompt longer than the context")

    c.check("context overflow -> LlamaContextOverflowError", overflow)


if __name__ == "__main__":
    sys.exit(main())
