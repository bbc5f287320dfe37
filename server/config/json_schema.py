"""Is a JSON schema a valid schema? One check for the -j/-jf flags and for every schema a request sends.

It lives with the configuration, the lowest layer that needs it, so the flags can check their schema
without importing the request schemas (`server/chat/tool_schemas.py` and the API families import it).
"""

from __future__ import annotations

import functools
import json
from typing import Any

import jsonschema


def check_schema(schema: Any) -> dict[str, Any]:
    """A JSON schema that is a valid schema (the latest draft's meta-schema, or draft 7's for a schema
    that names no draft), else ValueError."""
    if isinstance(schema, bool):
        return {} if schema else {"not": {}}
    if not isinstance(schema, dict):
        raise ValueError("must be a JSON schema (an object)")
    problem = schema_problem(json.dumps(schema, sort_keys=True))
    if problem is not None:
        raise ValueError(problem)
    return schema


# Agents send the same tools on every turn, and jsonschema's meta-schema check of each is slow: an
# agent's body of 10 turns and 20 tools validated in 81 ms with fresh checks, 0.6 ms with this cache, on
# the event loop (scripts/bench_request_validation.py, one run). Each distinct schema is checked once.
@functools.lru_cache(maxsize=1024)
def schema_problem(canonical: str) -> str | None:
    """What is wrong with the schema (its canonical JSON text), or None."""
    schema = json.loads(canonical)
    problem = _meta_problem(jsonschema.validators.validator_for(schema), schema)
    if problem is not None and "$schema" not in schema and _meta_problem(DRAFT7, schema) is None:
        # A schema that names no draft may be an older one's: draft 7's `items: [...]` (a tuple, as
        # llama.cpp reads it) is no schema under 2020-12, where tuples are `prefixItems`.
        return None
    return problem


DRAFT7 = jsonschema.Draft7Validator


def _meta_problem(validator: Any, schema: dict[str, Any]) -> str | None:
    try:
        validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.path)
        return f"invalid JSON schema{f' at {where}' if where else ''}: {exc.message}"
    return None
