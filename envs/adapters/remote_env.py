"""A client of an env served by ``python -m envs.serve`` (:class:`RemoteEnv`), bounded against a hostile server.

The server is another party: what it sends is bounded before it costs memory or time here (issue 42). The bounds
(:class:`ClientBounds`, defaults below; the measured replies of tau2's four domains for scale: at most 67 KB,
JSON depth 14, 265 objects/arrays, 273 schema nodes and 10.2 KB of schema text once ``$defs`` are expanded):

==========================  ===========  ==========================================================================
bound                       default      what it stops
==========================  ===========  ==========================================================================
``max_reply_bytes``         8 MiB        a reply larger than this *after* permessage-deflate decompression is refused
                                         while it is decompressed (websockets' ``max_size``): a 61 KB compressed
                                         reply used to expand to 64 MiB of text and 1.7 GB of parsed JSON
``max_json_depth``          64           a reply nested deeper (a 200k-deep one raised ``RecursionError`` in
                                         ``json.loads``); checked by a linear scan before parsing
``max_json_containers``     100,000      more JSON objects + arrays in one reply (``[{},{},...]``: ~24 bytes of
                                         Python per byte of text); the same scan
``max_schema_nodes``        50,000       the tool schemas' nodes once their ``$defs`` are expanded, all tools of a
                                         class together (:mod:`envs.adapters.trl_env`; a 573-byte schema whose
                                         ``$defs`` reference themselves 12 times per level grew to 2.1 GB)
``max_schema_bytes``        1 MiB        the same schemas' JSON text once expanded: every string, key and number
                                         counted at every copy a ``$ref`` makes (nodes miss that a ``$ref``
                                         reuses one object: a 2 MiB string in a ``$defs`` entry that refers to
                                         itself twice is ~900 nodes but 128 copies in a docstring; issue 49: a
                                         2 MiB schema peaked at 1.07 GB, 6 MiB ran out of 3 GiB). Escapes are
                                         not counted, so a docstring holds at most ~6x this
==========================  ===========  ==========================================================================

and a redirect of the WebSocket handshake to another origin (scheme, host or port) is refused (websockets >= 15
follows redirects; a same-origin one, another path on the same server, is followed). With the defaults, the costliest
reply a hostile server can send (8 MiB of two-character strings beside 99,991 empty objects) peaked the client at 177
MB RSS (its baseline 45 MB); the bombs above are refused within 0.7 s at under 61 MB
(``tests/test_remote_client_bounds.py``).
Every refusal is a :class:`RemoteBoundError` whose ``bound`` names the bound (``"max_reply_bytes"``,
``"max_json_depth"``, ``"max_json_containers"``, ``"max_schema_nodes"``, ``"max_schema_bytes"``, ``"redirect"``) and
whose message gives its value. Change a bound with ``RemoteEnv(url, bounds=ClientBounds(max_reply_bytes=...))`` or
``environment_factory(url=..., bounds=ClientBounds(...))``.

The client speaks only the WebSocket ``/ws`` (no HTTP client here): there is no HTTP body to stream.
"""
from __future__ import annotations

import dataclasses
import json
import socket
import threading
import urllib.parse
from typing import Any

from envs.action_text import json_shape

__all__ = ["ClientBounds", "RemoteBoundError", "RemoteEnv", "RemoteEnvError", "check_json_shape"]


class RemoteEnvError(RuntimeError):
    """The server answered an ``error`` message (``code``: OpenEnv's, e.g. ``VALIDATION_ERROR``, ``EXECUTION_ERROR``,
    ``CAPACITY_REACHED``), or a reply that is not a JSON object (``code`` ``"BAD_REPLY"``)."""

    def __init__(self, message: str, code: str | None = None):
        super().__init__(f"{code}: {message}" if code else message)
        self.code = code


class RemoteBoundError(RemoteEnvError):
    """The server sent something past a client bound (:class:`ClientBounds`); ``bound`` names it (``code`` is
    ``"CLIENT_BOUND"``). Nothing of that reply was kept; the session should be closed."""

    def __init__(self, bound: str, message: str):
        super().__init__(f"{bound}: {message}", "CLIENT_BOUND")
        self.bound = bound


@dataclasses.dataclass(frozen=True)
class ClientBounds:
    """What a client accepts from a server (module docstring: defaults and what each stops).

    Raises:
        ValueError: a bound that is not an int >= 1.
    """

    #: largest reply, in bytes after decompression
    max_reply_bytes: int = 8 << 20
    #: deepest nesting of JSON arrays/objects in one reply
    max_json_depth: int = 64
    #: most JSON arrays + objects in one reply
    max_json_containers: int = 100_000
    #: most nodes (objects, arrays, scalars) of a class's tool schemas once ``$defs`` are expanded
    max_schema_nodes: int = 50_000
    #: most bytes of JSON text (strings, keys, numbers at every copy) of a class's tool schemas once ``$defs`` are
    #: expanded
    max_schema_bytes: int = 1 << 20

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"ClientBounds.{f.name} must be an int >= 1, got {v!r}")


