"""A JSON schema in llama.cpp's reading as a Lark grammar for llguidance, with llama.cpp's whitespace.

llguidance's JSON-schema compiler allows its whitespace (`whitespace_pattern`) before every lexeme, so
it cannot say what llama.cpp's json-schema-to-grammar says: one bounded run (`space ::= | " " |
"\\n"{1,2} [ \\t]{0,20}`) after `{` `[` `,` `:`, before `}` `]` and between a declared key and its colon,
and nowhere else (never before a comma). Small models took that room: SmolLM2 at temperature 1 wrote
`"Peak"\\n  ,"city"` in 3 of the 6 schema answers it did not finish in 200 tokens
(scripts/bench_structured.py). So the structure is written here as llama.cpp writes it (objects,
arrays, tuples, `anyOf`, `$ref`, `const`/`enum` as their compact JSON text, booleans, null, any value),
with llama.cpp's number and string lexemes (at most 16 digits per part, no `\\/` escape); only a
string with a pattern, format or length, or a number with bounds, is handed to llguidance's JSON
compiler as a `%json` leaf without whitespace (it enforces those where llama.cpp's grammar cannot).

The input is a schema as server/model/llama_schema.py rewrites it (its node kinds only, `$defs` at the
root); `schema_lark(schema)` is the grammar, `SchemaLark` the writer that a larger grammar (a tool
call's) can embed schemas with.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

# llama.cpp's SPACE_RULE, and its primitive lexemes as regexes.
SPACE = r"/[ ]|\n{1,2}[ \t]{0,20}/"
_INTEGRAL = r"(?:0|[1-9][0-9]{0,15})"
NUMBER = rf"/-?{_INTEGRAL}(?:\.[0-9]{{1,16}})?(?:[eE][-+]?{_INTEGRAL})?/"
INTEGER = rf"/-?{_INTEGRAL}/"
STRING = r'/"(?:[^"\\\x7F\x00-\x1F]|\\(?:["\\bfnrt]|u[0-9a-fA-F]{4}))*"/'
# The generic value, object and array rules (llama.cpp's PRIMITIVE_RULES), used for `{}` and open objects.
_GENERIC = [
    "json_value: json_object | json_array | JSON_STRING | JSON_NUMBER | json_boolean | json_null",
    'json_object: "{" space (JSON_STRING ":" space json_value ("," space JSON_STRING ":" space json_value)*)?'
    ' space "}"',
    'json_array: "[" space (json_value ("," space json_value)*)? space "]"',
    'json_boolean: "true" | "false"',
    'json_null: "null"',
]
# The most llama.cpp's integer rule allows on each side (llama_schema.INTEGER_LIMIT, 10**16 - 2, is what
# llguidance's double bounds can say; the regex says 16 digits exactly).
_INTEGER_LIMIT = 10**16 - 2
_LEAF = {"x-guidance": {"whitespace_flexible": False}}


def schema_lark(schema: dict[str, Any]) -> str:
    """The Lark grammar of one (rewritten) schema."""
    writer = SchemaLark(schema.get("$defs", {}))
    start = writer.node(schema)
    return "\n".join([f"start: {start}", *writer.lines()]) + "\n"


def _literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _compact(value: Any) -> str:
    """A value's JSON text as llama.cpp's `json::dump()` writes a const or enum value."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@dataclass
