"""Hostile input on every registered id, in-process and through ``envs.serve`` beside honest sessions (issue 34, item 4).

Extends the property test of ``tests/test_env_hardening.py`` (random and adversarial actions, in-process) with the
classes issue 34 found, run on every Gymnasium id ``envs`` registers (a new id is covered without editing this file)
plus the ReasoningGym tasks whose library scorers evaluate the answer (:data:`EVAL_TASKS`):

* **code payloads** -- ``__import__('pathlib').Path(...).write_text(...)`` and friends, raw and inside every answer
  format (``<answer>``, ``####``, ``\\boxed{}``, a ``calculate`` call);
* **regex killers** -- the shapes that made a backtracking pattern superlinear (GSM8K's ``\\frac{`` + spaces, tau2's
  code fence + newlines, ...) and a 1 MB response (IFEval's checkers);
* **floods of tool calls** -- one action of ~1 MiB holding thousands of tool calls;
* over the server only: **deep or huge JSON bodies** (50,000 levels, a 5,000-digit integer, a body over the limit)
  and **slow readers** (requests for a big ``state`` that are never read);
* over the server, issue 42 (:func:`run_graders_served`): **C-level cost bombs** in every sympy ReasoningGym task
  (``exp(100000000*log(3))``, puzzle24's ``exp(exp(20))``) and propositional_logic (``"¬"*4000 + "P"``), **graders
  that raise** (if-verifiable's IndexError on ``"1"``) and **held bodies** (connections holding all but one byte of a
  1 MiB body, past the bodies-in-flight cap), while an honest client plays gold episodes: each bomb answered 200,
  reward 0, ``action_error`` ``grader_timeout`` (``grader_error`` for the raising grader) within
  :data:`BOMB_STEP_BOUND_S`, the bodies past the cap answered 503 naming it, no other 5xx, ``/health`` p99 under
  :data:`HEALTH_P99_S`, honest steps within :data:`HONEST_STEP_BOUND_S` and gold rewards 1.0, RSS back near its
  baseline. They need ``envs/grader_process.py`` (graders in killable worker processes) and are skipped, naming it,
  where it is missing: without it one bomb stops the server for minutes.

Asserted (the bounds are this module's constants, generous for a loaded 2-core machine):

* in-process: every step within the contract's :data:`~envs.contract.STEP_TIME_BOUND_S`, an encodable reply, a
  reward in [0, 1], and **nothing executed** (a Python audit hook watches ``compile``/``exec``/``os.system``/
  ``subprocess``/``open`` for the payloads' token; the file a payload would write never appears);
* through the server, while an honest client plays episodes and a prober polls ``/health``: **no 5xx** (and no
  WebSocket ``EXECUTION_ERROR``), every adversarial request answered within :data:`SERVED_STEP_BOUND_S` with a reply
  of at most the session cap, nothing executed, slow readers' unsent bytes within the cap and dropped after the send
  timeout; the honest client's every step within :data:`HONEST_STEP_BOUND_S` and ``/health`` within
  :data:`HEALTH_BOUND_S`; the server's memory back within :data:`RSS_SLACK_MB` of its baseline once the adversary
  has left; and **honest rewards equal to the in-process env's** on the same episodes.

The unit stage runs every config in-process (one code expression in every answer format, every killer, the flood),
two configs over the server with one payload of each class (:data:`QUICK`, :data:`QUICK_SERVED`) and one bomb beside
held bodies (puzzle24); the ``slow`` stage runs every config over the server with every payload, every code
expression in-process, every bomb of every sympy task two at once and every raising IFEval prompt. Cases whose fix belongs to another change still in progress (tool-call bound per action and
IFEval response length in ``envs/``, ReasoningGym scorers that evaluate model text) are marked ``xfail(strict=False)``
with the reason, so they report XPASS once that fix lands.
"""
from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib.util
import json
import math
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("openenv", reason="envs.serve needs the optional extra [serve] (pip install -e '.[serve]': openenv-core)")

import gymnasium as gym
import httpx
from websockets.sync.client import connect as ws_connect

import envs
from envs import serve
from envs.contract import STEP_TIME_BOUND_S
from tests.served import hold_bodies, serve_app
from tests.test_env_contract import CHEAP_KWARGS, REGISTERED

gym.register_envs(envs)

