"""The one reader of JSON request bodies: every POST route gets its body here, strictly parsed.

llama-server reads bodies with nlohmann::json; Quart's `get_json` is more lenient in the wrong places
(NaN and Infinity are numbers, a repeated key silently keeps the last value, a body that is not UTF-8
surfaced as a 500) and unbounded in others (nesting depth). Here every such body is a 400 naming what
is wrong, a body over `--max-body-size` is a 413 (Quart's MAX_CONTENT_LENGTH, set by the app), and a
content type that is not JSON is a 415. The body-level limits of `server/http/limits.py` run on the parsed
value before the route's pydantic model sees it.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from quart import request

from server.config.limits import RequestLimits
from server.http import errors
from server.http.limits import check_body
from server.state import request_limits

# Content types a JSON body may come with. llama-server parses the body whatever its type, and clients
# rely on that: `curl -d` sends application/x-www-form-urlencoded and some SDKs text/plain. Other types
# (multipart forms, XML, octet streams) are a 415: the body is not what the client thinks it sent.
JSON_TYPES = frozenset({"", "application/json", "text/plain", "application/x-www-form-urlencoded"})


def _is_json_type(mimetype: str) -> bool:
    return mimetype in JSON_TYPES or (mimetype.startswith("application/") and mimetype.endswith("+json"))


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _BodyError(f"duplicate key {key!r} in an object")
            seen.add(key)
    return out


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _BodyError(f"the number {text[:40]} is out of range for a double")
    return value


def _no_constants(name: str) -> Any:
    raise _BodyError(f"{name} is not a JSON number")


class _BodyError(ValueError):
    """A reason the body is not acceptable JSON (raised from inside json.loads' hooks)."""


def parse_json(raw: bytes, max_depth: int) -> Any:
    """The JSON value of `raw`, strictly: UTF-8 only, no NaN/Infinity (nor numbers that overflow to
    them), no repeated keys, at most `max_depth` nested arrays/objects. Raises APIError 400."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise errors.invalid_request(f"Invalid request body: not UTF-8 (byte {exc.start})") from None
    try:
        value = json.loads(
            text,
            object_pairs_hook=_no_duplicates,
            parse_float=_finite_float,
            parse_constant=_no_constants,
        )
    except _BodyError as exc:
        raise errors.invalid_request(f"Invalid request body: {exc}") from None
    except RecursionError:
        raise errors.invalid_request(f"Invalid request body: nested deeper than {max_depth} levels") from None
    except ValueError as exc:  # JSONDecodeError, and ints of more than 4300 digits
        raise errors.invalid_request(f"Invalid request body: {exc}") from None
    if _SURROGATE_ESCAPE.search(text) and _has_lone_surrogate(value):
        raise errors.invalid_request("Invalid request body: a \\u escape is half of a UTF-16 surrogate pair")
    if nesting_depth(value) > max_depth:
        raise errors.invalid_request(
            f"Invalid request body: nested deeper than {max_depth} levels (--max-json-depth)"
        )
    return value


# A \uD800-\uDFFF escape: json.loads pairs valid ones into one character and keeps a lone half as a
# surrogate, which no UTF-8 encoder (the tokenizer's, the reply's) accepts. Searched for first, so the
# walk below runs only for the rare body with such an escape.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _has_lone_surrogate(value: Any) -> bool:
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def nesting_depth(value: Any) -> int:
    """How many arrays/objects deep `value` goes (a scalar: 0). Iterative: no recursion limit; lists
    of scalars (token ids, embeddings) are skipped in one C-level pass."""
    deepest = 0
    stack = [(value, 1)] if isinstance(value, dict | list) else []
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children if type(c) is dict or type(c) is list)
    return deepest


def _limits() -> RequestLimits:
    return request_limits()


async def check_headers() -> None:
    """431 when the request line and headers are over --max-header-size. h11 bounds only what it holds
    unparsed (a trickle of headers); headers that arrive in one read were never measured."""
    limit = _limits().max_header_size
    size = len(request.method) + len(request.full_path) + 11  # "GET /path HTTP/1.1\r\n"
    size += sum(len(name) + len(value) + 4 for name, value in request.headers.items())
    if size > limit:
        message = f"the request's headers are {size} bytes, over {limit} (--max-header-size)"
        raise errors.APIError(431, message, "invalid_request_error")


async def read_whole_body() -> None:
    """Read every request's body before its handler runs (a before_request hook): a reply sent before
    the body is read (a 415, a 501 for a route that is off, a 404) leaves the connection unusable, and
    hypercorn closed it under a client that had already sent its next request on it (seen in the fuzz:
    "Server disconnected without sending a response"). Bounded by --max-body-size (413)."""
    await request.get_data(cache=True, as_text=False)


async def json_body(optional: bool = False) -> Any:
    """The request's JSON body, checked (see the module doc) and within the body-level limits; with
    `optional`, an empty body is None."""
    limits = _limits()
    if not _is_json_type(request.mimetype):
        raise errors.APIError(
            415,
            f"Unsupported content type {request.mimetype!r}: send application/json",
            "invalid_request_error",
        )
    raw = await request.get_data(cache=True, as_text=False)
    if optional and not raw.strip():
        return None
    value = parse_json(raw, limits.max_json_depth)
    check_body(limits, value)
    return value