class SchemaLark:
    """Writes schemas as Lark rules; `lines()` is every rule and terminal they need. `defs`: the
    `$defs` that `#/$defs/NAME` references name; `prefix` keeps the rule names of several writers
    in one grammar apart."""

    defs: dict[str, Any]
    prefix: str = "s"
    rules: list[str] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)  # $ref -> its rule
    uses: set[str] = field(default_factory=set)  # "space", "generic", "string", "number", "integer"

    def lines(self) -> list[str]:
        out = list(self.rules)
        if "generic" in self.uses:
            out += _GENERIC
            self.uses |= {"space", "string", "number"}
        terminals = {"string": STRING, "number": NUMBER, "integer": INTEGER}
        out += [f"JSON_{kind.upper()}: {regex}" for kind, regex in terminals.items() if kind in self.uses]
        if "space" in self.uses:
            out += ["space: SPACE?", f"SPACE: {SPACE}"]
        return out

    def rule(self, body: str) -> str:
        name = f"{self.prefix}{len(self.rules)}"
        self.rules.append(f"{name}: {body}")
        return name

    @property
    def space(self) -> str:
        self.uses.add("space")
        return "space"

    def node(self, schema: dict[str, Any]) -> str:
        """An expression for one schema node (a rule name or an inline alternative)."""
        if "$ref" in schema:
            return self.ref(schema["$ref"])
        if "anyOf" in schema:
            return "(" + " | ".join(self.node(alt) for alt in schema["anyOf"]) + ")"
        if "const" in schema:
            return _literal(_compact(schema["const"]))
        if "enum" in schema:
            return "(" + " | ".join(_literal(_compact(v)) for v in schema["enum"]) + ")"
        kind = schema.get("type")
        if kind == "object" and ("properties" in schema or "additionalProperties" in schema):
            return self.object(schema)
        if kind == "array":
            return self.array(schema)
        if kind == "string":
            return self.string(schema)
        if kind in ("integer", "number"):
            return self.number(schema, kind)
        if kind == "boolean":
            return '("true" | "false")'
        if kind == "null":
            return '"null"'
        if schema == {} or schema == {"type": "object"}:
            self.uses.add("generic")
            return "json_value" if schema == {} else "json_object"
        return self.leaf(schema)  # anything else (`{"not": {}}`): llguidance's reading

    def ref(self, ref: str) -> str:
        if ref not in self.names:
            name = self.names[ref] = f"{self.prefix}_ref{len(self.names)}"
            target = self.defs[ref.removeprefix("#/$defs/")]
            self.rules.append(f"{name}: {self.node(target)}")
        return self.names[ref]

    def leaf(self, schema: dict[str, Any]) -> str:
        return self.rule(f"%json {json.dumps({**schema, **_LEAF})}")

    def string(self, schema: dict[str, Any]) -> str:
        if set(schema) == {"type"}:
            self.uses.add("string")
            return "JSON_STRING"
        return self.leaf(schema)

    def number(self, schema: dict[str, Any], kind: str) -> str:
        unbounded = {"type": kind}
        if kind == "integer":
            unbounded |= {"minimum": -_INTEGER_LIMIT, "maximum": _INTEGER_LIMIT}
        if schema == unbounded:
            self.uses.add(kind)
            return f"JSON_{kind.upper()}"
        return self.leaf(schema)

    def array(self, schema: dict[str, Any]) -> str:
        space = self.space
        if "prefixItems" in schema:  # a tuple: exactly these items
            items = f' "," {space} '.join(self.node(item) for item in schema["prefixItems"])
            return self.rule(f'"[" {space} {items} {space} "]"')
        item = self.node(schema.get("items", {}))
        low, high = schema.get("minItems", 0), schema.get("maxItems")
        if high == 0:
            return self.rule(f'"[" {space} {space} "]"')
        more = _repeat(max(low - 1, 0), None if high is None else high - 1)
        more = f' ("," {space} {item}){more}' if more != "{0}" else ""
        items = f"{item}{more}" if low else f"({item}{more})?"
        return self.rule(f'"[" {space} {items} {space} "]"')

    def object(self, schema: dict[str, Any]) -> str:
        """llama.cpp's object: the required members in order, then the optional ones in order, each
        optional one skippable, then any additional members; a space after `{` and before `}`."""
        space = self.space
        properties: dict[str, Any] = schema.get("properties", {})
        required = set(schema.get("required", []))
        members = {
            name: self.rule(f'{_literal(_literal(name))} {space} ":" {space} {self.node(sub)}')
            for name, sub in properties.items()
        }
        additional = schema.get("additionalProperties", False)
        if additional is not False:
            key = self.additional_key(list(properties))
            members["*"] = self.rule(f'{key} ":" {space} {self.node(additional)}')
        needed = [members[n] for n in properties if n in required]
        optional = [n for n in [*properties, "*"] if n in members and n not in required]
        if not needed and not optional:
            return self.rule(f'"{{" {space} "}}"')
        body = f' "," {space} '.join(needed)
        if optional:
            choices = " | ".join(
                self.optional_run(optional[i:], members, False) for i in range(len(optional))
            )
            body += f' ("," {space} ({choices}))?' if needed else f" ({choices})?"
        return self.rule(f'"{{" {space} {body} {space} "}}"')

    def optional_run(self, names: list[str], members: dict[str, str], skippable: bool) -> str:
        """llama.cpp's get_recursive_refs: the first of `names` (present, or skippable after a comma),
        then the rest, each skippable."""
        first = names[0]
        comma = f'("," {self.space} {members[first]})'
        if skippable:
            out = comma + ("*" if first == "*" else "?")
        else:
            out = members[first] + (f" {comma}*" if first == "*" else "")
        if len(names) > 1:
            out += " " + self.rule(self.optional_run(names[1:], members, True))
        return out

    def additional_key(self, declared: list[str]) -> str:
        """Any JSON string key but the declared names (llama.cpp's _not_strings)."""
        self.uses.add("string")
        if not declared:
            return "JSON_STRING"
        names = " | ".join(_literal(_literal(n)) for n in declared)
        name = f"{self.prefix.upper()}_KEY{len(self.rules)}"
        self.rules.append(f"{name}: JSON_STRING & ~({names})")
        return name


def _repeat(low: int, high: int | None) -> str:
    """A repetition suffix in Lark; `{0}` when the group is not there at all."""
    if high is None:
        return "*" if low == 0 else "+" if low == 1 else f"{{{low},}}"
    if high == 0:
        return "{0}"
    return "?" if (low, high) == (0, 1) else f"{{{low}}}" if low == high else f"{{{low},{high}}}"
