"""Gemma 4's call arguments: its own object notation, read into JSON as it streams, and its grammar.

    {city:<|"|>Paris<|"|>,days:2,tags:[<|"|>a<|"|>],opts:{fast:true,limit:null}}

Keys are bare text up to `:`, strings sit between `<|"|>` marks (no escapes), numbers, booleans and null
are JSON's, and objects and arrays nest. As llama.cpp's gemma4_to_json writes them, a key becomes a
JSON string, a string's text is escaped, everything else is copied, and nothing adds spaces.
"""

from __future__ import annotations

import json

import regex

from engine.text.reasoning import partial_suffix
from engine.text.tool_calls.stream import Driver, Next, ParseFailure, State
from engine.text.tool_calls.syntax import Lit, Node, Ref, Regex, Rep, Rule, Space, Until, alt, seq

QUOTE = '<|"|>'
_NUMBER = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"
_SCALAR = regex.compile(_NUMBER + r"|true|false|null")
_WORD = regex.compile(r"[-+.0-9a-zA-Z]+")
_KEY = regex.compile(r"[^:}]+:")
_CLOSERS = {"{": "}", "[": "]"}


class Arguments(State):
    """One object in Gemma 4's notation (the text starts at its `{`), its JSON given to the open call as
    it comes; `then` follows its closing brace. A key, number or literal waits until it is whole; a
    string's text streams."""

    def __init__(self, then: Next) -> None:
        self.then = then
        self.stack: list[str] = []  # the open containers' openers, innermost last
        self.mode = "value"  # value | opened (just after `{` or `[`) | key | after | string

    def step(self, d: Driver) -> bool:
        if self.mode == "string":
            return self._string(d)
        skipped = len(d.buf) - len(d.buf.lstrip())
        if skipped and self.stack:
            d.consume(skipped)
        if not d.buf:
            return False
        if self.mode == "opened":
            if d.buf[0] == _CLOSERS[self.stack[-1]]:
                return self._close(d)
            self.mode = "key" if self.stack[-1] == "{" else "value"
        if self.mode == "key":
            return self._key(d)
        if self.mode == "after":
            return self._after(d)
        return self._value(d)

    def _value(self, d: Driver) -> bool:
        buf = d.buf
        if buf.startswith(QUOTE):
            d.consume(len(QUOTE))
            d.emit.arguments('"')
            self.mode = "string"
            return True
        if buf[0] in _CLOSERS and (self.stack or buf[0] == "{"):
            d.emit.arguments(d.consume(1))
            self.stack.append(buf[0])
            self.mode = "opened"
            return True
        if not self.stack:
            raise ParseFailure("the arguments must be an object")
        if QUOTE.startswith(buf) and not d.final:
            return False
        word = _WORD.match(buf)  # a number or literal runs to the next delimiter
        if word is None:
            raise ParseFailure(f"no value at {buf[:20]!r}")
        if word.end() == len(buf) and not d.final:
            return False  # it may go on
        if not _SCALAR.fullmatch(word.group()):
            raise ParseFailure(f"{word.group()!r} is no value")
        d.emit.arguments(d.consume(word.end()))
        self.mode = "after"
        return True

    def _key(self, d: Driver) -> bool:
        match = _KEY.match(d.buf, partial=not d.final)
        if match is None:
            raise ParseFailure("an object member without its key")
        if match.partial:
            return False
        key = d.consume(match.end())[:-1]
        d.emit.arguments(json.dumps(key, ensure_ascii=False) + ":")
        self.mode = "value"
        return True

    def _string(self, d: Driver) -> bool:
        at = d.buf.find(QUOTE)
        if at >= 0:
            d.emit.arguments(_escaped(d.consume(at)) + '"')
            d.consume(len(QUOTE))
            self.mode = "after"
            return True
        keep = partial_suffix(d.buf, (QUOTE,))
        if keep == len(d.buf):
            return False
        d.emit.arguments(_escaped(d.consume(len(d.buf) - keep)))
        return True

    def _after(self, d: Driver) -> bool:
        if d.buf[0] == ",":
            d.emit.arguments(d.consume(1))
            self.mode = "key" if self.stack[-1] == "{" else "value"
            return True
        if d.buf[0] == _CLOSERS[self.stack[-1]]:
            return self._close(d)
        raise ParseFailure(f"expected ',' or {_CLOSERS[self.stack[-1]]!r}")

    def _close(self, d: Driver) -> bool:
        d.emit.arguments(d.consume(1))
        self.stack.pop()
        self.mode = "after"
        if not self.stack:
            d.state = self.then()
        return True


def _escaped(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)[1:-1]


def object_rule() -> Node:
    """The grammar of an arguments object (llama.cpp's gemma4-dict rules: any keys, any values)."""
    string = seq(Lit(QUOTE), Until(QUOTE), Lit(QUOTE))
    elements = seq(Ref("gemma4_value"), Rep(seq(Lit(","), Space(), Ref("gemma4_value"))))
    array = Rule("gemma4_array", seq(Lit("["), Space(), alt(Lit("]"), seq(elements, Space(), Lit("]")))))
    scalars = (Regex(_NUMBER), Lit("true"), Lit("false"), Lit("null"))
    value = Rule("gemma4_value", alt(string, Ref("gemma4_dict"), array, *scalars))
    member = seq(Regex(r"[^:}]+"), Lit(":"), Space(), value)
    members = seq(member, Rep(seq(Lit(","), Space(), member)))
    return Rule("gemma4_dict", seq(Lit("{"), Space(), alt(Lit("}"), seq(members, Space(), Lit("}")))))
