"""The client's bounds count what they must bound (issue 49, holes 1 and 2).

1. The client's JSON shape check (:func:`envs.adapters.remote_env.check_json_shape`) reads a reply with the server's
   scanner (:func:`envs.action_text.json_shape`), linear in the reply: a second copy of the string pattern in the
   client, without the server's "an unclosed string ends at the end of the text" branch, rescanned to the end at
   every quote of ``"`` + ``\\"`` * n (16 KB 2.9 s, 32 KB 12.4 s; ``RemoteEnv.reset(timeout_s=5)`` against a
   server sending 64 KB of it froze the whole client process, GIL held).
2. The TRL adapter's tool schemas are bounded on the size of the text they expand to (``max_schema_bytes``) as well
   as on their nodes (``max_schema_nodes``): a ``$ref`` reuses one object, so a 2 MiB string inside a
   self-referencing ``$defs`` costs one node per copy but 2 MiB per copy once serialised into the method's
   docstring (2 MiB peaked at 1.07 GB, 6 MiB hit MemoryError at 3 GiB).

The hostile servers and the victim process (an address-space limit, a wall-clock timeout, its peak RSS) are those of
``tests/test_remote_client_bounds.py``.
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time

import pytest

pytest.importorskip("websockets")

from envs.action_text import json_depth  # noqa: E402
from envs.adapters.remote_env import ClientBounds, RemoteBoundError, check_json_shape  # noqa: E402
from tests.test_remote_client_bounds import (_VICTIM, REPO, VICTIM_AS_BYTES, _opening,  # noqa: E402
                                             hostile_server)

#: One shape check of a reply up to 1 MiB: linear code takes ~10 ms on an idle core, the quadratic copy took 2.9 s
#: at 16 KB (and 4x that per doubling).
BOUND_S = 0.5
#: The same at the largest reply a client accepts (``max_reply_bytes``, 8 MiB).
BOUND_MAX_REPLY_S = 3.0


def _escaped_quotes(n: int) -> str:
    """``"`` followed by ``\\"`` repeated, never closed: about ``n`` characters."""
    return '"' + '\\"' * (n // 2)


def _victim(action: str, timeout_s: float) -> dict:
    """``action`` in a fresh interpreter under :data:`VICTIM_AS_BYTES`; fails the test if it runs past
    ``timeout_s`` (the client froze)."""
    try:
        p = subprocess.run([sys.executable, "-c", _VICTIM.format(limit=VICTIM_AS_BYTES, action=action)], cwd=REPO,
                           env={**os.environ, "MALLOC_ARENA_MAX": "2", "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
                           capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the client was still working after {timeout_s} s (unbounded)")
    lines = [x for x in p.stdout.splitlines() if x.startswith("VICTIM ")]
    assert lines, f"the victim died (rc {p.returncode}): {p.stderr[-2000:]}"
    return json.loads(lines[-1][len("VICTIM "):])


# ------------------------------------------------------------------------------- 1. one linear JSON scanner
@pytest.mark.parametrize("head", ["", "[" * 100, '{"type": "observation", "data": ', "]" * 3])
def test_the_reply_check_is_linear_on_an_unclosed_run_of_escaped_quotes(head):
    """4 KB, 16 KB, 64 KB, 1 MiB (small first, so that quadratic code fails in seconds), then 8 MiB."""
    for n, bound in ((4 << 10, BOUND_S), (16 << 10, BOUND_S), (64 << 10, BOUND_S), (1 << 20, BOUND_S),
                     (8 << 20, BOUND_MAX_REPLY_S)):
        text = head + _escaped_quotes(n - len(head))
        t0 = time.perf_counter()
        try:
            check_json_shape(text, max_depth=64, max_containers=100_000)
        except RemoteBoundError as e:  # "[" * 100 before it: too deep, and said so
            assert head == "[" * 100 and e.bound == "max_json_depth", e
        dt = time.perf_counter() - t0
        assert dt < bound, f"check_json_shape took {dt:.3f} s on {len(text)} characters ({text[:16]!r}...)"


def test_reset_returns_within_its_timeout_against_that_reply():
    """A server answering ``reset`` with 64 KB of ``"\\"\\"...``: ``RemoteEnv(url, timeout_s=5).reset()`` raises
    ``RemoteEnvError`` (``BAD_REPLY``: not JSON) within its 5 s (it used to freeze the process for minutes)."""
    with hostile_server(_escaped_quotes(64 << 10)) as (url, _):
        out = _victim(f"RemoteEnv({url!r}, timeout_s=5).reset()", timeout_s=30)
    assert out["raised"] == "RemoteEnvError" and "BAD_REPLY" in out["message"], out
    assert out["seconds"] < 5, out


def _random_json_like(rng: random.Random) -> str:
    alphabet = ["[", "]", "{", "}", '"', "\\", '\\"', "a", ",", ":", " ", '"x"', "[[", "\\\\", "\u00e9", "\ud800"]
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))


def _as_json_reads_it(text: str) -> tuple[int, int, bool]:
    """``(depth, containers, whole)``: the nesting and the ``[``/``{`` of ``text`` read one character at a time as
    JSON's grammar delimits strings, up to the first backslash outside a string (where ``json.loads`` fails;
    ``whole`` is False then)."""
    depth = deepest = containers = 0
    inside = escaped = False
    for c in text:
        if inside:
            escaped, inside = (False, True) if escaped else (c == "\\", c != '"')
        elif c == '"':
            inside = True
        elif c == "\\":
            return deepest, containers, False
        elif c in "[{":
            depth, containers = depth + 1, containers + 1
            deepest = max(deepest, depth)
        elif c in "]}":
            depth -= 1
    return deepest, containers, True


def test_client_and_server_read_nesting_as_json_does():
    """One scanner (:func:`json_shape`, the server's :func:`json_depth` too) reads random bracket / quote /
    backslash texts as JSON's grammar does: exactly where a backslash sits only inside strings, and never less than
    the prefix ``json.loads`` can read otherwise; the client refuses a reply on exactly what it reads."""
    from envs.action_text import json_shape

    rng = random.Random(49)
    whole_texts = 0
    for _ in range(20_000):
        text = _random_json_like(rng)
        depth, containers = json_shape(text)
        assert depth == json_depth(text), text
        ref_depth, ref_containers, whole = _as_json_reads_it(text)
        whole_texts += whole
        if whole:
            assert (depth, containers) == (ref_depth, ref_containers), text
        else:
            assert depth >= ref_depth and containers >= ref_containers, text
        for max_depth, max_containers, bound in ((3, 1_000, "max_json_depth"), (1_000, 2, "max_json_containers")):
            try:
                check_json_shape(text, max_depth=max_depth, max_containers=max_containers)
                refused = None
            except RemoteBoundError as e:
                refused = e.bound
            over = depth > max_depth if bound == "max_json_depth" else containers > max_containers
            assert refused == (bound if over else None), (text, depth, containers)
    assert whole_texts > 2_000


@pytest.mark.parametrize("value", [{"a": "[[[[\\\"{{", "b": ["\\", "]]]]", {"c": [[]]}]}, [[[[]]], {}], "x", 1, [],
                                   {"k\"[": "}\\"}])
def test_json_shape_of_valid_json(value):
    """On valid JSON: the nesting ``json.loads`` reaches and the number of arrays + objects it builds."""
    from envs.action_text import json_shape

    def depth(v):
        return 1 + max(map(depth, v.values() if isinstance(v, dict) else v), default=0) \
            if isinstance(v, (dict, list)) else 0

    def containers(v):
        if not isinstance(v, (dict, list)):
            return 0
        return 1 + sum(map(containers, v.values() if isinstance(v, dict) else v))

    assert json_shape(json.dumps(value)) == (depth(value), containers(value))


# ------------------------------------------------------------------------------- 2. schemas bounded in bytes
def _tool_with_defs(defs: dict) -> dict:
    return {"type": "function", "function": {"name": "boom", "description": "x", "parameters": {
        "type": "object", "properties": {"arg": {"$ref": "#/$defs/N"}}, "required": ["arg"], "$defs": defs}}}


BIG = 2 << 20
#: ``$defs`` whose one object holds a 2 MiB string and refers to itself twice: ~900 nodes once expanded (far inside
#: ``max_schema_nodes``), 128 copies of the string (256 MiB of docstring).
SELF_REFERENCING = {"N": {"type": "object", "description": "d" * BIG,
                          "properties": {"a": {"$ref": "#/$defs/N"}, "b": {"$ref": "#/$defs/N"}}}}
#: The same with the string nested 24 arrays deep in each copy: past the expansion's depth cut, where a subtree is
#: kept as it is, it must be paid for all the same.
PAST_THE_DEPTH_CUT = {"N": {"type": "object", "examples": json.loads("[" * 24 + json.dumps("d" * BIG) + "]" * 24),
                            "properties": {"a": {"$ref": "#/$defs/N"}, "b": {"$ref": "#/$defs/N"}}}}


#: The issue's own size: 6 MiB (MemoryError at a 3 GiB limit after 30 s), inside the 8 MiB reply window.
SELF_REFERENCING_6MIB = {"N": {**SELF_REFERENCING["N"], "description": "d" * (6 << 20)}}
#: Non-ASCII (each character 2 bytes of the reply, 6 of JSON text): 1 MiB of characters, copied 128 times.
SELF_REFERENCING_WIDE = {"N": {**SELF_REFERENCING["N"], "description": "\u00e9" * (1 << 20)}}


@pytest.mark.parametrize("defs", [SELF_REFERENCING, PAST_THE_DEPTH_CUT, SELF_REFERENCING_6MIB, SELF_REFERENCING_WIDE],
                         ids=["string", "past_depth_cut", "string_6MiB", "non_ascii"])
def test_a_large_string_in_self_referencing_defs_is_refused_by_its_expanded_bytes(defs):
    """2 MiB inside a ``$defs`` object that refers to itself twice: ``environment_factory(url=...)`` raises
    ``RemoteBoundError`` ``max_schema_bytes`` quickly, its memory near the baseline (it used to build 256 MiB of
    docstring per tool: 1.07 GB peak)."""
    tool = _tool_with_defs(defs)
    assert len(json.dumps(tool)) < ClientBounds().max_reply_bytes
    with hostile_server(_opening([tool])) as (url, _):
        out = _victim(f"environment_factory(url={url!r})", timeout_s=60)
    assert out["raised"] == "RemoteBoundError" and out["bound"] == "max_schema_bytes", out
    assert str(ClientBounds().max_schema_bytes) in out["message"], out
    assert out["seconds"] < 10 and out["maxrss_mb"] < 300, out


def test_the_byte_bound_counts_every_copy_and_is_the_callers_to_set():
    """A schema that expands to more bytes than the caller allows is refused, also for a local env; one just
    within the bound builds its class."""
    from envs.adapters.trl_env import environment_factory

    with pytest.raises(RemoteBoundError, match=r"max_schema_bytes: .* more than 100 bytes"):
        environment_factory("tau2/mock-v0", bounds=ClientBounds(max_schema_bytes=100))
    assert callable(environment_factory("tau2/mock-v0", bounds=ClientBounds(max_schema_bytes=1 << 20)).done)
    small = {"N": {"type": "object", "description": "d" * 1000,
                   "properties": {"a": {"$ref": "#/$defs/N"}, "b": {"$ref": "#/$defs/N"}}}}
    with hostile_server(_opening([_tool_with_defs(small)])) as (url, _):
        with pytest.raises(RemoteBoundError, match="max_schema_bytes"):  # 128 copies of 1,000 characters
            environment_factory(url=url, bounds=ClientBounds(max_schema_bytes=100_000))
        cls = environment_factory(url=url, bounds=ClientBounds(max_schema_bytes=1_000_000))
    assert "ddd" in cls.boom.__doc__ and len(cls.boom.__doc__) < 1_000_000


def test_client_bounds_include_the_byte_bound():
    assert ClientBounds().max_schema_bytes == 1 << 20
    with pytest.raises(ValueError, match="max_schema_bytes"):
        ClientBounds(max_schema_bytes=0)


# ------------------------------------------------------------------------------- 3. the OpenEnv client's replies
_OPENENV = "__import__('envs.adapters.torchrl_openenv', fromlist=['OpenEnvTextEnv']).OpenEnvTextEnv"
_DEEP = '{"type": "observation", "data": ' + "[" * 5_000 + "]" * 5_000 + "}"
_BOMB = ('{"type": "observation", "data": {"observation": {"messages": [], "info": {"x": ['
         + "{}," * ((63 << 20) // 3) + "{}]}}}}")


@pytest.mark.parametrize("reply,raised,bound", [
    (_DEEP, "RemoteBoundError", "max_json_depth"),
    (_BOMB, "RemoteBoundError", "max_reply_bytes"),
    (_escaped_quotes(64 << 10), "RemoteEnvError", None),
], ids=["deep", "compression_bomb", "escaped_quotes"])
def test_the_openenv_client_applies_the_reply_bounds(reply, raised, bound):
    """``OpenEnvTextEnv`` (openenv-core's client) against a hostile server: a reply 5,000 deep, a ~64 MiB reply
    that deflate packs into ~62 KB, 64 KB of ``"\\"\\"...``: each refused with the bound it broke, memory near the
    baseline (~210 MB with openenv-core imported; the seconds include that import). It used to raise
    ``RecursionError`` dressed as a ``ValueError``, to parse the bomb under openenv-core's 100 MiB message cap
    (``MemoryError`` at 1 GiB, 782 MB peak), and to let ``json.loads``' ``JSONDecodeError`` out."""
    pytest.importorskip("openenv", reason="needs the optional extra [serve] (openenv-core)")
    with hostile_server(reply) as (url, _):
        out = _victim(f"{_OPENENV}({url!r}, message_timeout_s=10).reset()", timeout_s=60)
    assert out["raised"] == raised and out["bound"] == bound, out
    assert out["seconds"] < 40 and out["maxrss_mb"] < 400, out


def test_the_openenv_client_reads_a_sane_reply():
    pytest.importorskip("openenv", reason="needs the optional extra [serve] (openenv-core)")
    from envs.adapters.torchrl_openenv import OpenEnvTextEnv

    with hostile_server(_opening([{"type": "function", "function": {"name": "done", "parameters": {}}}])) as (url, _):
        env = OpenEnvTextEnv(url, message_timeout_s=10)
        try:
            obs, info = env.reset()
        finally:
            env.close()
    assert obs == [{"role": "user", "content": "hi"}] and info["tools"][0]["function"]["name"] == "done"
    with pytest.raises(ValueError, match="ClientBounds"):
        OpenEnvTextEnv(url, bounds={"max_reply_bytes": 1})


# ------------------------------------------------------------------------------- timeout_s covers sending too
def test_a_request_a_server_does_not_read_times_out_within_timeout_s():
    """A server that completes the WebSocket handshake and then never reads: the client's send fills the socket and
    websockets' sync send has no timeout of its own. ``timeout_s`` bounds the send as it bounds the reply."""
    import base64
    import hashlib
    import socket
    import threading

    from envs.adapters.remote_env import RemoteEnv

    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    held = []

    def accept():
        conn, _ = srv.accept()
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        head = b""
        while b"\r\n\r\n" not in head:
            head += conn.recv(4096)
        key = [ln.split(b":", 1)[1].strip() for ln in head.split(b"\r\n") if ln.lower().startswith(b"sec-websocket-key")][0]
        accept_key = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
        conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     b"Sec-WebSocket-Accept: " + accept_key + b"\r\n\r\n")
        held.append(conn)  # and never read again

    threading.Thread(target=accept, daemon=True).start()
    env = RemoteEnv(f"http://127.0.0.1:{srv.getsockname()[1]}", timeout_s=2)
    out: dict = {}

    def victim():
        t0 = time.perf_counter()
        try:
            env.step("x" * (32 << 20))  # far more than the socket buffers hold
        except BaseException as e:  # noqa: BLE001 - recorded and checked below
            out["raised"] = e
        out["seconds"] = time.perf_counter() - t0

    t = threading.Thread(target=victim, daemon=True)
    t.start()
    t.join(30)
    try:
        assert not t.is_alive(), "the send was still blocked after 30 s (timeout_s=2)"
        assert isinstance(out.get("raised"), TimeoutError), out
        assert out["seconds"] < 10, out
    finally:
        for c in held:
            c.close()
        srv.close()


# ------------------------------------------------------------------------------- 2b. bytes as JSON writes them
#: One character of each kind and the bytes compact JSON (``json.dumps``, ``ensure_ascii``) writes for it: a quote
#: or a backslash 2, a control character or a non-ASCII one 6 (``\u00e9``), one outside the BMP 12 (a surrogate pair).
ESCAPED = {"quote": ('"', 2), "backslash": ("\\", 2), "control": ("\x01", 6), "latin": ("\u00e9", 6),
           "cjk": ("\u4e2d", 6), "emoji": ("\U0001F600", 12)}


@pytest.mark.parametrize("kind", list(ESCAPED))
def test_the_byte_bound_counts_the_bytes_json_writes_not_characters(kind):
    """A string whose characters fit ``max_schema_bytes`` but whose JSON text does not (each character written as 2
    to 12 bytes) is refused: the schema goes into the docstring and, from there, into every prompt as JSON text. The
    same schema within a bound of its JSON size builds."""
    from envs.adapters.trl_env import environment_factory

    char, width = ESCAPED[kind]
    bound = 100_000
    n = bound // 2 + 1_000  # n characters < bound <= n * width bytes
    tool = {"type": "function", "function": {"name": "boom", "description": "x", "parameters": {
        "type": "object", "required": ["arg"], "properties": {"arg": {
            "type": "object", "properties": {"a": {"type": "string"}}, "examples": [char * n]}}}}}
    assert len(json.dumps(char * n)) == n * width + 2
    with hostile_server(_opening([tool])) as (url, _):
        with pytest.raises(RemoteBoundError, match="max_schema_bytes"):
            environment_factory(url=url, bounds=ClientBounds(max_schema_bytes=bound))
        cls = environment_factory(url=url, bounds=ClientBounds(max_schema_bytes=n * width + 1_000))
    assert char * 16 in json.loads(cls.boom.__doc__.split("JSON schema: ", 1)[1].split("\n", 1)[0])["examples"][0]


def test_a_schema_strings_size_is_what_json_dumps_writes():
    from envs.adapters.trl_env import _json_size, _text_size

    rng = random.Random(49)
    alphabet = ["a", " ", '"', "\\", "\x01", "\x7f", "\n", "\u00e9", "\u4e2d", "\U0001F600", "~"]
    for _ in range(5_000):
        s = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        assert _text_size(s) == len(json.dumps(s)), repr(s)
        assert _json_size({s: 1}) == 2 + len(json.dumps(s)) + 2, repr(s)  # braces, the key, its colon and comma
