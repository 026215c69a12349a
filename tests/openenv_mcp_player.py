"""Play one episode through ``openenv==0.10.0``'s own ``MCPToolClient`` (run by ``tests/test_openenv_mcp_client.py``
with the python of the venv ``.ci/openenv-mcp-stage`` builds: openenv 0.10 pins fastmcp 3 / mcp < 2 and cannot share
the project's venv).

    python tests/openenv_mcp_player.py URL  < {"reset": {...}, "calls": [[name, arguments], ...]}

``MCPToolClient(base_url=URL)`` opens its session (``openenv/session/create`` over ``POST /mcp``) and attaches the
WebSocket to it (``/ws?session_id=ID``); ``reset(**reset)`` goes over that socket, ``list_tools()`` and each
``call_tool(name, **arguments)`` over ``/mcp`` with the session id. Before the client closes the session, the
reward is read from ``GET /sessions/ID/state`` (``MCPToolClient.state()`` keeps only the episode id and step count).
Prints one JSON line: ``{"tools", "results", "state"}``.
"""
from __future__ import annotations

import asyncio
import json
import sys

import httpx
from openenv.core.mcp_client import MCPToolClient


async def play(url: str, reset: dict, calls: list) -> dict:
    async with MCPToolClient(base_url=url, message_timeout_s=120.0) as env:
        await env.reset(**reset)
        tools = [t.name for t in await env.list_tools()]
        results = [await env.call_tool(name, **arguments) for name, arguments in calls]
        sid = env._production_session_id  # the client's session (no public accessor in 0.10)
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            state = (await http.get(f"/sessions/{sid}/state")).json()
    return {"tools": tools, "results": results, "state": state, "session_id": sid}


if __name__ == "__main__":
    job = json.load(sys.stdin)
    print(json.dumps(asyncio.run(play(sys.argv[1], job["reset"], job["calls"]))), flush=True)
