"""The MCP protocols of :mod:`envs.serve` in one call: :func:`add_mcp_protocols`."""
from __future__ import annotations

from envs.serving.mcp_routes import add_session_mcp_routes
from envs.serving.openenv_mcp_routes import add_openapi_route, add_openenv_mcp_routes
from envs.serving.sessions import _Sessions

__all__ = ["add_mcp_protocols"]


def add_mcp_protocols(app, sessions: _Sessions, *, max_body_bytes: int) -> None:
    """Serve ``/sessions/{id}/mcp`` (standard MCP, :mod:`envs.serving.mcp_routes`), OpenEnv's ``/mcp``
    (:mod:`envs.serving.openenv_mcp_routes`) and ``/openapi.json`` on the FastAPI ``app``, over the server's session
    registry ``sessions``; ``max_body_bytes`` is the body cap."""
    add_session_mcp_routes(app, sessions, max_body_bytes=max_body_bytes)
    add_openenv_mcp_routes(app, sessions)
    add_openapi_route(app)
