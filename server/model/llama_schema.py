"""What a JSON schema means here: llama.cpp's meaning, spelled as a schema llguidance compiles to it.

llguidance follows JSON Schema; llama-server follows its own json-schema-to-grammar (common/json-schema.cpp
reads the schema, common/json-schema-to-grammar.cpp writes the grammar). They differ where users notice:
an object without `additionalProperties` is open in JSON Schema and closed in llama.cpp ("faster grammars,
fewer hallucinations", grammars/README.md), so a small model sampling at temperature 1 kept inventing keys
inside nested objects until `max_tokens` cut the document. Every schema a request sends (response_format,
json_schema, tools' parameters, Anthropic's input_schema and output_config.format, Responses' text.format,
and `-j`) goes through `llama_cpp_schema` once, before it is compiled, and comes out as a schema whose
every keyword llguidance enforces the way llama.cpp's grammar would:

- the node a schema is, decided in llama.cpp's order: `$ref` (its siblings ignored), `oneOf`/`anyOf` (as
  anyOf, siblings ignored), a `type` list (one alternative per type), `const`, `enum`, then the type (or,
  without one, the structural keywords: properties, allOf, items, string keywords, else any value);
- objects: closed unless `additionalProperties` says otherwise, open when they declare no `properties`;
  required properties first, each group in declared order; `required` names outside `properties` ignored;
- arrays: `items` as a list (or `prefixItems`) is a tuple of exactly those items; `minItems`/`maxItems`;
- strings: a `pattern` anchored with `^...$` in the regex subset llama.cpp reads, else (unanchored, or a
  construct it does not read) any string; formats date, time, date-time, uuid as llama.cpp's exact
  patterns, other formats any string; `minLength`/`maxLength` only without pattern and format;
- integers: bounds rounded inwards, exclusive bounds made inclusive, at most 16 digits; numbers: bounds
  ignored (llama.cpp's grammar has none);
- `allOf`: the union of its objects' properties (required when the part is not an anyOf), or the values
  common to its enums; every other keyword llama.cpp does not read (uniqueItems, not, ...) ignored;
- refused as llama.cpp refuses: an unknown or non-string type, an empty enum or anyOf, a bad count or
  bound, a pattern that is no regex at all, a `$ref` outside the document or to nowhere, a sub-schema
  that is not an object.

`strict=True` (OpenAI's `"strict": true`, Anthropic's tool `strict`) keeps OpenAI's meaning instead: the
schema is JSON Schema, enforced in full by llguidance (bounds, formats, patterns as JSON Schema reads
them; an unsupported keyword is a 400, as OpenAI's strict mode refuses it), with objects that declare
properties closed unless they say otherwise (OpenAI requires `additionalProperties: false` there).
docs/compatibility.md lists what still differs.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

# llama.cpp's integral part: `[0] | [1-9] [0-9]{0,15}`, so an unbounded side stops at 16 digits. llguidance
# reads bounds as doubles, where 10**16 - 1 rounds to 10**16: the largest double below is the limit.
INTEGER_LIMIT = 10**16 - 2
# llama.cpp's STRING_FORMAT_RULES as regexes of the string's content.
_DATE = r"[0-9]{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[1-2][0-9]|3[0-1])"
_TIME = r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{3})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
FORMATS = {
    "date": _DATE,
    "time": _TIME,
    "date-time": f"{_DATE}T{_TIME}",
    "uuid": "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
}
_UUID_VERSIONS = {f"uuid{v}" for v in "12345"}
_LLAMA_FORMATS = {*FORMATS, *_UUID_VERSIONS}
# Formats llama.cpp reads as any string that llguidance checks (an answer then satisfies both).
ENFORCED_FORMATS = {"email", "hostname", "ipv4", "ipv6", "duration"}
_NOT_RUST = re.compile(r"\(\?<?[=!]|\\[1-9]|\\k<|\(\?P=")  # look-around, back-references
_STRING_KEYS = ("pattern", "minLength", "maxLength")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_VALUES = ("additionalProperties", "items", "not", "contains", "if", "then", "else", "propertyNames")


class SchemaError(ValueError):
    """A schema llama.cpp refuses; the message names where (a JSON pointer into the schema)."""


def llama_cpp_schema(schema: Any, strict: bool = False, request: bool = True, defs: str = "") -> dict:
    """The schema llguidance should compile for `schema`, as llama-server reads it (or, with `strict`, as
    OpenAI's strict mode does). `request`: a request's schema, where llama-server reads an empty one as
    any object (`-j` does not). `defs`: a prefix for the `$defs` names the result uses, so that schemas
    embedded in one grammar (a tool call's arguments) do not clash. SchemaError when llama.cpp refuses."""
    if isinstance(schema, bool):
        return {} if schema else {"not": {}}
    if request and schema == {}:
        return {"type": "object"}
    if strict:
        return _closed(_prefixed_defs(schema, defs) if defs else schema)
    return _Reader(schema, defs).document()


def _prefixed_defs(schema: dict, prefix: str) -> dict:
    """The root's `$defs`/`definitions` renamed `prefix` + name (as `$defs`), and the references to them."""
    out = {k: v for k, v in schema.items() if k not in ("$defs", "definitions")}
    names = {}
    for key in ("$defs", "definitions"):
        for name, sub in (schema.get(key) or {}).items():
            names[f"#/{key}/{name}"] = f"#/$defs/{prefix}{name}"
            out.setdefault("$defs", {})[prefix + name] = sub

    def renamed(node: Any) -> Any:
        if isinstance(node, list):
            return [renamed(n) for n in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str):
            hit = next((old for old in names if ref == old or ref.startswith(old + "/")), None)
            node = {**node, "$ref": names[hit] + ref[len(hit) :]} if hit else node
        return {k: renamed(v) for k, v in node.items()}

    return renamed(out)


def _closed(schema: Any) -> Any:
    """JSON Schema as it is, with every object that declares properties closed unless it says not."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: _closed(sub) for name, sub in out[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [_closed(sub) for sub in out[key]]
    for key in _SCHEMA_VALUES:
        if isinstance(out.get(key), (dict, list)):
            out[key] = [_closed(s) for s in out[key]] if isinstance(out[key], list) else _closed(out[key])
    return out


# -- llama.cpp's reading, node by node ---------------------------------------------------------------


@dataclass
class _Reader:
    """One document: its nodes rewritten, and each `$ref` target rewritten once into `$defs`."""

    root: Any
    prefix: str
    refs: dict[str, str] = field(default_factory=dict)  # the document's $ref -> its name in $defs
    defs: dict[str, Any] = field(default_factory=dict)
    # each rewritten object's properties in their declared order (an allOf merges them in that order)
    declared: dict[int, list[tuple[str, dict, bool]]] = field(default_factory=dict)

    def document(self) -> dict:
        top = self.node(self.root, "#")
        if not self.defs:
            return top
        # $defs beside the root's keywords constrains nothing; a root that is a bare $ref stays one.
        return {**top, "$defs": self.defs}

    def node(self, schema: Any, path: str) -> dict:
        if not isinstance(schema, dict):
            raise SchemaError(f"at {path}: a schema must be an object")
        if "$ref" in schema:
            return {"$ref": self.ref(schema["$ref"], path)}
        for key in ("oneOf", "anyOf"):
            if key in schema:
                return {"anyOf": self.alternatives(schema[key], f"{path}/{key}")}
        kind = schema.get("type")
        if isinstance(kind, list):
            if not kind:
                raise SchemaError(f"at {path}: type must not be empty")
            alternatives = [self.node({**schema, "type": t}, f"{path}/type/{i}") for i, t in enumerate(kind)]
            return {"anyOf": alternatives}
        if "const" in schema:
            return {"const": schema["const"]}
        if "enum" in schema:
            if not isinstance(schema["enum"], list) or not schema["enum"]:
                raise SchemaError(f"at {path}: enum must be a non-empty array")
            return {"enum": schema["enum"]}
        if kind is not None and not isinstance(kind, str):
            raise SchemaError(f"at {path}: type must be a string or an array of strings")
        return self.typed(schema, kind or "", path)

    def typed(self, schema: dict, kind: str, path: str) -> dict:
        extra = schema.get("additionalProperties", True)
        has_properties = "properties" in schema or extra is not True
        if kind == "":
            if has_properties:
                return self.object(schema, path)
            if "allOf" in schema:
                return self.all_of(schema["allOf"], f"{path}/allOf")
            if "items" in schema or "prefixItems" in schema:
                return self.array(schema, path)
            if any(k in schema for k in _STRING_KEYS) or _format(schema, path) in _LLAMA_FORMATS:
                return self.string(schema, path)
            return {}
        if kind in ("object", "string") and "allOf" in schema and not (kind == "object" and has_properties):
            return self.all_of(schema["allOf"], f"{path}/allOf")
        readers = {
            "object": self.object,
            "string": self.string,
            "array": self.array,
            "integer": _integer,
            "number": _number,
        }
        if kind in readers:
            return readers[kind](schema, path)
        if kind in ("boolean", "null"):
            return {"type": kind}
        raise SchemaError(f"at {path}: unrecognized type {kind}")

    def alternatives(self, alts: Any, path: str) -> list[dict]:
        if not isinstance(alts, list):
            raise SchemaError(f"at {path}: must be an array of schemas")
        if not alts:
            raise SchemaError(f"at {path}: must not be empty")
        return [self.node(alt, f"{path}/{i}") for i, alt in enumerate(alts)]

    def ref(self, ref: Any, path: str) -> str:
        if not isinstance(ref, str):
            raise SchemaError(f"at {path}: $ref must be a string")
        if not ref.startswith("#/"):
            raise SchemaError(f"at {path}: unsupported $ref {ref}, only references into the same document")
        if ref not in self.refs:
            name = self.refs[ref] = f"{self.prefix}ref{len(self.refs)}"
            self.defs[name] = {}  # reserved first: a cycle back to this $ref stops here
            self.defs[name] = self.node(_resolve(self.root, ref, path), ref)
        return f"#/$defs/{self.refs[ref]}"

    def object(self, schema: dict, path: str) -> dict:
        listed = schema.get("required")
        required = {n for n in listed if isinstance(n, str)} if isinstance(listed, list) else set()
        properties = schema.get("properties", {})
        if not isinstance(properties, dict):
            raise SchemaError(f"at {path}: properties must be an object")
        read = [(n, self.node(p, f"{path}/properties/{n}"), n in required) for n, p in properties.items()]
        if "additionalProperties" in schema:
            extra = schema["additionalProperties"]
            if isinstance(extra, dict):
                additional: dict | bool = self.node(extra, f"{path}/additionalProperties")
            elif isinstance(extra, bool):
                additional = {} if extra else False
            else:
                raise SchemaError(f"at {path}: additionalProperties must be a boolean or a schema")
        else:
            additional = {} if "properties" not in schema else False
        out = _object_schema(read, additional)
        self.declared[id(out)] = read
        return out

    def all_of(self, parts: Any, path: str) -> dict:
        """llama.cpp's allOf: one closed object of its parts' properties (all required, but those of an
        anyOf's alternatives optional), unless the values its enums all share are the answer."""
        read = self.alternatives(parts, path)
        properties: list[tuple[str, dict, bool]] = []
        counts: dict[str, list[Any]] = {}  # each enum value (as JSON) -> [count, value]
        for part in read:
            components = [(alt, False) for alt in part["anyOf"]] if "anyOf" in part else [(part, True)]
            for component, is_required in components:
                component = self.target(component)
                declared = self.declared.get(id(component), [])
                properties += [(name, sub, is_required) for name, sub, _ in declared]
                for value in component.get("enum", ()):
                    counts.setdefault(_json_key(value), [0, value])[0] += 1
        common = [value for count, value in counts.values() if count == len(read)]
        if common:
            return {"enum": common}
        return _object_schema(properties, False)

    def target(self, component: dict) -> dict:
        """A rewritten node, or what its `$ref` names (llama.cpp merges the target into an allOf)."""
        if "$ref" in component:
            return self.defs.get(component["$ref"].removeprefix("#/$defs/"), {})
        return component

    def array(self, schema: dict, path: str) -> dict:
        if "items" in schema or "prefixItems" in schema:
            key = "items" if "items" in schema else "prefixItems"
            items = schema[key]
            if isinstance(items, list):  # a tuple: exactly these items
                tuple_items = [self.node(item, f"{path}/{key}/{i}") for i, item in enumerate(items)]
                return {"type": "array", "prefixItems": tuple_items, "items": False, "minItems": len(items)}
            item = self.node(items, f"{path}/{key}")
        else:
            item = {}
        low, high = _count(schema, "minItems", path), _count(schema, "maxItems", path)
        out: dict[str, Any] = {"type": "array"}
        if item:
            out["items"] = item
        if low:
            out["minItems"] = low
        if high is not None:
            out["maxItems"] = high
        return out

    def string(self, schema: dict, path: str) -> dict:
        """llama.cpp's precedence: a pattern, else a format; the lengths beside them (which llama.cpp
        drops there) are kept, since llguidance enforces them together."""
        pattern = schema.get("pattern")
        if pattern is not None and not isinstance(pattern, str):
            raise SchemaError(f"at {path}: pattern must be a string")
        form = _format(schema, path)
        low, high = _count(schema, "minLength", path), _count(schema, "maxLength", path)
        out: dict[str, Any] = {"type": "string"}
        if pattern:
            regex = pattern_regex(pattern, path)
            regex = regex if regex is not None else _json_schema_pattern(pattern)
            if regex is not None:
                out["pattern"] = regex
        elif form in FORMATS or form in _UUID_VERSIONS:
            out["pattern"] = f"^(?:{FORMATS['uuid' if form in _UUID_VERSIONS else form]})$"
        elif form in ENFORCED_FORMATS:
            out["format"] = form
        if low:
            out["minLength"] = low
        if high is not None:
            out["maxLength"] = high
        return out


def _json_key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _object_schema(properties: list[tuple[str, dict, bool]], additional: dict | bool) -> dict:
    """An object as llama.cpp writes it: the required properties first, then the optional ones, each in
    the declared order (llguidance keeps a schema's order), then any additional members."""
    if not properties and additional == {}:
        return {"type": "object"}
    ordered = [p for p in properties if p[2]] + [p for p in properties if not p[2]]
    out: dict[str, Any] = {"type": "object", "properties": {name: sub for name, sub, _ in ordered}}
    required = [name for name, _, is_required in ordered if is_required]
    if required:
        out["required"] = list(dict.fromkeys(required))
    out["additionalProperties"] = additional
    return out


def _resolve(root: Any, ref: str, path: str) -> Any:
    """A `#/a/b/0` reference's target, step by step as llama.cpp walks it (no ~0/~1 unescaping)."""
    target = root
    for step in ref[2:].split("/"):
        if isinstance(target, dict) and step in target:
            target = target[step]
        elif isinstance(target, list) and step.isdigit() and int(step) < len(target):
            target = target[int(step)]
        else:
            raise SchemaError(f"at {path}: cannot resolve $ref {ref}, {step} not found")
    return target


def _count(schema: dict, key: str, path: str) -> int | None:
    if key not in schema:
        return None
    value = schema[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise SchemaError(f"at {path}: {key} must be a non-negative integer")
    return value


def _format(schema: dict, path: str) -> str | None:
    if "format" not in schema:
        return None
    value = schema["format"]
    if not isinstance(value, str):
        raise SchemaError(f"at {path}: format must be a string")
    return value


def _json_schema_pattern(pattern: str) -> str | None:
    """A pattern llama.cpp reads as any string (unanchored, or \\d and the like), in JSON Schema's
    reading (a search) where llguidance's regex can have it; None (any string, as in llama.cpp) for
    look-around, back-references, or no regex at all."""
    if _NOT_RUST.search(pattern):
        return None
    try:
        re.compile(pattern)
    except re.error:
        return None
    return pattern


def _number(schema: dict, path: str) -> dict:
    """A number: llama.cpp's grammar has no bounds, but its own test marks that a to-do; llguidance
    enforces numeric bounds and multipleOf, so they are kept (an answer then satisfies both)."""
    out: dict[str, Any] = {"type": "number"}
    for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"):
        value = schema.get(key)
        if (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and (key != "multipleOf" or value > 0)
        ):
            out[key] = value
    return out


def _integer(schema: dict, path: str) -> dict:
    """An integer's bounds as llama.cpp reads them: fractional ones rounded inwards, exclusive ones made
    inclusive, a side without a bound limited to 16 digits."""

    def bound(key: str, round_up: bool) -> int:
        value = schema[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SchemaError(f"at {path}: {key} must be a number")
        if isinstance(value, int):
            return value
        return int(-(-value // 1)) if round_up else int(value // 1)

    low = high = None
    if "minimum" in schema:
        low = bound("minimum", True)
    elif "exclusiveMinimum" in schema:
        low = bound("exclusiveMinimum", False) + 1
    if "maximum" in schema:
        high = bound("maximum", False)
    elif "exclusiveMaximum" in schema:
        high = bound("exclusiveMaximum", True) - 1
    if low is None:
        low = min(-INTEGER_LIMIT, high) if high is not None else -INTEGER_LIMIT
    if high is None:
        high = max(INTEGER_LIMIT, low)
    out: dict[str, Any] = {"type": "integer", "minimum": low, "maximum": high}
    step = schema.get("multipleOf")
    if isinstance(step, (int, float)) and not isinstance(step, bool) and step > 0:
        out["multipleOf"] = step  # llama.cpp ignores it; llguidance enforces it
    return out


# -- patterns: llama.cpp's regex subset, as a Rust regex over the string's content -------------------

_ESCAPED_LITERALS = set("^$.[]()|{}*+?")
_NON_LITERAL = set("|.()[]{}*+?^$")
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}
_PLAIN_ESCAPES = set('trn\\"[]-')


class _Unsupported(Exception):
    pass


def pattern_regex(pattern: str, path: str = "#") -> str | None:
    """The regex (for llguidance, anchored) of a string pattern as llama.cpp reads it; None where llama.cpp
    reads it as any string (not anchored with ^ and $, or a construct it has no grammar for: \\d, look-
    arounds, an anchor inside ...); SchemaError where it is no regex at all (unbalanced parentheses, an
    unterminated class, nothing to repeat, a trailing backslash)."""
    if len(pattern) < 2 or pattern[0] != "^" or pattern[-1] != "$":
        return None
    try:
        return "^(?:" + _PatternReader(pattern[1:-1], path).whole() + ")$"
    except _Unsupported:
        return None


@dataclass
class _PatternReader:
    text: str
    path: str
    i: int = 0
    depth: int = 0

    def whole(self) -> str:
        body = self.sequence()
        if self.depth != 0 or self.i < len(self.text):
            raise SchemaError(f"at {self.path}: invalid pattern: unbalanced parentheses")
        return body

    def sequence(self) -> str:
        """Items up to the `)` closing the current group (consumed) or the end; `|` joins them."""
        items: list[str] = []
        while self.i < len(self.text):
            c = self.text[self.i]
            if c == ")":
                if self.depth == 0:
                    raise SchemaError(f"at {self.path}: invalid pattern: unbalanced parentheses")
                self.i += 1
                self.depth -= 1
                return "".join(items)
            items.append(self.item(c, items))
        return "".join(items)

    def item(self, c: str, items: list[str]) -> str:
        if c in "*+?{":
            if not items or items[-1] == "|":
                raise SchemaError(f"at {self.path}: invalid pattern: nothing to repeat")
            last = items.pop()
            return f"(?:{last}){self.quantifier(c)}"
        self.i += 1
        if c == ".":
            return r"[^\n\r]"
        if c == "|":
            return "|"
        if c in "^$":
            raise _Unsupported("anchor inside the pattern")
        if c == "(":
            return self.group()
        if c == "[":
            return self.char_class()
        self.i -= 1
        return self.literal(c)

    def quantifier(self, c: str) -> str:
        self.i += 1
        if c != "{":
            return c
        end = self.text.find("}", self.i)
        if end < 0:
            raise _Unsupported("unterminated curly brackets")
        numbers = self.text[self.i : end].split(",")
        self.i = end + 1
        if len(numbers) not in (1, 2) or not all(re.fullmatch(r"[+-]?\d+|", n.strip()) for n in numbers):
            raise _Unsupported("curly brackets")
        if len(numbers) == 1:
            if not numbers[0].strip():
                raise _Unsupported("curly brackets")
            return f"{{{int(numbers[0])}}}"
        low = int(numbers[0]) if numbers[0].strip() else 0
        return f"{{{low},{int(numbers[1])}}}" if numbers[1].strip() else f"{{{low},}}"

    def group(self) -> str:
        if self.text.startswith("?", self.i):
            if not self.text.startswith("?:", self.i):
                raise _Unsupported("look-around, named group or flags")
            self.i += 2
        self.depth += 1
        if self.depth > 100:
            raise _Unsupported("nesting too deep")
        return f"(?:{self.sequence()})"

    def char_class(self) -> str:
        out = "["
        while self.i < len(self.text) and self.text[self.i] != "]":
            if self.text[self.i] == "\\":
                n = _escape_length(self.text, self.i)
                if n == 0:
                    raise _Unsupported("escape in a character class")
                out += self.text[self.i : self.i + n]
                self.i += n
            else:  # Rust's nested classes and set operators (`[`, `&&`, `~~`) are plain characters here
                c = self.text[self.i]
                out += "\\" + c if c in "[&~" else c
                self.i += 1
        if self.i >= len(self.text):
            raise SchemaError(f"at {self.path}: invalid pattern: unterminated character class")
        self.i += 1
        return out + "]" if out != "[" else "[^\\x00-\\x{10FFFF}]"

    def literal(self, first: str) -> str:
        out = ""
        text, n = self.text, len(self.text)
        while self.i < n:
            c = text[self.i]
            if c == "\\":
                if self.i == n - 1:
                    raise SchemaError(f"at {self.path}: invalid pattern: trailing backslash")
                if text[self.i + 1] in _ESCAPED_LITERALS:
                    out += re.escape(text[self.i + 1])
                    self.i += 2
                    continue
                length = _escape_length(text, self.i)
                if length == 0:
                    raise _Unsupported("escape")
                out += text[self.i : self.i + length]
                self.i += length
            elif c not in _NON_LITERAL and (
                self.i == n - 1 or not out or text[self.i + 1] == "." or text[self.i + 1] not in _NON_LITERAL
            ):
                out += re.escape(c)
                self.i += 1
            else:
                break
        if not out:
            raise _Unsupported(f"character {first}")
        return out if len(out) == 1 or out.startswith("\\") and len(out) == 2 else f"(?:{out})"


def _escape_length(text: str, i: int) -> int:
    """How long llama.cpp's escape at `i` is (\\xHH, \\uHHHH, \\UHHHHHHHH, \\t \\r \\n \\\\ \\" \\[ \\]
    \\-), 0 if it reads none there."""
    if i + 1 >= len(text) or text[i] != "\\":
        return 0
    kind = text[i + 1]
    if kind in _PLAIN_ESCAPES:
        return 2
    digits = _HEX_ESCAPES.get(kind, 0)
    hex_part = text[i + 2 : i + 2 + digits]
    if digits and len(hex_part) == digits and all(h in "0123456789abcdefABCDEF" for h in hex_part):
        return 2 + digits
    return 0
