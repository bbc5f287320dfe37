"""Tool-call chat formats, as llama.cpp's common/chat.cpp detects them from the chat template.

`detect_format(template_source)` picks the format. A format gives a streaming parser for the model's
answer text (after the reasoning split: `format.parser(tools).push(text)`, then `.flush()`), `parse` for
a whole reply (by construction the stream's accumulation, for any chunking), `grammar(choice, parallel)`
for the grammar builder (engine-neutral nodes, see syntax.py), and the prompt-side adjustments llama.cpp
makes (`prepare_messages`, `template_context`, `finish_prompt`, `continue_prompt` for a prefill).
`answer_parser` is the parser of a chat answer: a format with markup besides its calls (GPT-OSS channels,
Functionary's `all` header, Command R7B's response markers) reads every answer, as llama-server does;
without tools (or with tool_choice none) call markup stays content.

Modules: common (types), syntax (grammar description), json_stream (incremental JSON), stream (the
parser machinery), and one module per family: generic, hermes, llama3, mistral, functionary, deepseek,
command_r, gpt_oss, minimax, qwen3_coder (with schema_types), gemma4 (with gemma4_args). Not covered
(llama.cpp's older chat.cpp has them): Firefunction v2, Functionary v3.1, Granite, Hermes' "good bad"
variants (`<function=...>`, bare or fenced JSON); other newer llama.cpp formats (Kimi, GLM, newer Mistral
`[ARGS]`) are detected as the older family whose marker they share, or as generic.
"""

from __future__ import annotations

from engine.text.tool_calls.command_r import CommandR7B
from engine.text.tool_calls.common import (
    AnswerReading,
    IdFactory,
    ParseDelta,
    ParsedMessage,
    Prefill,
    ToolCall,
    ToolCallDelta,
    ToolCallFormat,
    ToolCallParser,
    ToolChoice,
    random_id,
    sequential_ids,
)
from engine.text.tool_calls.deepseek import DeepSeekR1
from engine.text.tool_calls.functionary import FunctionaryV32
from engine.text.tool_calls.gemma4 import Gemma4
from engine.text.tool_calls.gemma4 import detect as detect_gemma4
from engine.text.tool_calls.generic import Generic
from engine.text.tool_calls.gpt_oss import GptOss
from engine.text.tool_calls.hermes import Hermes2Pro
from engine.text.tool_calls.llama3 import Llama3
from engine.text.tool_calls.minimax import MiniMaxM3
from engine.text.tool_calls.mistral import MistralNemo
from engine.text.tool_calls.qwen3_coder import Qwen3Coder
from engine.text.tool_calls.qwen3_coder import detect as detect_qwen3_coder
from engine.text.tool_calls.syntax import ToolGrammar, Trigger

__all__ = [
    "FORMATS",
    "AnswerReading",
    "IdFactory",
    "ParseDelta",
    "ParsedMessage",
    "Prefill",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallFormat",
    "ToolCallParser",
    "ToolChoice",
    "ToolGrammar",
    "Trigger",
    "detect_format",
    "random_id",
    "sequential_ids",
]

GENERIC = Generic()
FORMATS: dict[str, ToolCallFormat] = {
    f.name: f
    for f in (
        GENERIC,
        Hermes2Pro(),
        Llama3(builtin_tools=False),
        Llama3(builtin_tools=True),
        MistralNemo(),
        FunctionaryV32(),
        DeepSeekR1(),
        CommandR7B(),
        GptOss(),
        MiniMaxM3(),
        Qwen3Coder(thinking=False),
        Qwen3Coder(thinking=True),
        Gemma4(fold_tool_responses=False),
        Gemma4(fold_tool_responses=True),
    )
}

# (format name, substrings the template source must all contain), in llama.cpp's order of checks.
_SIGNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("DeepSeek R1", ("<｜tool▁calls▁begin｜>",)),
    ("Command R7B", ("<|END_THINKING|><|START_ACTION|>",)),
    ("MiniMax-M3", ("]<]minimax[>[", "<tool_call>", "<invoke name=")),
    ("Hermes 2 Pro", ("<tool_call>",)),
    ("GPT-OSS", ("<|channel|>",)),
    ("Functionary v3.2", (">>>all",)),
    # Functionary v3.1 (`<function=name>` calls on Llama 3.1) has no parser here: the generic format.
    ("Generic", ("<|start_header_id|>", "<function=")),
    ("Llama 3.x with builtin tools", ("<|start_header_id|>ipython<|end_header_id|>", "<|python_tag|>")),
    ("Llama 3.x", ("<|start_header_id|>ipython<|end_header_id|>",)),
)


def detect_format(template_source: str) -> ToolCallFormat:
    """The format llama.cpp would use for this template when a request has tools."""
    for name, signs in _SIGNS[:3]:  # the formats llama.cpp names before these two
        if all(sign in template_source for sign in signs):
            return FORMATS[name]
    for detect in (detect_gemma4, detect_qwen3_coder):  # llama.cpp's specialised templates, in its order
        found = detect(template_source)
        if found is not None:
            return FORMATS[found.name]
    for name, signs in _SIGNS[3:]:
        if all(sign in template_source for sign in signs):
            return FORMATS[name]
    # Newer Mistral templates write `[TOOL_CALLS]name[ARGS]{...}`: not Nemo's array.
    if "[TOOL_CALLS]" in template_source and "[ARGS]" not in template_source:
        return FORMATS["Mistral Nemo"]
    return GENERIC
