"""What a model server's routes share: one typed `AppState` on the app, set once by `create_app`.

Routes read it through `app_state()` (the model, stream sessions, stored responses, the toolbox, the
request limits) instead of one extension key per part. The router and the cluster keep their own
context objects (server/router/app.py, server/cluster/app.py). The parts are imported for their types
only, so every layer above the config may read the state without importing the layers that fill it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from quart import Quart, current_app

from server.config.limits import RequestLimits

if TYPE_CHECKING:
    from server.agents.toolbox import Toolbox
    from server.apis.responses.runs import ResponsesState
    from server.model.host import ModelHost
    from server.streams.sessions import SessionStore

STATE_KEY = "llamba"


@dataclass
class AppState:
    model: ModelHost
    sessions: SessionStore
    responses: ResponsesState
    limits: RequestLimits
    toolbox: Toolbox | None = None  # only with --tools or MCP servers: /tools runs code on this host

    def install(self, app: Quart) -> None:
        app.extensions[STATE_KEY] = self

    @staticmethod
    def of(app: Quart) -> AppState:
        return app.extensions[STATE_KEY]


def app_state() -> AppState:
    """The state of the app answering the current request."""
    return current_app.extensions[STATE_KEY]


def request_limits() -> RequestLimits:
    """The current app's request limits; the router and the cluster, which have no AppState, use the
    defaults."""
    state = current_app.extensions.get(STATE_KEY)
    return state.limits if isinstance(state, AppState) else RequestLimits()
