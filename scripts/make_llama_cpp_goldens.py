"""llama.cpp's own grammar, JSON-schema and chat-parser test cases as data: tests/golden/llama_cpp_cases.json.

    .venv/bin/python scripts/make_llama_cpp_goldens.py [--out tests/golden/llama_cpp_cases.json]

The cases are read out of three C++ test sources of the llama.cpp that llama-cpp-python 0.3.36 vendors
(engine/reference_data.py fetches the sdist; nothing else is needed, nothing is compiled or run):

- `tests/test-grammar-integration.cpp`: every `test_schema(desc, schema, {accepted}, {rejected})` and
  `test_grammar(desc, gbnf, {accepted}, {rejected})` call, and the grammars its `test_failure_*`
  functions expect llama.cpp to refuse;
- `tests/test-json-schema-to-grammar.cpp`: every `test({SUCCESS|FAILURE, name, schema, grammar})`;
- `tests/test-chat.cpp`: the `tst.test(output).tools(...)...expect(...).run()` chains of the PEG-parser
  tests, for the templates whose tool-call format Llamba implements (`TEMPLATES` below), with the
  expected message resolved from the file's helper constants and constructors (`message_assist_call`,
  `simple_assist_msg(...)`, the `common_chat_tool` definitions).

It is a pragmatic reader of the C++ those files are written in, not a C++ parser: a tokenizer that
knows comments, raw strings `R"delim(...)delim"`, escaped strings and character literals, and a small
expression reader for calls, brace lists, `+` concatenation and method chains. Whatever it cannot read
is counted, and the counts (`present`, `extracted`, `not_extracted` with the reason) are written into the
file, so a newer llama.cpp whose tests use a new construct shows up as a drop, not as silence.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.reference_data import SDIST_REQUIREMENT, reference_file  # noqa: E402

OUT = ROOT / "tests" / "golden" / "llama_cpp_cases.json"

# test-chat.cpp's templates whose tool-call format Llamba implements, with that format's name
# (engine/text/tool_calls). Other templates there use formats Llamba does not have (Kimi, GLM, Granite,
# ...), whose cases would test a parser that does not exist here.
TEMPLATES = {
    "models/templates/NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja": "Hermes 2 Pro",
    "models/templates/NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": "Hermes 2 Pro",
    "models/templates/Qwen-Qwen2.5-7B-Instruct.jinja": "Hermes 2 Pro",
    "models/templates/MiMo-VL.jinja": "Hermes 2 Pro",
    "models/templates/Qwen-QwQ-32B.jinja": "Hermes 2 Pro",
    "models/templates/CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja": "Command R7B",
    "models/templates/mistralai-Mistral-Nemo-Instruct-2407.jinja": "Mistral Nemo",
    "models/templates/meetkai-functionary-medium-v3.2.jinja": "Functionary v3.2",
    "models/templates/deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja": "DeepSeek R1",
    "models/templates/llama-cpp-deepseek-r1.jinja": "DeepSeek R1",
    "models/templates/deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": "DeepSeek R1",
    "models/templates/meta-llama-Llama-3.1-8B-Instruct.jinja": "Llama 3.x with builtin tools",
    "models/templates/meta-llama-Llama-3.2-3B-Instruct.jinja": "Llama 3.x",
    "models/templates/meta-llama-Llama-3.3-70B-Instruct.jinja": "Llama 3.x with builtin tools",
    "models/templates/openai-gpt-oss-120b.jinja": "GPT-OSS",
    "models/templates/MiniMax-M3.jinja": "MiniMax-M3",
    "models/templates/Qwen3.5-4B.jinja": "Qwen3-Coder (thinking)",
    "models/templates/Qwen3-Coder.jinja": "Qwen3-Coder",
    "models/templates/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja": "Qwen3-Coder (thinking)",
    "models/templates/google-gemma-4-31B-it.jinja": "Gemma 4",
}


# -- the C++ tokenizer -----------------------------------------------------------------------------

_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<comment>//[^\n]*|/\*.*?\*/)
  | (?P<raw>(?:u8)?R"(?P<delim>[^()\\\s]{0,16})\((?P<body>.*?)\)(?P=delim)")
  | (?P<str>(?:u8)?"(?:[^"\\\n]|\\.)*")
  | (?P<char>'(?:[^'\\\n]|\\.)+')
  | (?P<ident>[A-Za-z_]\w*)
  | (?P<num>\d[\w.']*)
  | (?P<punct>::|->|&&|\|\||==|!=|<=|>=|\+\+|--|[-+*/%<>=!&|^~?:;,.(){}\[\]\#])
    """,
    re.S | re.X,
)
_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]+|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[0-7]{1,3}|.)", re.S)
_SIMPLE_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "a": "\a", "b": "\b", "f": "\f", "v": "\v"}


