"""GSM8K as a one-step Gymnasium text environment.

Usage::

    import gymnasium as gym, envs
    gym.register_envs(envs)
    env = gym.make("GSM8K-v0", split="test")          # data from $GSM8K_DATA_DIR
    obs, info = env.reset(seed=0, options={"index": 3})
    # obs == [{"role": "system", ...}, {"role": "user", "content": <question>}]
    obs, reward, terminated, truncated, info = env.step("... #### 72")

The episode is one turn: the policy answers, the answer is graded with
:func:`envs.gsm8k.grading.gsm8k_reward` (1.0 correct / ``format_reward``, default 0, well-formed
but wrong / 0.0), and the episode terminates. Spaces: observation :class:`~envs.spaces.ChatMessages`
(a list of OpenAI-format messages), action :class:`~envs.spaces.AssistantAction` (raw text
or an assistant message dict).
"""
from __future__ import annotations

import copy
import operator
import os
from typing import Any

import gymnasium as gym

from .data import load_gsm8k
from .grading import gsm8k_reward, normalize_number, parse_gold
from envs.spaces import AssistantAction, ChatMessages

__all__ = ["GSM8KEnv", "DEFAULT_SYSTEM_PROMPT"]

DEFAULT_SYSTEM_PROMPT = (
    "You are a careful math tutor. Solve the grade-school math word problem step by step, "
    "showing your reasoning. Finish with a final line of the form '#### <number>' containing "
    "only the numeric answer (no units)."
)


def _problem_from_user(p: Any, i: int) -> dict:
    """Validate one user-supplied problem (``data=``) into ``{"question", "answer", "solution"}``."""
    if not isinstance(p, dict) or not isinstance(p.get("question"), str):
        raise ValueError(f"data[{i}] must be a dict with a string 'question', got {p!r:.80}")
    ans = p.get("answer")
    if isinstance(ans, str) and "####" in ans:
        gold = parse_gold(ans)
        solution = p.get("solution", ans)
    else:
        gold = normalize_number(ans)
        solution = p.get("solution", "")
    if gold is None:
        raise ValueError(f"data[{i}]['answer'] must hold a number, got {ans!r}")
    return {"question": p["question"], "answer": gold, "solution": solution}


