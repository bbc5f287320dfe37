"""server/apis/openapi/surface.py's route rows match the routes the apps register (docs/compatibility.md, made
from them, is checked current in tests/test_llama_server_flags.py), and field statuses follow the
schemas."""

from __future__ import annotations

import pytest
from quart import Quart

from server.apis.openapi.surface import (
    BODIES,
    MCP,
    PROXY,
    ROUTER,
    ROUTES,
    SERVER,
    UNKNOWN_STATUS,
    field_status,
)
from server.app import create_app
from server.config.parse import parse_settings
from server.mcp.config import McpServerConfig
from server.router.app import create_router_app
from server.router.catalogue import build_catalogue

# What the apps serve beside the API: the web UI and its files, and the router's catch-all proxy.
NOT_API = ("/", "/index.html", "/assets/<path:relative>", "/static/<path:filename>", "/<path:path>")


def _registered(app: Quart) -> set[tuple[str, str]]:
    return {
        (method, rule.rule)
        for rule in app.url_map.iter_rules()
        if rule.rule not in NOT_API
        for method in rule.methods or ()
        if method not in ("HEAD", "OPTIONS")
    }


@pytest.fixture(scope="module")
def apps() -> dict[str, set[tuple[str, str]]]:
    settings, _ = parse_settings(["-m", "smollm2"], {})
    with_mcp = settings.model_copy(update={"mcp_servers": (McpServerConfig(name="t", command="true"),)})
    router = create_router_app(parse_settings([], {})[0], build_catalogue(None, None), [])
    with_proxy = settings.model_copy(update={"ui_mcp_proxy": True})
    routes = {SERVER: _registered(create_app(settings)), MCP: _registered(create_app(with_mcp))}
    routes[PROXY] = _registered(create_app(with_proxy))
    routes[ROUTER] = _registered(router)
    return routes


def test_each_route_row_is_what_its_app_registers(apps: dict[str, set[tuple[str, str]]]) -> None:
    for route in ROUTES:
        registered = (route.method, route.path) in apps[route.mode]
        assert registered == route.implemented, f"{route.method} {route.path} ({route.mode})"


def test_every_registered_route_has_a_row(apps: dict[str, set[tuple[str, str]]]) -> None:
    # The MCP and proxy apps serve every route of the server; the router serves some of them itself
    # (health, props, the stream routes) beside its own.
    modes = (MCP, PROXY, ROUTER)
    rows = {(mode, route.method, route.path) for route in ROUTES for mode in (route.mode, *modes)}
    for mode, registered in apps.items():
        missing = {(m, p) for m, p in registered if (mode, m, p) not in rows}
        assert not missing, f"routes of the {mode} without a row in server/apis/openapi/surface.py: {missing}"


def test_field_statuses_follow_the_schemas() -> None:
    body = next(b for b in BODIES if b.routes == "/v1/completions")
    assert field_status(body, "suffix") == "implemented"
    assert field_status(body, "user").startswith("accepted: metadata")
    assert field_status(body, "best_of").startswith("accepted, no effect: llama-server does not read it")
    chat = next(b for b in BODIES if b.routes == "/v1/chat/completions")
    assert field_status(chat, "verbosity").startswith("not implemented: accepted only at `'medium'`")
    native = next(b for b in BODIES if b.routes == "/completion")
    assert field_status(native, "sse_ping_interval").startswith("accepted, no effect: no SSE comment pings")
    assert field_status(native, "return_tokens") == field_status(native, "t_max_predict_ms") == "implemented"
    assert field_status(chat, "n_probs") == "implemented"
    assert field_status(chat, "no_such_field") == UNKNOWN_STATUS
    for b in BODIES:
        assert len(b.fields) == len(set(b.fields)), b.routes