@dataclass(frozen=True)
class Tok:
    kind: str  # str, char, ident, num, punct
    value: str  # a string literal's decoded value; else the source text
    line: int


def tokenize(source: str) -> list[Tok]:
    tokens, pos, line = [], 0, 1
    while pos < len(source):
        found = _TOKEN.match(source, pos)
        if found is None:
            raise ValueError(f"line {line}: cannot read {source[pos : pos + 20]!r}")
        kind = found.lastgroup if found.lastgroup not in ("delim", "body") else "raw"
        text = found.group()
        if found.group("raw") is not None:
            tokens.append(Tok("str", found.group("body"), line))
        elif kind == "str":
            tokens.append(Tok("str", _unescape(text[text.index('"') + 1 : -1]), line))
        elif kind not in ("space", "comment"):
            tokens.append(Tok(kind or "punct", text, line))
        line += text.count("\n")
        pos = found.end()
    return tokens


def _unescape(body: str) -> str:
    """A C string literal's bytes (UTF-8 text as the source holds it; \\x escapes are bytes)."""
    out = bytearray()
    last = 0
    for esc in _ESCAPE.finditer(body):
        out += body[last : esc.start()].encode()
        code = esc.group(1)
        if code[0] == "x":
            out.append(int(code[1:], 16) & 0xFF)
        elif code[0] in "uU" and len(code) > 1:
            out += chr(int(code[1:], 16)).encode()
        elif code.isdigit():
            out.append(int(code, 8) & 0xFF)
        else:
            out += _SIMPLE_ESCAPES.get(code, code).encode()
        last = esc.end()
    out += body[last:].encode()
    return out.decode("utf-8", errors="surrogateescape")


# -- a small expression reader -----------------------------------------------------------------------


@dataclass
class Call:
    name: str
    args: list[Any]
    braces: bool = False  # `Name{...}` (an aggregate) rather than `name(...)`


@dataclass
class Name:
    name: str


@dataclass
class Concat:
    parts: list[Any]


@dataclass
class Chain:
    base: Any
    calls: list[Call] = field(default_factory=list)


class Unreadable(ValueError):
    pass