def check_json_shape(text: str, max_depth: int, max_containers: int) -> None:
    """Refuse a JSON text nested deeper than ``max_depth`` or holding more than ``max_containers`` arrays + objects,
    before ``json.loads`` sees it (whose C parser recurses: a deep text raises ``RecursionError``). Read by the
    server's scanner, :func:`envs.action_text.json_shape` (brackets outside string literals; linear time, at most
    ~10 bytes of transient memory per byte: an 8 MiB reply of escaped quotes in ~0.1 s on an idle core). A text whose brackets do not
    balance is not JSON: it is refused when its brackets could nest past the bound, else left to ``json.loads``.

    Raises:
        RemoteBoundError: ``bound`` ``"max_json_depth"`` or ``"max_json_containers"``.
    """
    depth, containers = json_shape(text)
    if containers > max_containers:
        raise RemoteBoundError("max_json_containers", f"the reply holds {containers} JSON arrays/objects, more than "
                                                      f"{max_containers}")
    if depth > max_depth:
        raise RemoteBoundError("max_json_depth", f"the reply nests JSON {depth} deep, more than {max_depth}")


def parse_reply(raw: str | bytes, bounds: ClientBounds) -> Any:
    """``json.loads(raw)`` after :func:`check_json_shape` (``raw`` already within ``max_reply_bytes``).

    Raises:
        RemoteBoundError: see :func:`check_json_shape`.
        RemoteEnvError: ``code`` ``"BAD_REPLY"``: not UTF-8 or not JSON.
    """
    try:
        text = raw.decode("utf-8") if isinstance(raw, (bytes, bytearray)) else raw
    except UnicodeDecodeError as e:
        raise RemoteEnvError(f"the reply is not UTF-8 ({e})", "BAD_REPLY") from None
    check_json_shape(text, bounds.max_json_depth, bounds.max_json_containers)
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:  # JSONDecodeError; an int past Python's 4300-digit limit
        raise RemoteEnvError(f"the reply is not JSON ({str(e):.200})", "BAD_REPLY") from None


def _ws_url(url: str) -> str:
    """``ws[s]://host:port/ws`` of a server URL given as ``http[s]://host:port`` or ``ws[s]://host:port[/ws]``."""
    if not isinstance(url, str) or "://" not in url:
        raise ValueError(f"url must look like http://host:port or ws://host:port, got {url!r:.100}")
    scheme, rest = url.split("://", 1)
    scheme = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}.get(scheme.lower())
    if scheme is None:
        raise ValueError(f"url scheme must be http, https, ws or wss, got {url!r:.100}")
    rest = rest.rstrip("/")
    return f"{scheme}://{rest}" + ("" if rest.endswith("/ws") else "/ws")


def _origin(uri: str) -> tuple[str, str, int | None]:
    u = urllib.parse.urlsplit(uri)
    secure = u.scheme in ("wss", "https")
    return ("wss" if secure else "ws", (u.hostname or "").lower(), u.port or (443 if secure else 80))


def _connect(url: str, timeout_s: float, bounds: ClientBounds):
    """A websockets sync connection to ``url`` that follows no redirect to another origin (websockets >= 15 follows
    them; older versions follow none), with ``max_size`` = ``bounds.max_reply_bytes`` (decompressed bytes) and a
    receive queue of 4 frames (a server pushing unrequested messages holds at most 4 replies here)."""
    from websockets.sync import client

    kwargs = dict(open_timeout=timeout_s, close_timeout=5, max_size=bounds.max_reply_bytes, max_queue=4)
    if not hasattr(client, "reconnect"):  # websockets < 15: its sync client follows no redirect
        return client.connect(url, **kwargs)

    class _SameOrigin(client.reconnect):
        def process_redirect(self, exc: Exception) -> Exception | str:
            target = super().process_redirect(exc)
            if isinstance(target, str) and _origin(target) != _origin(url):
                return RemoteBoundError("redirect", f"the server at {url} redirected to {target}, another origin; "
                                                    f"a client follows no redirect to another origin")
            return target

    connection = _SameOrigin(url, **kwargs).connect()
    connection.pending_legacy_warning = False  # we close it ourselves (RemoteEnv.close)
    return connection


