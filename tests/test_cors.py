"""CORS as llama-server answers it (server/http/cors.py): the preflight's headers and their flags
(--cors-methods, --cors-headers, --cors-credentials), --cors-origins `localhost`, a refused origin's
preflight, and the header names' case on the wire (server/http/header_case.py).

The policy comes from the settings alone, so it is asked in process (Quart's test client); the header
case is hypercorn's and is asked of the real server in tests/test_builtin_tools_server.py."""

from __future__ import annotations

from typing import Any

import pytest

from server.app import create_app
from server.config.parse import parse_settings
from server.config.settings import Settings
from server.http.header_case import canonical

PREFLIGHT = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "Authorization"}
ALLOW = ("Access-Control-Allow-Origin", "Access-Control-Allow-Credentials", "Access-Control-Allow-Methods",
         "Access-Control-Allow-Headers")  # fmt: skip


async def preflight(settings: Settings, origin: str, path: str = "/completions") -> Any:
    app = create_app(settings)
    return await app.test_client().options(path, headers={"Origin": origin, **PREFLIGHT})


def test_cors_flags_parse_as_llama_servers() -> None:
    default, _ = parse_settings([], {})
    assert (default.cors_origins, default.cors_methods, default.cors_headers) == (
        None,
        "GET, POST, DELETE, OPTIONS",
        "*",
    )
    assert default.cors_credentials is True
    argv = ["--cors-origins", "localhost,http://app.example/", "--cors-methods", "GET", "--cors-headers",
            "Authorization, Content-Type", "--no-cors-credentials"]  # fmt: skip
    given, ignored = parse_settings(argv, {})
    assert given.cors_origins == ("localhost", "http://app.example") and not ignored
    assert (given.cors_methods, given.cors_headers, given.cors_credentials) == (
        "GET",
        "Authorization, Content-Type",
        False,
    )
    env = {"LLAMA_ARG_CORS_HEADERS": "X-Custom", "LLAMA_ARG_CORS_CREDENTIALS": "0"}
    from_env, ignored = parse_settings([], env)
    assert from_env.cors_headers == "X-Custom" and from_env.cors_credentials is False and not ignored


@pytest.mark.anyio
@pytest.mark.parametrize("path", ["/completions", "/v1/chat/completions", "/no/such/route"])
async def test_a_preflight_is_answered_at_once_with_llama_servers_headers(path: str) -> None:
    # Any path, before the key check: browsers send a preflight without credentials.
    reply = await preflight(Settings(api_keys=("sk-secret",)), "web.mydomain.fr", path)
    assert reply.status_code == 200 and await reply.get_data() == b""
    assert [reply.headers[h] for h in ALLOW] == ["web.mydomain.fr", "true", "GET, POST, DELETE, OPTIONS", "*"]


@pytest.mark.anyio
async def test_the_preflight_headers_follow_their_flags() -> None:
    settings = Settings(cors_methods="GET, POST", cors_headers="Authorization", cors_credentials=False)
    reply = await preflight(settings, "http://app.example")
    assert [reply.headers[h] for h in ALLOW] == ["*", "false", "GET, POST", "Authorization"]
    # Without credentials, an explicit list still names the page itself (a list is not one origin).
    listed = settings.model_copy(update={"cors_origins": ("http://app.example",)})
    assert (await preflight(listed, "http://app.example")).headers["Access-Control-Allow-Origin"] == (
        "http://app.example"
    )


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("origin", "allowed"),
    [
        ("http://localhost", True),
        ("http://localhost:8080", True),
        ("https://127.0.0.1:3000", True),
        ("http://[::1]", True),
        ("http://[::1]:3000", True),
        ("http://web.mydomain.fr", False),
        ("http://notlocalhost", False),
        ("http://localhost.evil.com", False),
        ("http://localhost@evil.com", False),
        ("http://app.example", True),  # listed beside `localhost`
    ],
)
async def test_cors_origins_localhost_allows_this_machines_pages(origin: str, allowed: bool) -> None:
    settings = Settings(cors_origins=("localhost", "http://app.example"))
    reply = await preflight(settings, origin)
    assert reply.status_code == 200  # a refused origin's preflight is answered too, without the headers
    assert reply.headers.get("Access-Control-Allow-Origin") == (origin if allowed else None)
    assert ("Access-Control-Allow-Methods" in reply.headers) is allowed
    app = create_app(settings)
    health = await app.test_client().get("/health", headers={"Origin": origin})
    # Llamba's one refusal beyond llama-server's: the request itself, which a browser may send unasked.
    assert (health.status_code == 403) is not allowed


@pytest.mark.anyio
async def test_tools_make_localhost_the_default() -> None:
    tools = Settings(tools=("read_file",))
    assert (await preflight(tools, "http://localhost:8080")).headers["Access-Control-Allow-Origin"] == (
        "http://localhost:8080"
    )
    assert "Access-Control-Allow-Origin" not in (await preflight(tools, "http://evil.com")).headers
    assert (await preflight(Settings(), "http://evil.com")).headers["Access-Control-Allow-Origin"] == (
        "http://evil.com"
    )


@pytest.mark.parametrize(
    ("name", "wire"),
    [
        (b"access-control-allow-origin", b"Access-Control-Allow-Origin"),
        (b"content-type", b"Content-Type"),
        (b"x-request-id", b"X-Request-Id"),
        (b"etag", b"Etag"),
        (b"process-start-time-unix", b"Process-Start-Time-Unix"),
    ],
)
def test_header_names_take_llama_servers_case(name: bytes, wire: bytes) -> None:
    assert canonical(name) == wire