class Reader:
    """Expressions over the token list: literals, names, calls, brace lists, `+`, `.method(...)`."""

    def __init__(self, tokens: list[Tok], pos: int = 0) -> None:
        self.tokens, self.pos = tokens, pos

    def peek(self, offset: int = 0) -> Tok | None:
        i = self.pos + offset
        return self.tokens[i] if i < len(self.tokens) else None

    def take(self, value: str | None = None) -> Tok:
        tok = self.peek()
        if tok is None or (value is not None and tok.value != value):
            raise Unreadable(f"expected {value!r} at line {tok.line if tok else 'EOF'}, got {tok}")
        self.pos += 1
        return tok

    def at(self, value: str) -> bool:
        tok = self.peek()
        return tok is not None and tok.kind == "punct" and tok.value == value

    def expr(self) -> Any:
        parts = [self.postfix()]
        while self.at("+"):
            self.take()
            parts.append(self.postfix())
        return parts[0] if len(parts) == 1 else Concat(parts)

    def postfix(self) -> Any:
        base = self.primary()
        calls = []
        while self.at(".") or self.at("->"):
            self.take()
            name = self.take().value
            self.take("(")
            calls.append(Call(name, self.items(")")))
        return Chain(base, calls) if calls else base

    def primary(self) -> Any:
        tok = self.peek()
        if tok is None:
            raise Unreadable("unexpected end")
        if tok.kind == "str":
            text = ""
            while (t := self.peek()) is not None and t.kind == "str":
                text += self.take().value
            return text
        if tok.kind == "num":
            self.take()
            return _number(tok.value)
        if tok.kind == "char":
            self.take()
            return _unescape(tok.value[1:-1])
        if self.at("-") and (n := self.peek(1)) is not None and n.kind == "num":
            self.take()
            return -_number(self.take().value)
        if self.at("{"):
            self.take()
            return self.items("}")
        if self.at("("):
            self.take()
            inner = self.expr()
            self.take(")")
            return inner
        if tok.kind == "ident":
            name = self.qualified()
            if self.at("("):
                self.take()
                return Call(name, self.items(")"))
            if self.at("{"):
                self.take()
                return Call(name, self.items("}"), braces=True)
            return Name(name)
        raise Unreadable(f"line {tok.line}: cannot read {tok.value!r}")

    def qualified(self) -> str:
        name = self.take().value
        while self.at("::"):
            self.take()
            name += "::" + self.take().value
        if self.at("<") and name.startswith("std::"):  # std::vector<...>{...}: the type's arguments go
            depth = 0
            while True:
                tok = self.take()
                depth += tok.value == "<"
                depth -= tok.value == ">"
                if depth == 0:
                    break
        return name

    def items(self, close: str) -> list[Any]:
        items = []
        while not self.at(close):
            items.append(self.expr())
            if not self.at(close):
                self.take(",")
        self.take(close)
        return items


def _number(text: str) -> int | float:
    text = text.replace("'", "").rstrip("uUlLfF")
    try:
        return int(text, 0)
    except ValueError:
        return float(text)


def calls_named(tokens: list[Tok], name: str, start: int = 0, end: int | None = None) -> list[int]:
    """Token positions of `name(` where it is called, not declared (no type name right before it)."""
    end = len(tokens) if end is None else end
    found = []
    for i in range(start, end - 1):
        tok = tokens[i]
        if tok.kind == "ident" and tok.value == name and tokens[i + 1].value == "(":
            before = tokens[i - 1] if i else None
            if before is not None and before.kind == "ident" and before.value in ("void", "bool", "auto"):
                continue
            found.append(i)
    return found


def function_body(tokens: list[Tok], name: str) -> tuple[int, int]:
    """The token range inside the braces of the function `name`'s definition."""
    for i, tok in enumerate(tokens):
        if tok.kind == "ident" and tok.value == name and i and tokens[i - 1].value in ("void", "bool"):
            j = i
            while tokens[j].value != "{":
                j += 1
            return j + 1, matching(tokens, j)
    raise ValueError(f"no function {name}")


def matching(tokens: list[Tok], open_at: int) -> int:
    pairs = {"{": "}", "(": ")", "[": "]"}
    close, depth = pairs[tokens[open_at].value], 0
    for j in range(open_at, len(tokens)):
        if tokens[j].kind != "punct":
            continue
        depth += tokens[j].value == tokens[open_at].value
        depth -= tokens[j].value == close
        if depth == 0:
            return j
    raise ValueError("unbalanced")


def text_of(value: Any) -> Any:
    """A string expression as data: text, or a list of text pieces and {"token": id} where llama.cpp's
    test writes token(id) (a token the grammar names as `<[id]>`)."""
    if isinstance(value, str):
        return value
    if isinstance(value, Call) and value.name == "token" and len(value.args) == 1:
        return [{"token": value.args[0]}]
    if isinstance(value, Concat):
        pieces: list[Any] = []
        for part in value.parts:
            piece = text_of(part)
            pieces.extend([piece] if isinstance(piece, str) else piece)
        merged: list[Any] = []
        for piece in pieces:
            if isinstance(piece, str) and merged and isinstance(merged[-1], str):
                merged[-1] += piece
            elif piece != "":
                merged.append(piece)
        return merged[0] if len(merged) == 1 and isinstance(merged[0], str) else merged
    raise Unreadable(f"not a string expression: {value!r}")


