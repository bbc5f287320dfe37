"""The API key on every route an app registers, asked over HTTP of a real server: the protected-route
check of the model server, the router and the cluster (issue #39).

The calls are generated from the app's own URL map (`app.url_map.iter_rules()`, the app built in the
test process with the settings the server under test runs with), so a route is checked the day it is
added. Each rule's methods are asked, OPTIONS aside (a CORS preflight carries no key: browsers send
none, so it never needs one). What is public is written here, not imported from server/http/auth.py
(whose list it checks): reading (GET and HEAD) health, the model list (Ollama's too, and its version) and
the web UI's files. Every other call must answer 401 in its route's error shape (OpenAI's; Ollama's
`{"error": "Invalid API Key"}` under /api/) without a key and with a wrong one, and anything but 401 with
the right one; a public call must answer without a key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import httpx
from quart import Quart
from werkzeug.routing import Rule

PUBLIC_RULES = frozenset(
    {"/health", "/v1/health", "/models", "/v1/models", "/", "/index.html", "/assets/<path:relative>"}
    | {"/api/version", "/api/tags"}  # Ollama's version and model list
)
PUBLIC_METHODS = frozenset({"GET", "HEAD"})
BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# A plausible value for each path parameter of the apps' rules, by name: a rule with a parameter not
# here fails the check until it has one. `.js` ends the response id: a route that merely ends like a web
# UI file (`/v1/responses/resp_0.js`) must not pass for one.
PATH_VALUES = {
    "response_id": "resp_0.js",
    "id_slot": "0",
    "filename": "app.js",
    "relative": "index.js",
    "name": "smollm2",
    "path": "v1/completions",
}
PARAMETER = re.compile(r"<(?:[^:<>]+:)?([^<>]+)>")
TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Call:
    """One method of one rule, its path filled."""

    method: str
    path: str
    rule: str

    @property
    def public(self) -> bool:
        return self.method in PUBLIC_METHODS and self.rule in PUBLIC_RULES


def fill(rule: Rule) -> str:
    """The rule's path with each parameter given its plausible value."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        assert name in PATH_VALUES, f"{rule.rule}: give <{name}> a plausible value in PATH_VALUES"
        return PATH_VALUES[name]

    return PARAMETER.sub(value, rule.rule)


def calls(app: Quart) -> list[Call]:
    """Every (method, path) the app's URL map routes, OPTIONS aside; one call for rules that share
    them (the router's web UI page and its proxy both route `GET /`: the first rule decides)."""
    found: dict[tuple[str, str], Call] = {}
    for rule in app.url_map.iter_rules():
        path = fill(rule)
        for method in sorted((rule.methods or set()) - {"OPTIONS"}):
            found.setdefault((method, path), Call(method, path, rule.rule))
    return list(found.values())


def status(client: httpx.Client, call: Call, headers: dict[str, str]) -> tuple[int, str]:
    """The answer's status, and the error type of a 401 (its body is not read otherwise: some routes
    stream without end, as /models/sse)."""
    body = {"json": {}} if call.method in BODY_METHODS else {}
    with client.stream(call.method, call.path, headers=headers, **body) as reply:  # type: ignore[arg-type]
        if reply.status_code != 401 or call.method == "HEAD":
            return reply.status_code, ""
        reply.read()
        return 401, error_type(reply.json())


def error_type(body: dict[str, Any]) -> str:
    """A 401's error type: OpenAI's `error.type`; Ollama's shape has only the message, whose 401 is the
    API key's."""
    error = body["error"]
    if isinstance(error, dict):
        return str(error["type"])
    return "authentication_error" if error == "Invalid API Key" else error


def wrong_answers(base_url: str, app: Quart, key: str, params: dict[str, str] | None = None) -> list[str]:
    """Each call the server at `base_url` answers wrong (see the module's docstring), as
    "METHOD /path: what"; `params`: a query added to every call (the router's and the cluster's
    `model=` of a model that is not there: a protected route runs, and loads no model)."""
    wrong: list[str] = []
    with httpx.Client(base_url=base_url, timeout=TIMEOUT_S, params=params) as client:
        for call in calls(app):
            name = f"{call.method} {call.path}"
            anonymous = status(client, call, {})
            if call.public:
                if anonymous[0] == 401:
                    wrong.append(f"{name}: public, but 401 without a key")
                continue
            expected = (401, "" if call.method == "HEAD" else "authentication_error")
            if anonymous != expected:
                wrong.append(f"{name}: {anonymous} without a key")
            mistaken = status(client, call, {"X-Api-Key": key + "-wrong"})
            if mistaken != expected:
                wrong.append(f"{name}: {mistaken} with a wrong key")
            right = status(client, call, {"Authorization": f"Bearer {key}"})
            if right[0] == 401:
                wrong.append(f"{name}: 401 with the right key")
    return wrong


def check(base_url: str, app: Quart, key: str, params: dict[str, str] | None = None) -> None:
    """Fail the test listing every call answered wrong."""
    wrong = wrong_answers(base_url, app, key, params)
    assert not wrong, "answered wrong:\n" + "\n".join(wrong)


def protected(app: Quart) -> set[tuple[str, str]]:
    """The (method, path) of every call that needs the key."""
    return {(call.method, call.path) for call in calls(app) if not call.public}
