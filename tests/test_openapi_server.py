"""GET /openapi.json (issue #20): every route the app serves is in the document, its request schemas are
the routes' own pydantic models, and a short fuzz over the document (plus random byte bodies and
malformed resume offsets) finds no 5xx. The long runs are in tests/test_fuzz_server.py (slow)."""

from __future__ import annotations

import re

import httpx
from quart import Quart

from server.apis.anthropic.schemas import MessagesRequest
from server.apis.openapi.document import ROUTER_ROUTES, ROUTES, Route, router_routes
from server.app import create_app
from server.chat.schemas import ChatCompletionRequest
from server.config.settings import Settings
from server.mcp.config import McpServerConfig
from server.router.app import create_router_app
from server.router.catalogue import build_catalogue
from tests.fuzz import fuzz_openapi, fuzz_random_bodies, fuzz_resume_offsets
from tests.server_process import ServerProcess

IGNORED_METHODS = {"HEAD", "OPTIONS"}


def operations(app: Quart) -> set[tuple[str, str]]:
    """(method, OpenAPI path) of every rule of an app but the router's catch-all proxy."""
    ops = set()
    for rule in app.url_map.iter_rules():
        if rule.endpoint in ("static", "front_door.catch_all"):
            continue
        path = re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", rule.rule)
        ops |= {(m.lower(), path) for m in rule.methods or () if m not in IGNORED_METHODS}
    return ops


def documented(routes: tuple[Route, ...]) -> set[tuple[str, str]]:
    return {(route.method, path) for route in routes for path in route.paths}


def test_the_document_lists_every_route_the_app_serves_and_no_other() -> None:
    mcp = McpServerConfig(name="t", command="true")  # MCP's /tools included
    assert operations(create_app(Settings(model="unused", mcp_servers=(mcp,)))) == documented(ROUTES)


def test_the_router_document_lists_its_own_routes_and_the_proxied_ones() -> None:
    """The router's rules (its own routes, the conversation-routed stream routes, the web UI) are all
    documented; every other path goes to a model server, whose routes the document lists too."""
    served = operations(create_router_app(Settings(), build_catalogue(None, None), []))
    assert documented(ROUTER_ROUTES) <= served <= documented(router_routes())
    assert documented(router_routes()) == documented(ROUTES) | documented(ROUTER_ROUTES)


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