#: Bound (s) on one adversarial request through the server: the env's own bound plus parsing and moving ~1 MiB on a
#: loaded machine while an honest client and a prober run beside it.
SERVED_STEP_BOUND_S = STEP_TIME_BOUND_S + 4.0
#: Bound (s) on each step of the honest client, and on each ``/health``, while the adversary runs.
HONEST_STEP_BOUND_S = 8.0
HEALTH_BOUND_S = 8.0
#: The server's RSS once the adversary has left (sessions closed, after a collection and ``malloc_trim``) may exceed
#: its baseline by at most this much. The baseline is taken after a warm-up honest episode and one warm-up pass of the
#: same shape (adversary, honest client and prober at once): the allocator keeps the high-water mark of the first pass
#: (measured on tau2/mock, 2026-11-26: +15 MB after a first flood, then +7, +4, flat after slow readers), so what is
#: asserted is that an adversary leaves nothing behind. The allocator still steps, not linearly: DigitSum, six passes
#: in one server, 284 -> 304, 303, 320, 322, 322 MB (2026-11-28, idle); one pass after the warm-up grew 14-25 MB in 5
#: runs. With a warm-up adversary alone (no concurrent honest client) it grew 17-37 MB on the idle machine (6 runs,
#: old and new server code alike) and 41 MB in a fresh-check, over the 32 MB this bound was. A leak of the issue's kind
#: is still over it: an adversary session holds up to the 4 MiB cap of conversation plus unsent replies; the issue's
#: flood grew RSS by 74 MB per session.
RSS_SLACK_MB = 48
#: The served sessions' byte cap, body limit, bodies-in-flight cap and timeouts (small, so that the adversary reaches
#: them quickly).
CAP = 4 << 20
MAX_BODY = 1 << 20
INFLIGHT_CAP = 4 * MAX_BODY
SEND_TIMEOUT_S = 2.0
HEADER_TIMEOUT_S = 3.0

#: ReasoningGym tasks whose library scorer converts or evaluates the answer (``parse_expr``, ``eval``).
EVAL_TASKS = ("countdown", "puzzle24", "spiral_matrix", "polynomial_multiplication")
RG_KWARGS = {"split": "test", "train_size": 20, "test_size": 5}

#: (id, gym.make kwargs) played: every registered id at its cheapest, plus the evaluating ReasoningGym tasks.
CONFIGS = [(i, dict(CHEAP_KWARGS.get(i, {}))) for i in REGISTERED] + [("ReasoningGym-v1", {"task": t, **RG_KWARGS})
                                                                       for t in EVAL_TASKS]


def _config_id(cfg) -> str:
    env_id, kw = cfg
    return env_id + (f"[{kw['task']}]" if "task" in kw else "")


# ---------------------------------------------------------------------------------------------------------- payloads

TOKEN = "pwn7c1eq"  # in every code payload and in the file they would write


def code_payloads(marker: Path) -> dict[str, str]:
    """Actions that would run code if any scorer evaluated model text: each writes ``marker`` (or calls the shell)."""
    p = str(marker)
    exprs = {
        "pathlib": f"__import__('pathlib').Path({p!r}).write_text('{TOKEN}')",
        "os_system": f"__import__('os').system('touch {p}')",
        "lambda_globals": f"(lambda: __import__('builtins').exec(\"open({p!r}, 'w').write('{TOKEN}')\"))()",
        "sympy_style": f"Symbol('x') + __import__('pathlib').Path({p!r}).write_text('{TOKEN}')",
    }
    out = {}
    for name, e in exprs.items():
        out[f"{name}_raw"] = e
        out[f"{name}_answer_tag"] = f"Let me compute.\n<answer>{e}</answer>"
        out[f"{name}_hashes"] = f"#### {e}"
        out[f"{name}_boxed"] = f"\\boxed{{{e}}}"
        out[f"{name}_calculate"] = "<tool_call>" + json.dumps({"name": "calculate", "arguments": {"expression": e}}) + "</tool_call>"
        out[f"{name}_functional"] = f"calculate(expression={e!r})"
    out["spiral_list"] = f"<answer>[{exprs['pathlib']}, 1, 2]</answer>"
    return out


#: name -> text: shapes that were superlinear in a backtracking pattern (issue 34, item 2) and a 1 MB response.
KILLERS = {
    "gsm8k_frac_spaces": "\\frac{" + " " * 19_990 + "x",
    "gsm8k_frac_repeated": ("\\frac{1}{" + " " * 2_500) * 40 + "x",
    "tau2_fence_newlines": "```" + "\n" * 24_000 + "x",
    "tau2_fence_json": "```json" + " " * 24_000 + "x",
    "tau2_fence_in_call": "<tool_call>```" + "\n" * 24_000 + "x",
    "answer_tags_open": "<answer>" * 100_000,
    "long_response_words": "word " * 190_000,  # ~1 MB: IFEval's checkers
    "long_response_lines": "* item\n" * 100_000,
    "newlines": "\n" * 450_000 + "x",  # 900 kB once JSON-escaped: each killer fits a step body of MAX_BODY
}


