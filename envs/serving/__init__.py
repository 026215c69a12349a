"""The protocols :mod:`envs.serve` speaks, one module each, over one session store and one set of bounds.

* :mod:`envs.serving.mcp_routes` -- standard MCP (the ``mcp`` SDK's Streamable HTTP transport) at
  ``/sessions/{id}/mcp``: a session's tools for any MCP agent.
* :mod:`envs.serving.openenv_mcp_routes` -- OpenEnv's JSON-RPC dialect at ``/mcp`` (``openenv/session/create|close``,
  ``tools/list``, ``tools/call``) and ``/openapi.json`` (what ``openenv validate --url`` reads).

Every route here is mounted by :func:`envs.serve.build_app` inside its ASGI guard (``Origin`` / ``Host`` checks,
body size and time), and every env operation runs on its session's own thread through the same session registry
(cap, idle timeout, ``max_session_bytes``), so no route here can bypass a bound.
"""
