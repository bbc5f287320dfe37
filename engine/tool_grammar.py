"""A tool-call format's call syntax (engine/text/tool_calls/syntax.py) as a grammar for engine/grammar.py.

The formats describe their calls as engine-neutral nodes; here they become one llguidance Lark grammar:
literals are string literals (or the special token they name: `<[id]>`, since a special token's text
is never produced as plain text), each JSON value is a `%json` rule over its schema, text up to a
closing tag is a lexeme that stops at the tag (the tag follows as its own literal), and optional
whitespace is llama.cpp's bounded JSON space. A lazy format's triggers become the spec's triggers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from engine.grammar import JSON_WHITESPACE, GrammarSpec, Trigger, TriggerKind
from engine.text.tool_calls.syntax import (
    Alt,
    Json,
    Lit,
    Node,
    Ref,
    Regex,
    Rep,
    Rule,
    Seq,
    Space,
    ToolGrammar,
    Until,
)

SPACE_RULE = r"SPACE: /[ ]|\n{1,2}[ \t]{0,20}/"
_TRIGGER_KINDS = {
    "word": TriggerKind.WORD,
    "pattern": TriggerKind.PATTERN,
    "pattern_full": TriggerKind.PATTERN_FULL,
}


def tool_grammar_spec(grammar: ToolGrammar, special_tokens: dict[str, int]) -> GrammarSpec:
    """The GrammarSpec of a format's ToolGrammar; `special_tokens` maps the vocabulary's special-token
    texts to their ids (those a literal must name as a token)."""
    lark = _LarkWriter(special_tokens).grammar(grammar.root)
    triggers = tuple(Trigger(TriggerKind(t.kind), t.value) for t in grammar.triggers)
    return GrammarSpec.lark(lark, triggers if grammar.lazy else ())


@dataclass
class _LarkWriter:
    special_tokens: dict[str, int]
    rules: list[str] = field(default_factory=list)
    uses_space: bool = False
    named: set[str] = field(default_factory=set)

    def grammar(self, root: Node) -> str:
        start = f"start: {self.expr(root)}"
        space = [SPACE_RULE] if self.uses_space else []
        return "\n".join([start, *self.rules, *space]) + "\n"

    def expr(self, node: Node) -> str:
        if isinstance(node, Lit):
            return self.literal(node.text)
        if isinstance(node, Json):
            return self.rule(f"%json {json.dumps(_with_json_whitespace(node.schema))}")
        if isinstance(node, Seq):
            return " ".join(self.expr(item) for item in node.items) or '""'
        if isinstance(node, Alt):
            return "(" + " | ".join(self.expr(option) for option in node.options) + ")"
        if isinstance(node, Rep):
            return f"({self.expr(node.item)}){_repeat(node.min, node.max)}"
        if isinstance(node, Space):
            self.uses_space = True
            return "SPACE?"
        if isinstance(node, Until):
            # The lexeme stops before `stop` (llguidance's lazy `stop`); the tag itself follows.
            return self.rule("/(.|\\n)*/", options=f"[stop={_string(node.stop)}]")
        if isinstance(node, Regex):
            return "/" + node.pattern.replace("/", "\\/") + "/"
        if isinstance(node, Rule):
            return self.named_rule(node)
        if isinstance(node, Ref):
            return _rule_name(node.name)
        raise TypeError(f"unknown syntax node {node!r}")

    def literal(self, text: str) -> str:
        if text in self.special_tokens:
            return f"<[{self.special_tokens[text]}]>"
        return _string(text) if text else '""'

    def named_rule(self, node: Rule) -> str:
        """A named rule, written the first time it appears (its body may refer to it)."""
        name = _rule_name(node.name)
        if name not in self.named:
            self.named.add(name)
            at = len(self.rules)
            self.rules.append("")  # its place: the body may add rules of its own first
            self.rules[at] = f"{name}: {self.expr(node.body)}"
        return name

    def rule(self, body: str, options: str = "") -> str:
        name = f"r{len(self.rules)}"
        self.rules.append(f"{name}{options}: {body}")
        return name


def _rule_name(name: str) -> str:
    """A named rule's Lark name (apart from the numbered ones)."""
    return "n_" + "".join(c if c.isalnum() else "_" for c in name.lower())


def _string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _repeat(low: int, high: int | None) -> str:
    if (low, high) == (0, 1):
        return "?"
    if high is None:
        return "*" if low == 0 else ("+" if low == 1 else f"{{{low},}}")
    return f"{{{low},{high}}}"


def _with_json_whitespace(schema: dict) -> dict:
    """The schema with llama.cpp's bounded JSON whitespace (unless it sets its own x-guidance), and the
    `$defs` of schemas embedded in it (a tool's arguments inside the call object) moved to its root,
    where their `#/$defs/...` references look (their names are unique: server/model/llama_schema.py)."""
    defs: dict[str, Any] = {}
    schema = _hoist_defs(schema, defs, root=True)
    if defs:
        schema = {**schema, "$defs": {**defs, **schema.get("$defs", {})}}
    return schema if "x-guidance" in schema else {**schema, "x-guidance": JSON_WHITESPACE}


_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_VALUES = ("additionalProperties", "items", "not", "contains", "if", "then", "else", "propertyNames")


def _hoist_defs(schema: Any, defs: dict[str, Any], root: bool = False) -> Any:
    """`schema` without the `$defs` of its sub-schemas, which go into `defs`."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if not root and isinstance(out.get("$defs"), dict):
        defs.update({name: _hoist_defs(sub, defs) for name, sub in out.pop("$defs").items()})
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: _hoist_defs(sub, defs) for name, sub in out[key].items()}
    for key in (*_SCHEMA_LISTS, *_SCHEMA_VALUES):
        value = out.get(key)
        if isinstance(value, list):
            out[key] = [_hoist_defs(sub, defs) for sub in value]
        elif isinstance(value, dict):
            out[key] = _hoist_defs(value, defs)
    return out