# -- test-grammar-integration.cpp --------------------------------------------------------------------


def grammar_integration(path: Path) -> dict[str, Any]:
    tokens = tokenize(path.read_text())
    cases, skipped = [], []
    present = {}
    for kind, fn in (("schema", "test_schema"), ("gbnf", "test_grammar")):
        positions = calls_named(tokens, fn)
        present[fn] = len(positions)
        for i in positions:
            try:
                reader = Reader(tokens, i + 2)
                desc, source, accepted, rejected = reader.items(")")
                cases.append(
                    {
                        "kind": kind,
                        "name": text_of(desc),
                        "source": text_of(source),
                        "accept": [text_of(s) for s in accepted],
                        "reject": [text_of(s) for s in rejected],
                        "line": tokens[i].line,
                    }
                )
            except (Unreadable, ValueError) as exc:
                skipped.append({"call": fn, "line": tokens[i].line, "why": str(exc)})
    refused = refused_grammars(tokens)
    return {
        "file": "tests/test-grammar-integration.cpp",
        "present": present,
        "extracted": {
            "test_schema": sum(c["kind"] == "schema" for c in cases),
            "test_grammar": sum(c["kind"] == "gbnf" for c in cases),
            "refused": len(refused),
        },
        "not_extracted": skipped,
        "cases": cases,
        "refused": refused,
    }


def refused_grammars(tokens: list[Tok]) -> list[dict[str, Any]]:
    """The grammars the `test_failure_*` functions (and the custom-root check) expect llama.cpp to
    refuse with the default root rule `root`: missing root, a reference to an undefined rule, left
    recursion."""
    refused = []
    for fn in (
        "test_failure_missing_root",
        "test_failure_missing_reference",
        "test_failure_left_recursion",
        "test_custom_root_symbol_check",
    ):
        start, end = function_body(tokens, fn)
        local: dict[str, str] = {}
        for i in range(start, end):
            tok = tokens[i]
            if tok.kind == "ident" and tokens[i + 1].value == "=" and tokens[i + 2].kind == "str":
                local[tok.value] = Reader(tokens, i + 2).expr()
        if fn == "test_failure_left_recursion":
            for i in calls_named(tokens, "test_build_grammar_fails", start, end):
                arg = tokens[i + 2]
                refused.append({"name": f"left recursion ({arg.value})", "gbnf": local[arg.value]})
        else:
            [(var, grammar)] = local.items()
            refused.append({"name": fn.removeprefix("test_failure_").replace("_", " "), "gbnf": grammar})
    return refused


# -- test-json-schema-to-grammar.cpp -----------------------------------------------------------------


def json_schema_to_grammar(path: Path) -> dict[str, Any]:
    tokens = tokenize(path.read_text())
    start, end = function_body(tokens, "test_all")
    cases, skipped, present = [], [], 0
    for i in calls_named(tokens, "test", start, end):
        if tokens[i + 2].value != "{":
            continue
        present += 1
        try:
            status, name, schema, grammar = Reader(tokens, i + 3).items("}")
            cases.append(
                {
                    "name": name,
                    "status": status.name.lower(),
                    "schema": schema,
                    "grammar": grammar,
                    "line": tokens[i].line,
                }
            )
        except (Unreadable, ValueError) as exc:
            skipped.append({"line": tokens[i].line, "why": str(exc)})
    return {
        "file": "tests/test-json-schema-to-grammar.cpp",
        "present": present,
        "extracted": len(cases),
        "not_extracted": skipped,
        "note": "main()'s two blocks after test_all (a parsed document, a sub-schema $ref) test the C++ "
        "API (common_chat_schema_from_json, build_grammar), not a schema's verdict: not cases here",
        "cases": cases,
    }


# -- test-chat.cpp -----------------------------------------------------------------------------------