def flood(name: str = "calculate") -> str:
    """One action of as many Hermes tool calls as fit in a step body of ``MAX_BODY`` (~10,000: the issue's 7,300
    airline calls took 3.9 s and answered 23 MB)."""
    call = "<tool_call>" + json.dumps({"name": name, "arguments": {"expression": "1+1"}}) + "</tool_call>"
    return call * ((MAX_BODY - 1024) // (len(json.dumps(call)) - 2))


FLOODS = {"tool_call_flood": flood()}

#: Cases to mark xfail while a fix is pending: (config id, payload) -> reason; "*" matches any config / payload.
#: Empty: the ReasoningGym verifier guards (2d47f0a) and the tau2 tool-call bound (5507ac0) landed, and every case
#: passes (they failed on 12cbc7b: the marker file was written through sympy's parse_expr / eval, and a flood of
#: 12,000 tool calls took 2.7-3.9 s per tau2 step, bound 2 s).
PENDING: dict[tuple[str, str], str] = {}


def _mark(cfg_id: str, name: str):
    reason = PENDING.get((cfg_id, name)) or PENDING.get(("*", name)) or PENDING.get((cfg_id, "*"))
    return pytest.mark.xfail(reason=reason, strict=False) if reason else ()


# ---------------------------------------------------------------------------------------------------- nothing runs

_HITS: list[tuple[str, str]] = []
_WATCHED = {"compile", "exec", "os.system", "subprocess.Popen", "os.exec", "os.posix_spawn", "os.spawn", "open",
            "builtins.input", "ctypes.dlopen"}


def _audit(event: str, args) -> None:
    if event in _WATCHED:
        for a in args[:2]:
            if isinstance(a, (str, bytes)) and (TOKEN in a if isinstance(a, str) else TOKEN.encode() in a):
                caller = sys._getframe(1).f_code
                if event == "compile" and caller.co_name == "parse" and caller.co_filename.endswith("ast.py"):
                    return  # ast.parse (tau2's functional-call parser): a syntax tree is built, nothing runs
                _HITS.append((event, repr(a)[:200]))


sys.addaudithook(_audit)  # hooks cannot be removed: it only records events whose text holds TOKEN


@pytest.fixture
def marker(tmp_path):
    """The file a code payload would write (checked by :func:`assert_nothing_ran` inside the test, so that an
    ``xfail`` mark covers it)."""
    _HITS.clear()
    return tmp_path / f"{TOKEN}.txt"


def assert_nothing_ran(marker: Path) -> None:
    assert not marker.exists(), f"a payload ran: {marker} was written"
    assert not _HITS, f"model text reached {_HITS[:3]}"


# ---------------------------------------------------------------------------------------------------- in-process

_ENVS: dict = {}


def _kwargs(cfg, gsm8k_dir) -> dict:
    env_id, kw = cfg
    kw = dict(kw)
    if env_id.startswith("GSM8K"):
        kw["data_dir"] = str(gsm8k_dir)
    return kw


def _env(cfg, gsm8k_dir):
    key = _config_id(cfg)
    if key not in _ENVS:
        _ENVS[key] = gym.make(cfg[0], **_kwargs(cfg, gsm8k_dir))
    return _ENVS[key]


def _first_index(env) -> int:
    u = env.unwrapped
    return u.usable_task_indices(1)[0] if hasattr(u, "usable_task_indices") else 0


def _encodable(x) -> None:
    json.dumps(x, ensure_ascii=False, default=str).encode("utf-8")


def _in_process_step(env, action) -> float:
    env.reset(seed=0, options={"index": _first_index(env)})
    t0 = time.perf_counter()
    obs, reward, _, _, info = env.step(action)
    dt = time.perf_counter() - t0
    _encodable(obs)
    _encodable(info)
    assert 0.0 <= reward <= 1.0
    return dt


def _payload_params(names_by_class: dict[str, list[str]]):
    out = []
    for cfg in CONFIGS:
        for cls, names in names_by_class.items():
            for name in names:
                out.append(pytest.param(cfg, cls, name, id=f"{_config_id(cfg)}-{name}", marks=_mark(_config_id(cfg), name)))
    return out


_CODE_NAMES = list(code_payloads(Path("/x")))


def _payload(cls: str, name: str, marker: Path) -> str:
    return {"code": lambda: code_payloads(marker)[name], "killer": lambda: KILLERS[name],
            "flood": lambda: FLOODS[name]}[cls]()


#: The unit stage's code payloads: one expression in every answer format (the slow stage: every expression).
_CODE_QUICK = [n for n in _CODE_NAMES if n.startswith("pathlib_")] + ["spiral_list"]


@pytest.mark.parametrize("cfg,cls,name", _payload_params({"code": _CODE_QUICK, "killer": list(KILLERS), "flood": list(FLOODS)}))
def test_hostile_action_in_process(cfg, cls, name, marker, gsm8k_dir):
    _check_in_process(cfg, cls, name, marker, gsm8k_dir)


@pytest.mark.slow
@pytest.mark.parametrize("cfg,cls,name", _payload_params({"code": [n for n in _CODE_NAMES if n not in _CODE_QUICK]}))
def test_every_code_payload_in_process(cfg, cls, name, marker, gsm8k_dir):
    _check_in_process(cfg, cls, name, marker, gsm8k_dir)


def _check_in_process(cfg, cls, name, marker, gsm8k_dir):
    env = _env(cfg, gsm8k_dir)
    dt = _in_process_step(env, _payload(cls, name, marker))
    assert_nothing_ran(marker)
    assert dt < STEP_TIME_BOUND_S, f"{name} on {_config_id(cfg)}: step took {dt:.2f} s (bound {STEP_TIME_BOUND_S} s)"


# ---------------------------------------------------------------------------------------------------- the server


def _rss_mb() -> float:
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


@contextlib.contextmanager
def serving(cfg, gsm8k_dir):
    """``envs.serve`` of ``cfg`` in a thread on loopback (:func:`tests.served.serve_app`); accepted sockets get a
    16 kB kernel send buffer (inherited from the listener), so a reply of a few hundred kB stalls on a client that does
    not read. Yields ``(url, port)``."""
    app = serve.build_app(cfg[0], _kwargs(cfg, gsm8k_dir), max_sessions=16, idle_timeout_s=600, max_body_bytes=MAX_BODY,
                          max_session_bytes=CAP, max_inflight_body_bytes=INFLIGHT_CAP)
    with serve_app(app, sndbuf=16_384, timeout_s=30, max_body_bytes=MAX_BODY, header_timeout_s=HEADER_TIMEOUT_S,
                   send_timeout_s=SEND_TIMEOUT_S) as (url, _):
        yield url, int(url.rsplit(":", 1)[1])


def honest_episode(env, index: int) -> list:
    """The wire actions of an honest episode on task ``index`` of ``env`` (reset here): tau2's gold actions, the gold
    answer in the env's answer format, or a plain reply."""
    u = env.unwrapped
    _, info = env.reset(seed=0, options={"index": index})
    if hasattr(u, "tau2_environment"):
        from envs.tau2.oracle import oracle_actions

        return [{"content": a.get("content"), "tool_calls": a.get("tool_calls")} for a in oracle_actions(u.task, u.solo)]
    if "answer" in info and env.spec.id.startswith("GSM8K"):
        return [{"content": f"The answer is {info['answer']}.\n#### {info['answer']}"}]
    if "answer" in info:
        return [{"content": f"<answer>{info['answer']}</answer>"}]
    return [{"content": "Here is my answer. It follows every instruction I was given, as asked."}]


def in_process_reward(env, index: int, actions: list) -> float:
    env.reset(seed=0, options={"index": index})
    reward = 0.0
    for a in actions:
        act = a["content"] if a.get("tool_calls") is None else {"role": "assistant", **a}
        _, reward, term, trunc, _ = env.step(act)
        if term or trunc:
            break
    return float(reward)


#: A fresh connection per request: a pooled connection left idle past the server's header timeout (re-armed after each
#: response) may be closed by the server just as the client reuses it, on a loaded machine.
NO_KEEPALIVE = httpx.Limits(max_keepalive_connections=0)


class Honest(threading.Thread):
    """Plays the honest episode again and again over HTTP until stopped, timing every step."""

    def __init__(self, url: str, index: int, actions: list):
        super().__init__(daemon=True)
        self.url, self.index, self.actions = url, index, actions
        self.stop, self.step_s, self.rewards, self.errors = threading.Event(), [], [], []

    def episode(self, c: httpx.Client) -> float:
        sid = c.post("/sessions").json()["session_id"]
        try:
            assert c.post(f"/sessions/{sid}/reset", json={"seed": 0, "index": self.index}).status_code == 200
            r = None
            for a in self.actions:
                t0 = time.perf_counter()
                r = c.post(f"/sessions/{sid}/step", json={"action": a})
                self.step_s.append(time.perf_counter() - t0)
                assert r.status_code == 200, r.text[:300]
                if r.json()["done"]:
                    break
            return float(r.json()["reward"])
        finally:
            c.delete(f"/sessions/{sid}")

    def run(self) -> None:
        try:
            with httpx.Client(base_url=self.url, timeout=60, limits=NO_KEEPALIVE) as c:
                while not self.stop.is_set() or not self.rewards:
                    self.rewards.append(self.episode(c))
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.errors.append(repr(e))


class Prober(threading.Thread):
    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url, self.stop, self.lat, self.errors = url, threading.Event(), [], []

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=60, limits=NO_KEEPALIVE) as c:
            while not self.stop.is_set():
                t0 = time.perf_counter()
                try:
                    ok = c.get("/health").status_code == 200
                except httpx.HTTPError as e:
                    ok = False
                    self.errors.append(repr(e))
                self.lat.append(time.perf_counter() - t0)
                if not ok:
                    self.errors.append("health not 200")
                time.sleep(0.05)


