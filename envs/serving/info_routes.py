"""``GET /health``, ``/schema``, ``/metadata`` (none builds an env) and the 404 of any other path."""
from __future__ import annotations

try:  # the optional extra [serve]
    from fastapi import FastAPI, Request
    from fastapi.responses import Response
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("envs.serve needs the [serve] extra: pip install -e '.[serve]' (openenv-core)") from e

from envs.serving.environment import TextAction, TextObservation, TextState, _dumps, _metadata
from envs.serving.sessions import _json


#: The routes, as named in a 404's message.
SERVED_ROUTES = ("POST /reset, POST /step, GET /state (OpenEnv's stateless routes); POST /sessions, "
                 "POST /sessions/{id}/reset, POST /sessions/{id}/step, GET /sessions/{id}/state, DELETE /sessions/{id}, "
                 "GET /sessions; MCP /sessions/{id}/mcp; POST /mcp (OpenEnv's MCP); WebSocket /ws; GET /health, /schema, "
                 "/metadata, /openapi.json")


def _add_not_found_handler(app: FastAPI) -> None:
    """Any other path: 404 whose detail lists :data:`SERVED_ROUTES`."""
    async def not_found(request: Request, exc: Exception) -> Response:
        msg = f"no route {request.method} {request.url.path!r:.100}; served: {SERVED_ROUTES}"
        return _json(404, _dumps({"detail": msg}))

    app.add_exception_handler(404, not_found)


def _add_info_routes(app: FastAPI, env_id: str) -> None:
    """``GET /health``, ``/schema`` (the action, observation and state JSON schemas) and ``/metadata``; none builds an
    env."""
    schema = {"action": TextAction.model_json_schema(), "observation": TextObservation.model_json_schema(),
              "state": TextState.model_json_schema()}
    metadata = _metadata(env_id).model_dump()

    @app.get("/health")
    async def health() -> dict:
        return {"status": "healthy"}

    @app.get("/schema")
    async def get_schema() -> dict:
        return schema

    @app.get("/metadata")
    async def get_metadata() -> dict:
        return metadata
