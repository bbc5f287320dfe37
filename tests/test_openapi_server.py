"""GET /openapi.json (issue #20): every route the app serves is in the document, its request schemas are
the routes' own pydantic models, and a short fuzz over the document (plus random byte bodies and
malformed resume offsets) finds no 5xx. The long runs are in tests/test_fuzz_server.py (slow)."""

from __future__ import annotations

import re

import httpx

from server.app import create_app
from server.cli import Settings
from server.mcp.config import McpServerConfig
from server.openapi import ROUTES
from server.schemas import ChatCompletionRequest
from server.schemas_anthropic import MessagesRequest
from tests.fuzz import fuzz_openapi, fuzz_random_bodies, fuzz_resume_offsets
from tests.server_process import ServerProcess

IGNORED_METHODS = {"HEAD", "OPTIONS"}


def served_operations() -> set[tuple[str, str]]:
    """(method, OpenAPI path) of every rule of the app, MCP's /tools included."""
    mcp = McpServerConfig(name="t", command="true")
    app = create_app(Settings(model="unused", mcp_servers=(mcp,)))
    ops = set()
    for rule in app.url_map.iter_rules():
        if rule.endpoint == "static":
            continue
        path = re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", rule.rule)
        ops |= {(m.lower(), path) for m in rule.methods or () if m not in IGNORED_METHODS}
    return ops


def test_the_document_lists_every_route_the_app_serves_and_no_other() -> None:
    documented = {(route.method, path) for route in ROUTES for path in route.paths}
    assert served_operations() == documented


def test_request_schemas_are_the_models(server: ServerProcess) -> None:
    doc = httpx.get(server.base_url + "/openapi.json", timeout=30).json()
    schemas = doc["components"]["schemas"]
    for model in (ChatCompletionRequest, MessagesRequest):
        assert set(schemas[model.__name__]["properties"]) == set(model.model_json_schema()["properties"])
    chat = doc["paths"]["/v1/chat/completions"]["post"]
    assert chat["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ChatCompletionRequest"
    }
    assert "text/event-stream" in chat["responses"]["200"]["content"]
    error = doc["paths"]["/v1/messages"]["post"]["responses"]["4XX"]["content"]["application/json"]
    assert error["schema"]["$ref"].endswith("/AnthropicErrorReply")


def test_a_short_fuzz_finds_no_server_error(limited_server: ServerProcess) -> None:
    """A few cases per operation (the slow test runs thousands); each 5xx is listed."""
    url = limited_server.base_url
    report = fuzz_openapi(url, examples=2, seed=1, aliases=False)
    report += fuzz_random_bodies(url, count=15, seed=1)
    report += fuzz_resume_offsets(url, count=3, seed=1)
    assert report.cases >= 60
    assert report.failures == [], report.failures[:5]
    assert all("Unsatisfiable" in s for s in report.skipped), report.skipped  # nothing to make invalid
    assert httpx.get(url + "/health", timeout=10).status_code == 200