class Adversary:
    """Hostile requests on its own sessions; records every violation of the bounds."""

    def __init__(self, url: str, port: int, index: int):
        self.url, self.port, self.index = url, port, index
        self.c = httpx.Client(base_url=url, timeout=60, limits=NO_KEEPALIVE)
        self.violations: list[str] = []
        self.sid = None

    def _timed(self, what: str, fn):
        t0 = time.perf_counter()
        r = fn()
        dt = time.perf_counter() - t0
        if dt > SERVED_STEP_BOUND_S:
            self.violations.append(f"{what}: {dt:.2f} s > {SERVED_STEP_BOUND_S} s")
        if r.status_code >= 500:
            self.violations.append(f"{what}: {r.status_code} {r.text[:200]}")
        if len(r.content) > CAP + 4096:
            self.violations.append(f"{what}: a reply of {len(r.content)} bytes > the cap {CAP}")
        return r

    def session(self) -> str:
        if self.sid is not None:
            self.c.delete(f"/sessions/{self.sid}")
        r = self.c.post("/sessions")
        assert r.status_code == 201, r.text
        self.sid = r.json()["session_id"]
        assert self.c.post(f"/sessions/{self.sid}/reset", json={"seed": 0, "index": self.index}).status_code == 200
        return self.sid

    def step(self, name: str, text: str) -> None:
        body = json.dumps({"action": {"content": text}}).encode()
        assert len(body) <= MAX_BODY, f"{name}: a {len(body)}-byte body is refused before the env sees it"
        sid = self.session()  # a fresh episode (the previous session is deleted, or was ended by the cap)
        self._timed(name, lambda: self.c.post(f"/sessions/{sid}/step", content=body,
                                              headers={"content-type": "application/json"}))

    def bodies(self) -> None:
        sid = self.session()
        deep, big = "[" * 50_000 + "]" * 50_000, "9" * 5_000
        for name, path, body, want in (
                ("deep_reset", f"/sessions/{sid}/reset", deep, 422),
                ("digits_seed", f"/sessions/{sid}/reset", '{"seed": ' + big + "}", 422),
                ("deep_tool_args", f"/sessions/{sid}/step",
                 '{"action": {"tool_calls": [{"function": {"name": "calculate", "arguments": ' + "{\"a\": " * 20_000
                 + "1" + "}" * 20_000 + "}}]}}", 422),
                ("over_limit", f"/sessions/{sid}/reset", '{"x": "' + "a" * MAX_BODY + '"}', 413)):
            try:
                r = self._timed(name, lambda p=path, b=body: self.c.post(p, content=b.encode(),
                                                                         headers={"content-type": "application/json"}))
            except httpx.TransportError:  # refused by Content-Length before the body was read: connection closed
                if want == 413:
                    continue
                raise
            if r.status_code != want:
                self.violations.append(f"{name}: {r.status_code} (expected {want}) {r.text[:200]}")
        with ws_connect(self.url.replace("http", "ws") + "/ws", max_size=None) as ws:
            for name, raw in (("ws_deep", deep), ("ws_digits", '{"type": "reset", "data": {"seed": ' + big + "}}")):
                ws.send(raw)
                msg = json.loads(ws.recv(timeout=SERVED_STEP_BOUND_S))
                if msg["type"] != "error" or msg["data"]["code"] != "INVALID_JSON":
                    self.violations.append(f"{name}: {msg!r:.200}")

    def slow_readers(self, n: int = 6) -> None:
        """Fill a session towards the cap, then ``n`` requests for its ``state`` that are never read."""
        sid = self.session()
        for _ in range(6):
            r = self._timed("fill", lambda: self.c.post(f"/sessions/{sid}/step", json={"action": {"content": "s" * 600_000}}))
            if r.status_code != 200 or r.json()["done"]:
                break
        if self.c.get(f"/sessions/{sid}/state").status_code != 200:
            sid = self.session()
        socks = []
        for _ in range(n):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(("127.0.0.1", self.port))
            s.sendall(f"GET /sessions/{sid}/state HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
            socks.append(s)
            time.sleep(0.05)
        unsent = self.c.get("/sessions").json()["unsent_bytes"]
        if unsent > CAP:
            self.violations.append(f"slow readers hold {unsent} unsent bytes > the cap {CAP}")
        t0 = time.time()
        while self.c.get("/sessions").json()["unsent_bytes"]:
            if time.time() - t0 > SEND_TIMEOUT_S + 10:
                self.violations.append(f"slow readers still held after {time.time() - t0:.1f} s")
                break
            time.sleep(0.1)
        for s in socks:
            s.close()

    def leave(self) -> None:
        if self.sid is not None:
            self.c.delete(f"/sessions/{self.sid}")
        self.c.close()


def _honest_plan(cfg, gsm8k_dir) -> tuple[int, list, float]:
    """The first task of ``cfg``: its index, an honest episode's actions and their reward in process."""
    env = gym.make(cfg[0], **_kwargs(cfg, gsm8k_dir))
    index = _first_index(env)
    actions = honest_episode(env, index)
    want = in_process_reward(env, index, actions)
    env.close()
    return index, actions, want


def _warm_up(url: str, index, actions, want: float) -> None:
    """One honest episode through the server: builds the domain's caches before a baseline."""
    warm = Honest(url, index, actions)
    warm.stop.set()
    warm.run()
    assert not warm.errors and warm.rewards == [want], (warm.errors, warm.rewards, want)


def _stop(honest: "Honest", prober: "Prober") -> None:
    honest.stop.set()
    prober.stop.set()
    honest.join(120)
    prober.join(30)


def _assert_honest(honest: "Honest", prober: "Prober", want: float) -> None:
    """No error on either side, every honest episode's reward the in-process one, every honest step within
    :data:`HONEST_STEP_BOUND_S` (``/health``'s bound differs by caller)."""
    assert not honest.errors and not prober.errors, (honest.errors, prober.errors[:3])
    assert honest.rewards and all(r == want for r in honest.rewards), (honest.rewards, want)
    assert max(honest.step_s) < HONEST_STEP_BOUND_S, f"honest step {max(honest.step_s):.2f} s"


def _wait_sessions_closed(c: httpx.Client, *context) -> None:
    """Until no session is open and no reply is unsent (20 s at most; ``context`` goes into the failure)."""
    t0 = time.time()
    while (st := c.get("/sessions").json())["active"] or st["unsent_bytes"]:
        assert time.time() - t0 < 20, (st, *context)
        time.sleep(0.1)


def _served_pass(c: httpx.Client, url: str, port: int, index, actions, want: float, steps: dict[str, str],
                 bodies: bool, slow: bool) -> None:
    """One adversary pass (``steps``, then JSON bodies and slow readers when asked) while an honest client plays
    episodes and a prober polls ``/health``; asserts the module docstring's bounds and waits until every session has
    closed and every reply has left."""
    honest, prober = Honest(url, index, actions), Prober(url)
    honest.start()
    prober.start()
    adv = Adversary(url, port, index)
    try:
        for name, text in steps.items():
            adv.step(name, text)
        if bodies:
            adv.bodies()
        if slow:
            adv.slow_readers()
    finally:
        adv.leave()
        _stop(honest, prober)
    assert not adv.violations, adv.violations
    _assert_honest(honest, prober, want)
    assert max(prober.lat) < HEALTH_BOUND_S, f"/health {max(prober.lat):.2f} s"
    _wait_sessions_closed(c, honest.is_alive(), adv.sid)


def run_served(cfg, gsm8k_dir, marker: Path, steps: dict[str, str], bodies: bool = True, slow: bool = True) -> None:
    """Honest client + /health prober + the adversary's ``steps`` (name -> text), JSON bodies and slow readers,
    through one server of ``cfg``; asserts the module docstring's bounds."""
    index, actions, want = _honest_plan(cfg, gsm8k_dir)
    with serving(cfg, gsm8k_dir) as (url, port), httpx.Client(base_url=url, timeout=60) as c:
        _warm_up(url, index, actions, want)
        rss = []
        for _ in range(2):  # a warm-up pass of the same shape (the allocator's high-water mark), then the measured one
            _served_pass(c, url, port, index, actions, want, steps, bodies, slow)
            rss.append(_rss_mb())
        alive = [o for o in gc.get_objects() if isinstance(o, serve.GymTextEnvironment)]
        assert not alive, f"{len(alive)} session envs still alive after every session closed"
        assert rss[1] - rss[0] < RSS_SLACK_MB, f"RSS {rss[0]:.0f} MB before the adversary, {rss[1]:.0f} MB after it left"
    assert_nothing_ran(marker)


#: One payload per class: the unit stage's server run, on a one-step env and a tool env (cheap to build); the slow
#: stage runs every config over the server with every payload.
QUICK = {"code": "pathlib_answer_tag", "killer": "gsm8k_frac_spaces", "flood": "tool_call_flood"}
QUICK_SERVED = ("GSM8K-v1", "tau2/mock-v0")


def _served_params(ids=None):
    return [pytest.param(c, id=_config_id(c), marks=_mark(_config_id(c), "served")) for c in CONFIGS
            if ids is None or _config_id(c) in ids]


@pytest.mark.parametrize("cfg", _served_params(QUICK_SERVED))
def test_served_adversary_beside_honest_sessions(cfg, marker, gsm8k_dir):
    steps = {QUICK["code"]: code_payloads(marker)[QUICK["code"]], QUICK["killer"]: KILLERS[QUICK["killer"]],
             QUICK["flood"]: FLOODS[QUICK["flood"]]}
    run_served(cfg, gsm8k_dir, marker, steps)


@pytest.mark.slow
@pytest.mark.parametrize("cfg", _served_params())
def test_served_full_sweep(cfg, marker, gsm8k_dir):
    steps = {**code_payloads(marker), **KILLERS, **FLOODS}
    run_served(cfg, gsm8k_dir, marker, steps)


# --------------------------------------------------------- issue 42: graders we do not own, and held bodies, served
#
# C-level cost bombs in every sympy ReasoningGym task (and propositional_logic's quadratic parser), graders that raise
# (IFEval's checkers), and connections holding large bodies past the server's bodies-in-flight cap, through one server
# while an honest client plays gold episodes and a prober polls /health. Before issue 42 one bomb held the GIL in one C
# call (3**100000000: 122 s; /health waited as long) and a raising grader was a 500.

#: ``envs.grader_process`` (issue 42: graders in killable worker processes, engineer H1) is in this tree. Without it a
#: bomb stops the server's event loop for minutes (these tests would hang, not fail), so they are skipped, naming it.
GRADERS_ISOLATED = importlib.util.find_spec("envs.grader_process") is not None
needs_grader_process = pytest.mark.skipif(
    not GRADERS_ISOLATED, reason="needs envs/grader_process.py (issue 42: graders in killable worker processes, H1)")

#: ``exp(N*log(3))`` fits the sympy tasks' grammar (no ``**``, 9 digits) and sympy makes it ``3**N`` in one C call.
POWER_BOMB = "<answer>exp(100000000*log(3))</answer>"
#: task -> {name: answer}: the issue's bombs, every sympy task and propositional_logic (its parser: quadratic, recursive).
BOMBS = {
    "countdown": {"power": POWER_BOMB},
    "puzzle24": {"power": POWER_BOMB, "exp_exp": "<answer>exp(exp(20))</answer>"},
    "polynomial_multiplication": {"power": POWER_BOMB},
    "simple_integration": {"power": POWER_BOMB},
    "intermediate_integration": {"power": POWER_BOMB},
    "propositional_logic": {"negations": "<answer>" + "\u00ac" * 4000 + "P</answer>"},
}
#: (split, prompt index, answer) on which if-verifiable's checkers raise (IndexError: issue 42 found 63 of 5,111 fuzzed
#: IFEval steps raising, 500s over HTTP).
IFEVAL_RAISES = [("test", 25, "1"), ("test", 25, "!"), ("test", 25, "*")]
IFEVAL_RAISES_TRAIN = [("train", i, a) for i in (88, 89, 90, 91) for a in ("1", "!")]
#: Bound (s) on a bomb's reply: the grader's CPU bound (1 s by default) plus killing and replacing its worker, on a
#: loaded 2-core machine (measured 2.9-3.9 s each, alone); the workers' wall-clock backstop is 30 s.
BOMB_STEP_BOUND_S = 20.0
#: ``/health``'s 99th percentile while the bombs run (issue 42: it waited 19.5-120 s behind one bomb).
HEALTH_P99_S = 1.0
#: Connections holding a ``MAX_BODY`` body beyond what ``INFLIGHT_CAP`` admits.
HELD_OVER = 3


def _p99(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, math.ceil(0.99 * len(xs)) - 1)]