class RemoteEnv:
    """One session of an env served by ``python -m envs.serve`` (its OpenEnv WebSocket ``/ws``: one socket, one env
    instance on the server), with the Gymnasium ``reset`` / ``step`` / ``close`` of the env it serves.

    Args:
        url: the server, ``http://host:port`` or ``ws://host:port`` (``/ws`` is added).
        timeout_s: seconds to wait for the connection, for each request to be sent and for each reply (> 0).
        bounds: what a reply may cost (:class:`ClientBounds`; module docstring): by default at most 8 MiB after
            decompression, JSON nested at most 64 deep with at most 100,000 arrays/objects; no redirect to
            another origin.

    ``reset(seed=None, options=None) -> (obs, info)`` and ``step(action) -> (obs, reward, terminated, truncated,
    info)`` as the served env's (``obs`` the new messages; ``info`` without ``messages``, and on ``step`` without
    ``tools``, as the server sends it). An action is an assistant message dict or raw text; a dict without tool
    calls is sent with an empty ``tool_calls`` list, so its text reaches the customer as is (never parsed for tool
    calls), as with ``gym.make``.

    Raises:
        ValueError: a malformed ``url`` or ``timeout_s``.
        RemoteBoundError: a reply or a redirect past ``bounds`` (``bound`` names which).
        RemoteEnvError: the server answered an error (bad task id, session cap reached, ...) or a reply that is not
            a JSON object (``code`` ``"BAD_REPLY"``).
        OSError, websockets.exceptions.WebSocketException, TimeoutError: the connection failed or timed out.
    """

    def __init__(self, url: str, timeout_s: float = 300.0, *, bounds: ClientBounds | None = None):
        if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        if bounds is not None and not isinstance(bounds, ClientBounds):
            raise ValueError(f"bounds must be a ClientBounds, got {type(bounds).__name__}")
        self.url, self.timeout_s, self.bounds = _ws_url(url), float(timeout_s), bounds or ClientBounds()
        self._ws = _connect(self.url, self.timeout_s, self.bounds)

    def _recv(self) -> Any:
        from websockets.exceptions import ConnectionClosed
        from websockets.frames import CloseCode

        try:
            raw = self._ws.recv(timeout=self.timeout_s)
        except ConnectionClosed as e:
            if e.sent is not None and e.sent.code == CloseCode.MESSAGE_TOO_BIG:
                raise RemoteBoundError("max_reply_bytes", f"the reply is larger than {self.bounds.max_reply_bytes} "
                                                          f"bytes (after decompression)") from None
            raise
        return parse_reply(raw, self.bounds)

    def _send(self, text: str) -> None:
        """Send one request, within ``timeout_s``: websockets' sync ``send`` has no timeout and blocks for as long as
        a server that does not read leaves the socket full, so a timer shuts the socket down when the time is up
        (the connection is then unusable, as after any timeout) and :class:`TimeoutError` is raised."""
        timed_out = threading.Event()

        def abort() -> None:
            timed_out.set()
            try:
                self._ws.socket.shutdown(socket.SHUT_RDWR)
            except OSError:  # already closed
                pass

        timer = threading.Timer(self.timeout_s, abort)
        timer.daemon = True
        timer.start()
        try:
            self._ws.send(text)
        except Exception as e:
            if timed_out.is_set():
                raise TimeoutError(f"the request was not sent within {self.timeout_s:g} s (the server at {self.url} "
                                   f"does not read it)") from e
            raise
        finally:
            timer.cancel()
        if timed_out.is_set():  # sent, but only as the time ran out: the socket is shut now
            raise TimeoutError(f"the request was not sent within {self.timeout_s:g} s (the server at {self.url})")

    def _call(self, kind: str, data: Any = None) -> dict:
        self._send(json.dumps({"type": kind, "data": data}))
        reply = self._recv()
        if not isinstance(reply, dict):
            raise RemoteEnvError(f"unexpected reply {reply!r:.200}", "BAD_REPLY")
        if reply.get("type") == "error":
            err = reply.get("data") or {}
            raise RemoteEnvError(str(err.get("message", "error")), err.get("code"))
        return reply.get("data") or {}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[list[dict], dict]:
        data = dict(options or {})
        if seed is not None:
            data["seed"] = seed
        out = self._call("reset", data).get("observation") or {}
        return list(out.get("messages") or []), dict(out.get("info") or {})

    def step(self, action: dict | str) -> tuple[list[dict], float, bool, bool, dict]:
        if isinstance(action, str):
            payload: dict = {"content": action}
        else:
            payload = {"content": action.get("content"), "tool_calls": list(action.get("tool_calls") or [])}
        data = self._call("step", payload)
        out = data.get("observation") or {}
        reward = data.get("reward")
        return (list(out.get("messages") or []), float(reward or 0.0), bool(out.get("terminated")),
                bool(out.get("truncated")), dict(out.get("info") or {}))

    def state(self) -> dict:
        """The session's state (``env_id``, ``task_id``, whole conversation, ``db_hash`` for tau2)."""
        return self._call("state")

    def close(self) -> None:
        self._ws.close()
