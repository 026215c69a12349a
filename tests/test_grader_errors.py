"""Every error inside a grader is an observation, never a raise (issue 42; :mod:`envs.contract`, "Graders").

A. On every registered contract id, a grader raising any ``BaseException`` (``RecursionError``, ``MemoryError``,
   ``SystemExit`` from a library, ``GeneratorExit``, a custom ``BaseException``) gives a step that ends the episode
   with reward 0, ``info["action_error"]`` naming it and ``info["grader_error"]`` set; ``KeyboardInterrupt`` is
   re-raised. The grader is monkeypatched per family: a new family without an entry in :func:`_patch_grader`
   fails here until it gets one.
B. The library cases the attack found: spell_backward's 1.0000000000000002 (was ``RuntimeError``), IFEval's
   ``IndexError`` on ``"1"`` (train 88-91, test 25), and ``LookupError`` on 23+ sentences (NLTK ``punkt_tab``) on
   prompts listed as usable (train 8-10, test 2).
C. Through the server: a raising grader is a 200 with the error observation, never a 500.
"""
from __future__ import annotations

import gymnasium as gym
import httpx
import pytest

import envs
from envs.contract import GRADER_FAILURE_KINDS
from envs.single_turn import SingleTurnTextEnv
from tests.test_env_contract import CHEAP_KWARGS, REGISTERED

gym.register_envs(envs)


class _LibraryBaseError(BaseException):
    """A library's own ``BaseException`` subclass (not an ``Exception``)."""


#: What a grader we do not own may raise; each must become an observation.
RAISED = [RuntimeError("boom"), IndexError("string index out of range"), LookupError("Resource punkt_tab not found"),
          RecursionError("maximum recursion depth exceeded"), MemoryError(), SystemExit(3), GeneratorExit(),
          _LibraryBaseError("custom")]


@pytest.fixture(scope="module", params=REGISTERED)
def env(request):
    kwargs = dict(CHEAP_KWARGS.get(request.param, {}))
    if request.param.startswith("GSM8K"):
        kwargs["data_dir"] = str(request.getfixturevalue("gsm8k_dir"))
    e = gym.make(request.param, **kwargs)
    yield e
    e.close()


def _raiser(exc: BaseException):
    def grade(*args, **kwargs):
        raise exc
    return grade


def _patch_grader(monkeypatch, env, exc: BaseException):
    """Make ``env``'s grader raise ``exc``; returns the action that reaches the grader."""
    u = env.unwrapped
    if isinstance(u, SingleTurnTextEnv):
        monkeypatch.setattr(type(u), "_grade", _raiser(exc))
        return "an answer: 42"
    if type(u).__module__.startswith("envs.tau2"):
        import envs.tau2.rewards as rewards

        monkeypatch.setattr(rewards, "tau2_reward", _raiser(exc))
        monkeypatch.setattr(rewards, "tau2_reward_reference", _raiser(exc))
        return u.do_nothing_action  # ends the episode: tau2's evaluator runs
    pytest.fail(f"no grader to patch for {env.spec.id}: add its family to _patch_grader")


def _failed(info: dict) -> list[str]:
    """The grader failure flags set in a step's ``info``."""
    return [k for k in GRADER_FAILURE_KINDS if info.get(k)]


@pytest.mark.parametrize("exc", RAISED, ids=lambda e: type(e).__name__)
def test_a_raising_grader_is_an_observation_on_every_id(env, exc, monkeypatch):
    action = _patch_grader(monkeypatch, env, exc)
    env.reset(seed=0, options={"index": env.unwrapped.usable_task_indices(1)[0]})
    obs, reward, terminated, truncated, info = env.step(action)
    assert reward == 0.0 and terminated and not truncated
    assert isinstance(obs, list)
    assert isinstance(info.get("action_error"), str) and type(exc).__name__ in info["action_error"]
    assert info["action_error"].startswith("grader_error: ") and _failed(info) == ["grader_error"]
    with pytest.raises(RuntimeError, match="episode has ended"):
        env.step(action)  # the episode ended as any other


def test_keyboard_interrupt_is_re_raised_on_every_id(env, monkeypatch):
    action = _patch_grader(monkeypatch, env, KeyboardInterrupt())
    env.reset(seed=0, options={"index": env.unwrapped.usable_task_indices(1)[0]})
    with pytest.raises(KeyboardInterrupt):
        env.step(action)


