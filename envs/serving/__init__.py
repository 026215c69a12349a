"""The pieces of :mod:`envs.serve` (which wires them in ``build_app``): each protocol's routes in a module of its own,
over one session registry and one set of bounds.

Shared: ``limits`` (every bound's default, :func:`_check_bounds`), ``environment`` (one session's env, the wire
models, the errors, one request's work on the session's thread), ``sessions`` (the session registry: cap, threads,
idle reaper; the chunked reply), ``session_threads`` (each session's thread, started off the event loop), ``guard`` (the ASGI guard in front of every route and uvicorn's timed protocols).

Protocols: ``session_routes`` (``/sessions...`` over HTTP), ``stateless_routes`` (OpenEnv's ``/reset``, ``/step``,
``/state``), ``ws_routes`` (``/ws``), ``info_routes`` (``/health``, ``/schema``, ``/metadata``, the 404),
``mcp_routes`` (standard MCP at ``/sessions/{id}/mcp``, the ``mcp`` SDK), ``openenv_mcp_routes`` (OpenEnv's ``/mcp``
dialect, ``/openapi.json``); ``agent_tools`` is the tool mapping both MCP routes share, ``protocols`` wires them.

Every route is mounted by :func:`envs.serve.build_app` inside its ASGI guard (``Origin`` / ``Host`` checks, body size
and time, connections and bodies in flight), and every env operation runs on its session's own thread through the
same registry (cap, idle timeout, ``max_session_bytes``), so no route can bypass a bound
(``tests/test_serve_structure.py`` pins this).
"""