# common_reasoning_format and common_chat_continuation, as names.
_ENUMS = {
    "COMMON_REASONING_FORMAT_NONE": "none",
    "COMMON_REASONING_FORMAT_AUTO": "auto",
    "COMMON_REASONING_FORMAT_DEEPSEEK": "deepseek",
    "COMMON_REASONING_FORMAT_DEEPSEEK_LEGACY": "deepseek-legacy",
    "COMMON_CHAT_CONTINUATION_CONTENT": "content",
    "COMMON_CHAT_CONTINUATION_REASONING": "reasoning",
    "COMMON_CHAT_TOOL_CHOICE_AUTO": "auto",
    "COMMON_CHAT_TOOL_CHOICE_REQUIRED": "required",
    "COMMON_CHAT_TOOL_CHOICE_NONE": "none",
}


def assist_msg(content: str, reasoning: str = "", name: str = "", arguments: str = "", id_: str = "") -> dict:
    """test-chat.cpp's simple_assist_msg: one call when a name or an id is given."""
    calls = [{"name": name, "arguments": arguments, "id": id_}] if name or id_ else []
    return {"role": "assistant", "content": content, "reasoning_content": reasoning, "tool_calls": calls}


class ChatScope:
    """The values test-chat.cpp's cases name: tools, messages, schemas, and its message constructors."""

    def __init__(self, tokens: list[Tok]) -> None:
        self.tools: dict[str, dict[str, Any]] = {}
        self.values: dict[str, Any] = {}
        for i, tok in enumerate(tokens[:-2]):
            if tok.kind != "ident" or tokens[i + 1].value not in ("{", "="):
                continue
            declared_as = tokens[i - 1].value if i else ""
            try:
                if declared_as == "common_chat_tool" and tokens[i + 1].value == "{":
                    name, description, parameters = Reader(tokens, i + 2).items("}")
                    self.tools[tok.value] = {
                        "name": name,
                        "description": description,
                        "parameters": parameters,
                    }
                elif declared_as == "common_chat_msg" and tokens[i + 1].value == "=":
                    self.values[tok.value] = self.value(Reader(tokens, i + 2).expr())
                elif declared_as == "common_chat_msg" and tokens[i + 1].value == "{":
                    self.values[tok.value] = self.message(Reader(tokens, i + 2).items("}"))
                elif declared_as == "*" and tokens[i + 1].value == "=" and tokens[i + 2].kind == "str":
                    self.values[tok.value] = Reader(tokens, i + 2).expr()  # const char * x = R"(...)"
            except (Unreadable, ValueError, TypeError):
                continue

    def message(self, fields: list[Any]) -> dict[str, Any]:
        """A common_chat_msg aggregate: role, content, content_parts, tool_calls, reasoning_content."""
        role, content, parts, calls, reasoning = (fields + [None] * 5)[:5]
        if parts:
            raise Unreadable("content parts")
        return {
            "role": role,
            "content": content,
            "reasoning_content": reasoning or "",
            "tool_calls": [self.tool_call(c) for c in calls or []],
        }

    @staticmethod
    def tool_call(fields: list[Any]) -> dict[str, str]:
        name, arguments, id_ = (list(fields) + ["", ""])[:3]
        return {"name": name, "arguments": arguments, "id": id_}

    def value(self, expr: Any) -> Any:
        if isinstance(expr, (str, int, float)):
            return expr
        if isinstance(expr, Concat):
            return "".join(self.value(p) for p in expr.parts)
        if isinstance(expr, Name):
            if expr.name in _ENUMS:
                return _ENUMS[expr.name]
            if expr.name in ("true", "false"):
                return expr.name == "true"
            if expr.name in self.tools:
                return self.tools[expr.name]
            if expr.name in self.values:
                return self.values[expr.name]
            raise Unreadable(f"unknown name {expr.name}")
        if isinstance(expr, list):
            return [self.value(e) for e in expr]
        if isinstance(expr, Call) and not expr.braces:
            args = [self.value(a) for a in expr.args]
            return self.construct(expr.name, args)
        if isinstance(expr, Call) and expr.name == "common_chat_msg":
            return self.message([self.value(a) for a in expr.args])
        raise Unreadable(f"cannot evaluate {expr!r}")

    def construct(self, name: str, args: list[Any]) -> Any:
        if name == "simple_assist_msg":
            return assist_msg(*args)
        if name == "message_with_tool_calls":
            return assist_msg("", "", args[0], args[1])
        if name in ("message_with_tool_calls_and_reasoning",):
            return assist_msg("", args[2], args[0], args[1])
        if name in ("message_with_reasoning_and_tool_call",):
            return assist_msg("", args[0], args[1], args[2])
        if name == "message_with_content_and_tool_call":
            return assist_msg(args[0], "", args[1], args[2])
        if name == "message_with_reasoning_content_and_multiple_tool_calls":
            message = assist_msg(args[1], args[0])
            message["tool_calls"] = [{"name": n, "arguments": a, "id": ""} for n, a in args[2]]
            return message
        if name == "std::string":
            return args[0]
        raise Unreadable(f"unknown constructor {name}")


