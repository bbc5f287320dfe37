"""The JSON types a JSON schema admits, as llama.cpp's common/json-schema.cpp reads a schema for the XML
call formats (`value_types`): which of a parameter's texts are strings and which are JSON."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Schema = Mapping[str, Any]
ALL_TYPES = frozenset({"null", "boolean", "integer", "number", "string", "array", "object"})
_JSON_TYPES = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"), (list, "array"))


def value_types(
    schema: Schema, root: Schema | None = None, seen: frozenset[int] = frozenset()
) -> frozenset[str]:
    """The types `schema` admits; `root` holds the `$defs`/`definitions` its references name (a cycle
    admits nothing, as in llama.cpp). Without a type the structural keywords decide (properties: an
    object, items: an array, string keywords: a string), and a schema that says nothing admits all."""
    if not isinstance(schema, Mapping):
        return ALL_TYPES
    if "$ref" in schema:
        target = _resolve(str(schema["$ref"]), root or {})
        if target is None or id(target) in seen:
            return frozenset()
        return value_types(target, root, seen | {id(target)})
    for key in ("oneOf", "anyOf"):
        if key in schema:
            return frozenset().union(*(value_types(s, root, seen) for s in schema[key] or ()))
    kind = schema.get("type")
    if isinstance(kind, list):
        return frozenset().union(*(value_types({**schema, "type": k}, root, seen) for k in kind))
    if "const" in schema:
        return frozenset({_json_type(schema["const"])})
    if "enum" in schema:
        return frozenset(_json_type(v) for v in schema["enum"] or ())
    if kind == "number":
        return frozenset({"number", "integer"})
    if kind in (None, "object", "string") and "allOf" in schema and not _has_properties(schema, kind):
        return frozenset.intersection(ALL_TYPES, *(value_types(s, root, seen) for s in schema["allOf"]))
    if isinstance(kind, str) and kind in ALL_TYPES:
        return frozenset({kind})
    return _structural(schema)


def _has_properties(schema: Schema, kind: Any) -> bool:
    """Whether an untyped (or object) schema describes an object's members (a string's allOf counts)."""
    if kind == "string":
        return False
    extra = schema.get("additionalProperties")
    return "properties" in schema or ("additionalProperties" in schema and extra is not True)


def _structural(schema: Schema) -> frozenset[str]:
    if _has_properties(schema, None):
        return frozenset({"object"})
    if "items" in schema or "prefixItems" in schema:
        return frozenset({"array"})
    if any(k in schema for k in ("pattern", "minLength", "maxLength", "format")):
        return frozenset({"string"})
    return ALL_TYPES


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    return next((name for kind, name in _JSON_TYPES if isinstance(value, kind)), "object")


def _resolve(ref: str, root: Schema) -> Schema | None:
    """`#/$defs/NAME` or `#/definitions/NAME` (any `#/a/b` path) in the root schema."""
    if not ref.startswith("#"):
        return None
    node: Any = root
    for part in [p for p in ref[1:].split("/") if p]:
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node if isinstance(node, Mapping) else None