class Bomber(threading.Thread):
    """Sends each ``(name, index, text)`` as a stateless ``POST /step`` (a fresh env reset to task ``index``), one after
    another; records ``(name, status, seconds, reward, action_error)``."""

    def __init__(self, url: str, shots: list[tuple[str, int, str]]):
        super().__init__(daemon=True)
        self.url, self.shots, self.results, self.errors = url, shots, [], []

    def run(self) -> None:
        try:
            with httpx.Client(base_url=self.url, timeout=120, limits=NO_KEEPALIVE) as c:
                for name, index, text in self.shots:
                    t0 = time.perf_counter()
                    r = c.post("/step", json={"action": {"content": text}, "index": index})
                    dt = time.perf_counter() - t0
                    body = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
                    info = (body.get("observation") or {}).get("info") or {}
                    self.results.append((name, r.status_code, dt, body.get("reward"), info.get("action_error")))
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.errors.append(repr(e))


def run_graders_served(cfg, gsm8k_dir, shots: list[tuple[str, int, str]], *, concurrent: int = 1,
                       want_kind: str = "grader_timeout", gold: bool = True) -> None:
    """Honest client + ``/health`` prober + ``concurrent`` bombers sending ``shots`` (each answered 200, reward 0, an
    ``action_error`` of ``want_kind``, within :data:`BOMB_STEP_BOUND_S`) + connections holding bodies past the
    bodies-in-flight cap (answered 503 naming it, the rest held until the bombs are done), through one server of
    ``cfg``. Asserts: no 5xx but those 503s, ``/health`` p99 under :data:`HEALTH_P99_S`, every honest step within
    :data:`HONEST_STEP_BOUND_S` and its reward the in-process one (1.0: the gold answer, when ``gold``), the server's
    RSS back within :data:`RSS_SLACK_MB` of its baseline once everyone has left."""
    index, actions, want = _honest_plan(cfg, gsm8k_dir)
    if gold:
        assert want == 1.0, f"the gold answer scores {want} in-process"
    n_held = INFLIGHT_CAP // MAX_BODY
    with serving(cfg, gsm8k_dir) as (url, port), httpx.Client(base_url=url, timeout=60) as c:
        _warm_up(url, index, actions, want)
        rss0 = _rss_mb()
        honest, prober = Honest(url, index, actions), Prober(url)
        bombers = [Bomber(url, shots[i::concurrent]) for i in range(concurrent)]
        honest.start()
        prober.start()
        held, refused = hold_bodies(port, n_held + HELD_OVER, MAX_BODY, "/step")
        try:
            for b in bombers:
                b.start()
            for b in bombers:
                b.join(BOMB_STEP_BOUND_S * len(shots) + 60)
        finally:
            for s in held:
                s.close()
            _stop(honest, prober)
        results = [r for b in bombers for r in b.results]
        assert not [e for b in bombers for e in b.errors], [b.errors for b in bombers]
        assert len(held) == n_held and len(refused) == HELD_OVER, (len(held), refused)
        assert all(r.startswith(b"HTTP/1.1 503") and b"max_inflight_body_bytes" in r for r in refused), refused
        bad = [r for r in results if r[1] != 200 or r[3] != 0.0 or not str(r[4]).startswith(want_kind)
               or r[2] > BOMB_STEP_BOUND_S]
        assert len(results) == len(shots) and not bad, bad or results
        _assert_honest(honest, prober, want)
        assert _p99(prober.lat) < HEALTH_P99_S, f"/health p99 {_p99(prober.lat):.2f} s (max {max(prober.lat):.2f} s)"
        _wait_sessions_closed(c)
        rss1 = _rss_mb()
        assert rss1 - rss0 < RSS_SLACK_MB, f"RSS {rss0:.0f} MB before the adversaries, {rss1:.0f} MB after they left"