def chat_cases(path: Path) -> dict[str, Any]:
    tokens = tokenize(path.read_text())
    scope = ChatScope(tokens)
    start, end = function_body(tokens, "test_template_output_peg_parsers")
    body = tokens[start:end]
    cases, skipped, present_all = [], [], 0
    for template_paths, tester, block in tester_blocks(body):
        local = dict(scope.values)
        for i, tok in enumerate(block):
            with contextlib.suppress(Unreadable, IndexError):
                _local_message(scope, block, i, local)
            if (
                tok.kind == "ident"
                and i + 2 < len(block)
                and block[i + 1].value == "="
                and block[i + 2].kind == "str"
            ):
                with contextlib.suppress(Unreadable):
                    local[tok.value] = scope.value(Reader(block, i + 2).expr())
            if not (tok.value == tester and block[i + 1].value == "." and block[i + 2].value == "test"):
                continue
            present_all += len(template_paths)
            implemented = [p for p in template_paths if p in TEMPLATES]
            if not implemented:
                continue
            try:
                chain = Reader(block, i).expr()
                saved, scope.values = scope.values, local
                try:
                    case = chat_case(scope, chain)
                finally:
                    scope.values = saved
            except (Unreadable, ValueError, TypeError, IndexError) as exc:
                skipped.extend({"template": p, "line": tok.line, "why": str(exc)} for p in implemented)
                continue
            for template in implemented:
                cases.append({"template": template, "format": TEMPLATES[template], "line": tok.line, **case})
    return {
        "file": "tests/test-chat.cpp",
        "function": "test_template_output_peg_parsers",
        "present": {
            "all_templates": present_all,
            "implemented_formats": len(cases) + len(skipped),
        },
        "extracted": len(cases),
        "not_extracted": skipped,
        "tools": {tool["name"]: tool for tool in scope.tools.values()},
        "cases": cases,
    }


_MESSAGE_FIELDS = ("role", "content", "reasoning_content", "tool_call_id", "tool_name")


def _local_message(scope: ChatScope, block: list[Tok], i: int, local: dict[str, Any]) -> None:
    """A message a test builds field by field: `common_chat_msg NAME;` then `NAME.role = "tool";`..."""
    tok = block[i]
    if tok.value == "common_chat_msg" and block[i + 1].kind == "ident" and block[i + 2].value == ";":
        local[block[i + 1].value] = {"role": "", **assist_msg(""), "role_set": True}
    elif (
        tok.kind == "ident"
        and isinstance(local.get(tok.value), dict)
        and local[tok.value].get("role_set")
        and block[i + 1].value == "."
        and block[i + 2].value in _MESSAGE_FIELDS
        and block[i + 3].value == "="
    ):
        local[tok.value][block[i + 2].value] = scope.value(Reader(block, i + 4).expr())


def openai_message(message: dict[str, Any]) -> dict[str, Any]:
    """A test's message as llama.cpp hands it to a template (to_json_oaicompat): calls as OpenAI calls,
    a tool result's call id; the fields it leaves empty out."""
    out = {k: v for k, v in message.items() if k != "role_set"}
    if out.get("tool_calls"):
        out["tool_calls"] = [
            {
                "type": "function",
                "function": {"name": c["name"], "arguments": c["arguments"]},
                **({"id": c["id"]} if c.get("id") else {}),
            }
            for c in out["tool_calls"]
        ]
    for key in ("tool_call_id", "tool_name"):
        if not out.get(key, True):
            del out[key]
    return out