def test_an_exception_whose_str_raises_is_still_named(monkeypatch):
    class Unprintable(Exception):
        def __str__(self):
            raise ValueError("no str")

    env = gym.make("DigitSum-v0")
    monkeypatch.setattr(type(env.unwrapped), "_grade", _raiser(Unprintable()))
    env.reset(seed=0)
    *_, info = env.step("7")
    assert "Unprintable" in info["action_error"]


@pytest.mark.parametrize("bad", [float("nan"), 1.5, -0.25, float("inf")], ids=repr)
def test_a_reward_outside_0_1_is_an_observation(bad, monkeypatch):
    env = gym.make("DigitSum-v0")
    monkeypatch.setattr(type(env.unwrapped), "_grade", lambda self, text: (bad, {}, None))
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step("7")
    assert reward == 0.0 and terminated and "outside [0, 1]" in info["action_error"]
    assert _failed(info) == ["grader_error"]


@pytest.mark.parametrize("near", [1.0000000000000002, -1e-17], ids=repr)
def test_a_reward_a_rounding_error_outside_0_1_is_clamped(near, monkeypatch):
    env = gym.make("DigitSum-v0")
    monkeypatch.setattr(type(env.unwrapped), "_grade", lambda self, text: (near, {}, None))
    env.reset(seed=0)
    _, reward, *_, info = env.step("7")
    assert reward == min(1.0, max(0.0, near)) and "action_error" not in info


# ---------------------------------------------------------------------------------------------------- B: libraries
def test_spell_backward_gold_plus_x_scores_in_0_1():
    """Before: 36 of the 200 test items raised RuntimeError (score 1.0000000000000002 from the library's float sum)."""
    env = gym.make("ReasoningGym-v1", task="spell_backward", split="test")
    for i in range(env.unwrapped.num_tasks):
        _, info = env.reset(options={"index": i})
        _, reward, *_, step = env.step(f"<answer>{info['answer']}x</answer>")
        assert 0.0 <= reward <= 1.0 and not _failed(step), (i, reward, step.get("action_error"))


@pytest.mark.parametrize(("split", "index"), [("train", 88), ("train", 89), ("train", 90), ("train", 91),
                                              ("test", 25)])
@pytest.mark.parametrize("answer", ["1", "!", "*"])
def test_ifeval_index_error_in_the_checker_is_an_observation(split, index, answer):
    """Before: if-verifiable's format:quote_unquote raised IndexError on a one-character answer."""
    env = gym.make("IFEval-v0", split=split)
    env.reset(options={"index": index})
    _, reward, terminated, _, info = env.step(answer)
    assert reward == 0.0 and terminated and "IndexError" in info["action_error"]


@pytest.mark.parametrize("split", ["train", "test"])
def test_every_usable_ifeval_prompt_can_be_graded(split):
    """Before: words:keywords_specific_position (train 8-10, test 2) was listed usable but raised LookupError (NLTK
    punkt_tab missing) once the answer had as many sentences as the instruction counts to."""
    env = gym.make("IFEval-v0", split=split)
    answer = "This is a sentence. " * 40  # 800 characters: graded (under max_response_chars)
    for i in env.unwrapped.usable_task_indices():
        env.reset(options={"index": i})
        *_, info = env.step(answer)
        assert not _failed(info), (split, i, info.get("action_error"))


# ---------------------------------------------------------------------------------------------------- C: server
def test_a_raising_grader_over_http_is_a_200_observation(monkeypatch):
    from envs.reasoning_gym.env import ReasoningGymEnv
    from envs.serve import build_app
    from tests.served import serve_app

    app = build_app("ReasoningGym-v1", {"task": "chain_sum", "split": "test", "test_size": 2})
    monkeypatch.setattr(ReasoningGymEnv, "_grade", _raiser(RecursionError("deep")))
    with serve_app(app) as (url, _), httpx.Client(base_url=url, timeout=30) as c:
        r = c.post("/step", json={"action": {"content": "<answer>3</answer>"}, "index": 0})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["reward"] == 0.0 and body["done"] is True
        assert "RecursionError" in body["observation"]["info"]["action_error"]
        sid = c.post("/sessions").json()["session_id"]
        assert c.post(f"/sessions/{sid}/reset", json={"index": 1}).status_code == 200
        r = c.post(f"/sessions/{sid}/step", json={"action": {"content": "<answer>3</answer>"}})
        assert r.status_code == 200 and "RecursionError" in r.json()["observation"]["info"]["action_error"]