def _rg(task: str) -> tuple[str, dict]:
    return "ReasoningGym-v1", {"task": task, **RG_KWARGS}


@needs_grader_process
def test_served_bomb_and_held_bodies_beside_honest_sessions(gsm8k_dir):
    """Unit stage: one bomb (puzzle24's ``exp(exp(20))``: > 270 s in one C call before issue 42) beside held bodies
    and an honest gold episode (the slow stage: every sympy task's bombs, two at once)."""
    run_graders_served(_rg("puzzle24"), gsm8k_dir, [("exp_exp", 0, BOMBS["puzzle24"]["exp_exp"])])


@pytest.mark.slow
@needs_grader_process
def test_served_raising_grader_beside_honest_sessions(gsm8k_dir):
    """A grader that raises (if-verifiable's IndexError on ``"1"``, IFEval test prompt 25) is an observation: 200,
    reward 0, ``action_error`` ``grader_error: ...`` (before issue 42: 500), beside held bodies and an honest client."""
    shots = [(f"{split}{i}:{a}", i, a) for split, i, a in IFEVAL_RAISES[:1]]
    run_graders_served(("IFEval-v0", {"split": "test"}), gsm8k_dir, shots, want_kind="grader_error", gold=False)


@pytest.mark.slow
@needs_grader_process
@pytest.mark.parametrize("task", list(BOMBS))
def test_served_every_bomb_two_at_once(task, gsm8k_dir):
    shots = [(name, i, text) for i in (0, 1) for name, text in BOMBS[task].items()]
    run_graders_served(_rg(task), gsm8k_dir, shots, concurrent=2, gold=task != "propositional_logic")


@pytest.mark.slow
@needs_grader_process
@pytest.mark.parametrize("split", ["test", "train"])
def test_served_every_raising_ifeval_prompt(split, gsm8k_dir):
    cases = IFEVAL_RAISES if split == "test" else IFEVAL_RAISES_TRAIN
    shots = [(f"{s}{i}:{a}", i, a) for s, i, a in cases]
    run_graders_served(("IFEval-v0", {"split": split}), gsm8k_dir, shots, concurrent=2, want_kind="grader_error",
                       gold=False)
