"""A request for an unknown session says how to get one (issue 45, item 2): ``/sessions/{id}/...`` was documented
without how to get an id, and its 404 only said the id was unknown; it now names ``POST /sessions``."""
from __future__ import annotations

import httpx

from envs import serve
from tests.served import serve_app


def test_unknown_session_404s_name_post_sessions():
    with serve_app(serve.build_app("GSM8K-v1")) as (url, _), httpx.Client(base_url=url, timeout=60) as http:
        for r in (http.post("/sessions/nope/reset", json={}), http.get("/sessions/nope/state"),
                  http.post("/sessions/nope/step", json={"action": {"content": "hi"}}), http.delete("/sessions/nope")):
            assert r.status_code == 404 and "unknown session" in r.json()["detail"], r.text
            assert "POST /sessions" in r.json()["detail"], r.text
        sid = http.post("/sessions").json()["session_id"]  # what the message says to do
        assert http.post(f"/sessions/{sid}/reset", json={"index": 0}).status_code == 200
