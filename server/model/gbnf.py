"""llama.cpp's GBNF read as llama.cpp reads it (src/llama-grammar.cpp), written as an llguidance Lark grammar.

llguidance ships its own GBNF converter, but it misses parts of llama.cpp's syntax that requests use:
token references `<[id]>` and their negation `!<[id]>` (a grammar over a model's special tokens), the
escape `\\-`, a repetition of a repetition (`( [x]* )*` came out as the invalid `/[x]/**`), and llama.cpp's
refusals (left recursion, which an Earley parser would happily run). This reader follows llama.cpp's
grammar parser: rules `name ::= alternatives` (a newline ends a rule outside parentheses), literals and
character classes with llama.cpp's escapes (\\x \\u \\U \\t \\r \\n \\\\ \\" \\[ \\] \\-), `.` (any
character), rule references, groups, `*` `+` `?` `{m}` `{m,}` `{m,n}`, tokens `<[id]>` / `<text>` and `!`
before them, `#` comments. It refuses what llama.cpp refuses: a syntax error, an undefined rule, no `root`,
left recursion (directly or through rules that can be empty).

As llguidance's converter does, a rule that is a regular language (no tokens, no recursion) becomes one
Lark terminal, which keeps masks fast; the rest are Lark rules. A grammar that starts with
`%llguidance` is Lark already (llama.cpp's own convention) and is left to the engine.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from engine.grammar import GrammarError, GrammarSpec, Trigger

_WORD = re.compile(r"[a-zA-Z0-9_-]+")
_REPEAT_LIMIT = 2000  # llama.cpp's MAX_REPETITION_THRESHOLD


def gbnf_spec(text: str, triggers: list[Trigger] | tuple[Trigger, ...] = ()) -> GrammarSpec:
    """The GrammarSpec of a GBNF grammar as llama.cpp reads it; GrammarError names what is wrong."""
    if text.lstrip().startswith("%llguidance"):
        return GrammarSpec.gbnf(text, triggers)
    return GrammarSpec.lark(gbnf_to_lark(text), triggers)


def gbnf_to_lark(text: str) -> str:
    rules = _Parser(text).rules()
    if "root" not in rules:
        raise GrammarError("invalid GBNF grammar: the grammar has no 'root' rule")
    for name, body in rules.items():
        for ref in _refs(body):
            if ref not in rules:
                raise GrammarError(f"invalid GBNF grammar: rule '{name}' names the undefined rule '{ref}'")
    _check_left_recursion(rules)
    return _LarkWriter(rules).grammar()


# -- the syntax tree -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Chars:
    """A literal (`negated` None), a character class, or `.` (an empty negated class)."""

    items: tuple[tuple[int, int], ...]  # code point ranges
    negated: bool | None = None  # None: a literal string of these code points, in order


@dataclass(frozen=True)
class Token:
    ref: str  # "[12]" or the text between < and >
    negated: bool = False


@dataclass(frozen=True)
class Ref:
    name: str


@dataclass(frozen=True)
class Seq:
    items: tuple[Node, ...]


@dataclass(frozen=True)
class Alt:
    options: tuple[Node, ...]


@dataclass(frozen=True)
class Repeat:
    item: Node
    low: int
    high: int | None


Node = Chars | Token | Ref | Seq | Alt | Repeat


# -- llama.cpp's reading ---------------------------------------------------------------------------


@dataclass
class _Parser:
    text: str
    pos: int = 0

    def fail(self, what: str) -> GrammarError:
        line = self.text.count("\n", 0, self.pos) + 1
        near = self.text[self.pos : self.pos + 20]
        return GrammarError(f"invalid GBNF grammar: {what} at line {line}, near {near!r}")

    def rules(self) -> dict[str, Node]:
        rules: dict[str, Node] = {}
        self.space(newlines=True)
        while self.pos < len(self.text):
            name = self.name()
            self.space(newlines=False)
            if not self.text.startswith("::=", self.pos):
                raise self.fail("expecting ::=")
            self.pos += 3
            self.space(newlines=True)
            rules[name] = self.alternatives(nested=False)
            if self.pos < len(self.text) and self.text[self.pos] not in "\r\n":
                raise self.fail("expecting newline or end")
            self.space(newlines=True)
        return rules

    def space(self, newlines: bool) -> None:
        text = self.text
        while self.pos < len(text):
            c = text[self.pos]
            if c == "#":
                while self.pos < len(text) and text[self.pos] not in "\r\n":
                    self.pos += 1
            elif c in " \t" or (newlines and c in "\r\n"):
                self.pos += 1
            else:
                break

    def name(self) -> str:
        found = _WORD.match(self.text, self.pos)
        if found is None:
            raise self.fail("expecting name")
        self.pos = found.end()
        return found.group()

    def alternatives(self, nested: bool) -> Node:
        options = [self.sequence(nested)]
        while self.pos < len(self.text) and self.text[self.pos] == "|":
            self.pos += 1
            self.space(newlines=True)
            options.append(self.sequence(nested))
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def sequence(self, nested: bool) -> Node:
        items: list[Node] = []
        while self.pos < len(self.text):
            c = self.text[self.pos]
            if c in "*+?{":
                if not items:
                    raise self.fail("expecting preceding item to */+/?/{")
                items[-1] = self.repeat(items[-1], nested)
                continue
            item = self.element(c, nested)
            if item is None:
                break
            items.append(item)
            self.space(nested)
        return items[0] if len(items) == 1 else Seq(tuple(items))

    def element(self, c: str, nested: bool) -> Node | None:
        if c == '"':
            self.pos += 1
            chars = []
            while not self.text.startswith('"', self.pos):
                chars.append(self.char())
            self.pos += 1
            return Chars(tuple((ch, ch) for ch in chars))
        if c == "[":
            return self.char_class()
        if c in "<!":
            return self.token()
        if c == "(":
            self.pos += 1
            self.space(newlines=True)
            inner = self.alternatives(nested=True)
            if not self.text.startswith(")", self.pos):
                raise self.fail("expecting ')'")
            self.pos += 1
            return inner
        if c == ".":
            self.pos += 1
            return Chars((), negated=True)
        if _WORD.match(c):
            return Ref(self.name())
        return None

    def char(self) -> int:
        if self.pos >= len(self.text):
            raise self.fail("unexpected end of input")
        c = self.text[self.pos]
        if c != "\\":
            self.pos += 1
            return ord(c)
        kind = self.text[self.pos + 1 : self.pos + 2]
        digits = {"x": 2, "u": 4, "U": 8}.get(kind)
        if digits:
            hex_part = self.text[self.pos + 2 : self.pos + 2 + digits]
            if len(hex_part) != digits or not all(h in "0123456789abcdefABCDEF" for h in hex_part):
                raise self.fail(f"expecting {digits} hex chars")
            self.pos += 2 + digits
            return int(hex_part, 16)
        simple = {"t": "\t", "r": "\r", "n": "\n", "\\": "\\", '"': '"', "[": "[", "]": "]", "-": "-"}
        if kind not in simple:
            raise self.fail("unknown escape")
        self.pos += 2
        return ord(simple[kind])

    def char_class(self) -> Node:
        self.pos += 1
        negated = self.text.startswith("^", self.pos)
        self.pos += negated
        items = []
        while not self.text.startswith("]", self.pos):
            low = self.char()
            high = low
            if self.text.startswith("-", self.pos) and not self.text.startswith("-]", self.pos):
                self.pos += 1
                high = self.char()
            items.append((low, high))
        self.pos += 1
        return Chars(tuple(items), negated)

    def token(self) -> Node:
        negated = self.text.startswith("!", self.pos)
        self.pos += negated
        if not self.text.startswith("<", self.pos):
            raise self.fail("expecting '<'")
        end = self.text.find(">", self.pos)
        if end < 0:
            raise self.fail("expecting '>'")
        ref = self.text[self.pos + 1 : end]
        if ref.startswith("[") and not re.fullmatch(r"\[\d+\]", ref):
            raise self.fail("expecting a token id as <[id]>")
        self.pos = end + 1
        return Token(ref, negated)

    def repeat(self, item: Node, nested: bool) -> Node:
        c = self.text[self.pos]
        self.pos += 1
        self.space(nested)
        if c != "{":
            low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
            return Repeat(item, low, high)
        low = self.integer()
        self.space(nested)
        high: int | None = low
        if self.text.startswith(",", self.pos):
            self.pos += 1
            self.space(nested)
            high = self.integer() if self.text[self.pos : self.pos + 1].isdigit() else None
            self.space(nested)
        if not self.text.startswith("}", self.pos):
            raise self.fail("expecting '}'")
        self.pos += 1
        self.space(nested)
        if low > _REPEAT_LIMIT:
            raise self.fail("number of repetitions exceeds sane defaults")
        return Repeat(item, low, None if high is not None and high > _REPEAT_LIMIT else high)

    def integer(self) -> int:
        found = re.compile(r"\d+").match(self.text, self.pos)
        if found is None:
            raise self.fail("expecting an int")
        self.pos = found.end()
        return int(found.group())


def _refs(node: Node) -> list[str]:
    if isinstance(node, Ref):
        return [node.name]
    if isinstance(node, Seq):
        return [r for item in node.items for r in _refs(item)]
    if isinstance(node, Alt):
        return [r for option in node.options for r in _refs(option)]
    if isinstance(node, Repeat):
        return _refs(node.item)
    return []


# -- llama.cpp's refusal of left recursion -----------------------------------------------------------


def _check_left_recursion(rules: dict[str, Node]) -> None:
    """llama.cpp refuses a rule that can reach itself before consuming anything (through rules that
    can be empty too): its recursive-descent stacks would never end."""
    nullable: dict[str, bool] = {}
    changed = True
    while changed:  # the rules that can match the empty string, to a fixed point
        changed = False
        for name, body in rules.items():
            if not nullable.get(name) and _nullable(body, nullable):
                nullable[name] = changed = True
    first = {name: set(_left_refs(body, nullable)) for name, body in rules.items()}
    for start in rules:
        seen, todo = set(), list(first[start])
        while todo:
            name = todo.pop()
            if name == start:
                raise GrammarError(f"invalid GBNF grammar: rule '{start}' is left-recursive")
            if name not in seen:
                seen.add(name)
                todo.extend(first.get(name, ()))


def _nullable(node: Node, nullable: dict[str, bool]) -> bool:
    if isinstance(node, Chars):
        return node.negated is None and not node.items
    if isinstance(node, Token):
        return False
    if isinstance(node, Ref):
        return nullable.get(node.name, False)
    if isinstance(node, Seq):
        return all(_nullable(item, nullable) for item in node.items)
    if isinstance(node, Alt):
        return any(_nullable(option, nullable) for option in node.options)
    return node.low == 0 or _nullable(node.item, nullable)


def _left_refs(node: Node, nullable: dict[str, bool]) -> list[str]:
    """The rules `node` may start with (before any character)."""
    if isinstance(node, Ref):
        return [node.name]
    if isinstance(node, Seq):
        found = []
        for item in node.items:
            found += _left_refs(item, nullable)
            if not _nullable(item, nullable):
                break
        return found
    if isinstance(node, Alt):
        return [r for option in node.options for r in _left_refs(option, nullable)]
    if isinstance(node, Repeat):
        return _left_refs(node.item, nullable)
    return []


# -- Lark ----------------------------------------------------------------------------------------------


@dataclass
class _LarkWriter:
    rules: dict[str, Node]
    names: dict[str, str] = field(default_factory=dict)
    terminal: set[str] = field(default_factory=set)

    def grammar(self) -> str:
        changed = True
        while changed:  # regular rules (no tokens, no recursion) become terminals, to a fixed point
            changed = False
            for name, body in self.rules.items():
                if name != "root" and name not in self.terminal and self.regular(body):
                    self.terminal.add(name)
                    changed = True
        used: set[str] = set()
        for name in self.rules:
            base = "start" if name == "root" else re.sub(r"[^a-z0-9_]", "_", name.lower()).strip("_") or "r"
            base = "r" + base if base[0].isdigit() else base
            base = base.upper() if name in self.terminal else base
            while base in used or (base != "start" and base.lower() == "start"):
                base += "_"
            used.add(base)
            self.names[name] = base
        lines = [f"{self.names[name]}: {self.expr(body)}" for name, body in self.rules.items()]
        return "%llguidance {}\n\n" + "\n".join(lines) + "\n"

    def regular(self, node: Node) -> bool:
        if isinstance(node, Chars):
            return True
        if isinstance(node, Token):
            return False
        if isinstance(node, Ref):
            return node.name in self.terminal
        if isinstance(node, Seq):
            return all(self.regular(item) for item in node.items)
        if isinstance(node, Alt):
            return all(self.regular(option) for option in node.options)
        return self.regular(node.item)

    def expr(self, node: Node) -> str:
        if isinstance(node, Chars):
            return _chars(node)
        if isinstance(node, Token):
            inner = node.ref if not node.negated else f"[^{node.ref[1:-1]}]"
            if node.negated and not node.ref.startswith("["):
                raise GrammarError("invalid GBNF grammar: only <[id]> tokens can be negated here")
            return f"<{inner}>"
        if isinstance(node, Ref):
            return self.names[node.name]
        if isinstance(node, Seq):
            return " ".join(self.expr(item) for item in node.items) if node.items else '""'
        if isinstance(node, Alt):
            return "(" + " | ".join(self.expr(option) for option in node.options) + ")"
        inner = self.expr(node.item)
        if isinstance(node.item, (Seq, Repeat)) or (
            isinstance(node.item, Chars) and node.item.negated is None
        ):
            inner = f"({inner})"
        return inner + _quantifier(node.low, node.high)


def _quantifier(low: int, high: int | None) -> str:
    if (low, high) == (0, None):
        return "*"
    if (low, high) == (1, None):
        return "+"
    if (low, high) == (0, 1):
        return "?"
    return f"{{{low},}}" if high is None else f"{{{low},{high}}}"


def _chars(node: Chars) -> str:
    if node.negated is None:
        return json.dumps("".join(chr(c) for c, _ in node.items), ensure_ascii=False) if node.items else '""'
    ranges = "".join(
        _class_char(low) + ("" if low == high else "-" + _class_char(high)) for low, high in node.items
    )
    if node.negated and not ranges:
        return r"/(?s:.)/"
    return f"/[{'^' if node.negated else ''}{ranges}]/"


def _class_char(code: int) -> str:
    """A code point inside a Rust regex class, escaped unless it is a letter or a digit."""
    c = chr(code)
    return c if c.isascii() and c.isalnum() else f"\\x{{{code:x}}}"