class GSM8KEnv(gym.Env):
    """One GSM8K problem per episode, one step per episode.

    Args:
        split: ``"train"`` or ``"test"``.
        data_dir: folder with ``{split}.jsonl`` or an HF dataset id; default ``$GSM8K_DATA_DIR``
            (see :func:`envs.gsm8k.data.load_gsm8k`). Ignored when ``data`` is given.
        system_prompt: system message prepended to each question; ``None`` or ``""`` to send
            the question alone.
        format_reward: reward for a wrong answer in a well-formed final-answer format; default
            ``0.0``: the reward is the graded accuracy (1 correct / 0 otherwise), so it cannot be
            raised without being correct. A credit > 0 helps only models that never produce the
            format (SmolLM2-135M) and can be hacked: a response cut off at the token limit while
            reasoning earns 0, a one-line wrong ``#### N`` earns the credit, so GRPO learns to stop
            reasoning (see :mod:`envs.gsm8k.grading`); watch the trainer's
            ``episode/truncated_fraction`` and ``episode/response_tokens`` when enabling it.
        data: optional list of problems (``{"question", "answer"}``; ``answer`` a number or a
            solution ending in ``#### N``), used instead of the files (tests, custom sets).
        render_mode: ``None`` or ``"ansi"`` (``render()`` returns the conversation as text).

    Reset: ``options={"index": i}`` (or ``{"task_id": "i"}``) picks problem ``i``; without it a
    problem is drawn from ``self.np_random`` (reproducible with ``seed``). Returns
    ``obs = [system msg, user msg]`` and ``info`` with ``messages``, ``index``, ``task_id``,
    ``split``, ``answer`` (the gold number, for logging: do not show it to the policy).

    Step: ``action`` is the model's text or ``{"role": "assistant", "content": text}``. Returns
    ``obs=[]`` (nothing new is said), the reward, ``terminated=True``, ``truncated=False`` and
    ``info`` with ``answer``, ``extracted``, ``correct``, ``formatted``, ``messages`` (whole
    conversation including the answer), ``index``, ``task_id``, ``split``, and ``error`` when the
    action was not text (reward 0 then, no exception).

    Raises:
        ValueError: bad ``split``/``data``/``options`` (bad index) at construction or reset.
        FileNotFoundError: no data found (see :func:`~envs.gsm8k.data.load_gsm8k`).
        RuntimeError: ``step`` before ``reset`` or after the episode ended.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 1}

    def __init__(
        self,
        split: str = "train",
        data_dir: str | os.PathLike | None = None,
        system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
        format_reward: float = 0.0,
        data: list[dict] | None = None,
        render_mode: str | None = None,
    ):
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        if data is not None:
            if not isinstance(data, (list, tuple)) or not data:
                raise ValueError("data must be a non-empty list of problem dicts")
            self._problems = [_problem_from_user(p, i) for i, p in enumerate(data)]
        else:
            self._problems = load_gsm8k(split, data_dir)
        if system_prompt is not None and not isinstance(system_prompt, str):
            raise ValueError(f"system_prompt must be a string or None, got {system_prompt!r:.80}")
        self.split = split
        self.system_prompt = system_prompt or None
        self.format_reward = float(format_reward)
        self.render_mode = render_mode
        self.observation_space = ChatMessages()
        self.action_space = AssistantAction()
        self._index: int | None = None
        self._messages: list[dict] = []
        self._done = True
        self._started = False

    @property
    def num_problems(self) -> int:
        """Number of problems in the loaded split (valid ``index`` range is ``[0, n)``)."""
        return len(self._problems)

    def _pick_index(self, options: dict | None) -> int:
        if options is None:
            options = {}
        if not isinstance(options, dict):
            raise ValueError(f"options must be a dict, got {type(options).__name__}")
        index = options.get("index")
        if index is None and options.get("task_id") is not None:
            try:
                index = int(options["task_id"])
            except (TypeError, ValueError):
                raise ValueError(f"task_id must be an integer string, got {options['task_id']!r}")
        if index is None:
            return int(self.np_random.integers(len(self._problems)))
        try:
            if isinstance(index, bool):
                raise TypeError
            index = operator.index(index)  # int or numpy integer; not float / str
        except TypeError:
            raise ValueError(f"options['index'] must be an int, got {index!r}") from None
        if not 0 <= index < len(self._problems):
            raise ValueError(
                f"options['index']={index} out of range for split {self.split!r} "
                f"({len(self._problems)} problems)"
            )
        return index

    def _info(self) -> dict:
        return {
            "messages": copy.deepcopy(self._messages),
            "index": self._index,
            "task_id": str(self._index),
            "split": self.split,
            "answer": self._problems[self._index]["answer"],
        }

    def reset(
        self, *, seed: int | None = None, options: dict | None = None
    ) -> tuple[list[dict], dict]:
        super().reset(seed=seed)
        self._index = self._pick_index(options)
        problem = self._problems[self._index]
        messages = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        messages.append({"role": "user", "content": problem["question"]})
        self._messages = messages
        self._done = False
        self._started = True
        return copy.deepcopy(messages), self._info()

    @staticmethod
    def _action_text(action: Any) -> tuple[str | None, str | None]:
        """(text, error) from a raw-text or assistant-dict action."""
        if isinstance(action, str):
            return action, None
        if isinstance(action, dict):
            role = action.get("role", "assistant")
            if role != "assistant":
                return None, f"action message must have role 'assistant', got {role!r}"
            content = action.get("content")
            if content is None:
                content = ""
            if not isinstance(content, str):
                return None, f"action content must be a string, got {type(content).__name__}"
            return content, None
        return None, f"action must be a string or an assistant message dict, got {type(action).__name__}"

    def step(self, action: Any) -> tuple[list[dict], float, bool, bool, dict]:
        if not self._started:
            raise RuntimeError("GSM8KEnv.step() called before reset()")
        if self._done:
            raise RuntimeError("GSM8KEnv.step() called after the episode ended; call reset()")
        self._done = True
        text, error = self._action_text(action)
        gold = self._problems[self._index]["answer"]
        if error is None:
            reward, grade = gsm8k_reward(text, gold, format_reward=self.format_reward)
            self._messages.append({"role": "assistant", "content": text})
        else:
            reward = 0.0
            grade = {"extracted": None, "correct": False, "formatted": False, "answer": gold}
            # Keep a trace of what was sent (truncated repr) so the transcript stays complete.
            self._messages.append({"role": "assistant", "content": repr(action)[:2000]})
        info = self._info()
        info.update(grade)
        if error is not None:
            info["error"] = error
        return [], float(reward), True, False, info

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        return "\n\n".join(f"[{m['role']}]\n{m.get('content') or ''}" for m in self._messages)