def tester_blocks(body: list[Tok]) -> list[tuple[list[str], str, list[Tok]]]:
    """Each `auto NAME = peg_tester(path, ...)` and the tokens of its enclosing block; a path from a
    `for (const auto & path : {...})` loop stands for each of the loop's paths."""
    blocks = []
    for i, tok in enumerate(body):
        if not (tok.value == "peg_tester" and body[i + 1].value == "(" and body[i - 1].value == "="):
            continue
        tester = body[i - 2].value
        first = body[i + 2]
        open_at = i
        depth = 0
        while open_at > 0:  # the `{` that opens the block holding this declaration
            open_at -= 1
            depth += body[open_at].value == "}"
            if body[open_at].value == "{":
                if depth == 0:
                    break
                depth -= 1
        block = body[open_at : matching(body, open_at) + 1]
        if first.kind == "str":
            paths = [first.value]
        else:  # the loop variable: the loop's brace list just before the block
            j = open_at - 1
            while body[j].value != "for":
                j -= 1
            loop = body[j:open_at]
            paths = [t.value for t in loop if t.kind == "str"]
        blocks.append((paths, tester, block))
    return blocks


def chat_case(scope: ChatScope, chain: Any) -> dict[str, Any]:
    """One fluent test: the input, the request's parameters, and the expected message."""
    if not isinstance(chain, Chain) or chain.calls[0].name != "test" or chain.calls[-1].name != "run":
        raise Unreadable("not a tst.test(...)...run() chain")
    params: dict[str, Any] = {}
    expect = assist_msg("")
    for call in chain.calls[:-1]:
        args = [scope.value(a) for a in call.args]
        if call.name == "test":
            params["input"] = args[0]
        elif call.name == "tools":
            # A tool the file defines is named; one written in the test itself is given whole.
            fields = ("name", "description", "parameters")
            params["tools"] = [
                t["name"] if isinstance(t, dict) else dict(zip(fields, t, strict=True)) for t in args[0]
            ]
        elif call.name == "messages":
            params["messages"] = [openai_message(m) for m in args[0]]
        elif call.name == "expect":
            expect = json.loads(json.dumps(args[0]))
        elif call.name == "expect_content":
            expect["content"] = args[0]
        elif call.name == "expect_reasoning":
            expect["reasoning_content"] = args[0]
        elif call.name == "expect_tool_calls":
            expect["tool_calls"] = [ChatScope.tool_call(c) for c in args[0]]
        elif call.name == "expect_reconstruction":
            continue  # llama.cpp re-renders the message through the template: not a parse
        elif call.name in (
            "reasoning_format",
            "enable_thinking",
            "parallel_tool_calls",
            "add_generation_prompt",
            "continue_final_message",
            "json_schema",
            "is_partial",
            "tool_choice",
        ):
            params[call.name] = args[0]
        else:
            raise Unreadable(f"unknown setter .{call.name}()")
    return {**params, "expect": expect}


# -- the file ----------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    data = {
        "source": f"llama.cpp as vendored in {SDIST_REQUIREMENT} (its sdist on PyPI)",
        "made_by": "scripts/make_llama_cpp_goldens.py",
        "grammar_integration": grammar_integration(reference_file("tests/test-grammar-integration.cpp")),
        "json_schema_to_grammar": json_schema_to_grammar(
            reference_file("tests/test-json-schema-to-grammar.cpp")
        ),
        "chat": chat_cases(reference_file("tests/test-chat.cpp")),
    }
    args.out.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    for section in ("grammar_integration", "json_schema_to_grammar", "chat"):
        part = data[section]
        print(
            f"{section}: present {part['present']}, extracted {part['extracted']}, "
            f"not extracted {len(part['not_extracted'])}"
        )
        for miss in part["not_extracted"]:
            print("   ", miss)


if __name__ == "__main__":
    main()
