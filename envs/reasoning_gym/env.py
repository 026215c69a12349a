"""Reasoning Gym's procedural tasks as a one-step Gymnasium text environment (:class:`ReasoningGymEnv`, id
``ReasoningGym-v1``).

The episode is one turn: the policy answers a generated question, the answer is extracted
(:func:`envs.reasoning_gym.grading.extract_answer`) and scored by the library's own ``score_answer``, and the
episode terminates. The class docstring is the spec, in Gymnasium's sections; the contract shared by all envs is
:mod:`envs.contract`.
"""
from __future__ import annotations

import copy

from .data import (DEFAULT_TEST_SEED, DEFAULT_TEST_SIZE, DEFAULT_TRAIN_SEED, DEFAULT_TRAIN_SIZE, dataset_for,
                   resolve_spec, split_items)
from .grading import MAX_TEXT_CHARS, score
from envs.grader_process import default_pool
from envs.single_turn import SingleTurnTextEnv

__all__ = ["ReasoningGymEnv", "DEFAULT_SYSTEM_PROMPT", "TOOL_CALL_IN_ANSWER"]

#: Asks for the final answer alone on the last line: the extraction's fallback (tags are read too).
DEFAULT_SYSTEM_PROMPT = "Answer the question. End your reply with the final answer alone on the last line."
#: ``info["action_error"]`` of a response holding a ``<tool_call>`` block: this env has no tools.
TOOL_CALL_IN_ANSWER = "the response holds a <tool_call> block, but ReasoningGym-v1 has no tools; it was graded as text"


class ReasoningGymEnv(SingleTurnTextEnv):
    """One generated Reasoning Gym problem per episode, one step per episode (follows :mod:`envs.contract`).

    ## Description

    Reasoning Gym (Stojanovski et al. 2025, "REASONING GYM: Reasoning Environments for Reinforcement Learning with
    Verifiable Rewards", arXiv:2505.24760; pip ``reasoning-gym``): ~100 procedural generators (arithmetic, algebra,
    logic, games, ...) with a verifier each. ``task="chain_sum"`` plays one generator with ``task_config`` (its
    config dataclass fields, e.g. ``min_terms``); ``tasks={"chain_sum": 1.0, "leg_counting": 0.5}`` a weighted mix
    (the library's ``composite`` dataset). ``level`` sets the difficulty with the library's curriculum
    (``create_curriculum(name).set_global_level(level)``; 0 is the easiest), so a run can start easy and be
    rebuilt harder. The splits (:mod:`envs.reasoning_gym.data`): the question space is cut 75/25 by a hash of the
    question text; train = the first ``train_size`` train-side items of the generator seeded ``train_seed``, test =
    the first ``test_size`` test-side items of the generator seeded ``test_seed``: disjoint whatever the seeds, each
    deterministic for its seed and on the generator's own difficulty mix.

    ## Action Space

    :class:`~envs.spaces.AssistantAction`: the model's text, or ``{"role": "assistant", "content": text}``
    (``tool_calls`` ignored). Only the last ``MAX_TEXT_CHARS`` (4096) characters are read (more when the gold
    answer is longer: :func:`~envs.reasoning_gym.grading.window_chars`), lone surrogates replaced. The answer is the
    last ``<answer>...</answer>`` block, else (numeric gold answer) the last number, else the last non-empty line
    (:func:`envs.reasoning_gym.grading.extract_answer`). Scores 0 and sets ``info["action_error"]``: an empty
    response; an answer refused by the bounds (:func:`~envs.reasoning_gym.grading.answer_guard`: a number over 64
    digits, brackets nested over 32 deep, an exponent over 100, a power of a power -- each bound widened to the gold
    answer's own value, so the gold answer always passes); for the 11 tasks whose verifier can evaluate text
    (``eval`` / sympy's ``parse_expr``, found by :mod:`~envs.reasoning_gym.verifier_audit` in the installed
    library's source), an answer outside the task's grammar (:mod:`~envs.reasoning_gym.answer_formats`: nothing
    that can name an attribute, a dunder, an import or a call other than an allow-listed math function ever
    reaches the evaluator); a verifier (any task's) that runs past a bound of its worker process
    (:mod:`envs.grader_process`: 1 s of CPU time, 1 GiB of address space, 30 s of wall clock, retried once) or
    raises: ``action_error`` ``grader_timeout: ...`` / ``grader_memory: ...`` / ``grader_error: ...`` and the
    step's ``info["grader_timeout"]`` / ``["grader_memory"]`` / ``["grader_error"]`` (``bool``, on every step)
    says which. A ``<tool_call>``
    block is graded as text and flagged (:data:`TOOL_CALL_IN_ANSWER`). An action outside the space (``12345``,
    ``None``, a list, a dict with another role or non-string content) is a caller's bug: ``step`` raises
    ``TypeError`` and the episode goes on unchanged. Every scan of the text is linear in its length.

    ## Observation Space

    :class:`~envs.spaces.ChatMessages`. On reset ``[system msg, user msg]`` (:data:`DEFAULT_SYSTEM_PROMPT`, then
    the generated question), ``[user msg]`` with ``system_prompt=None``. The step returns ``[]``.

    ## Rewards

    The library's ``score_answer(extracted, entry)`` of the problem's generator, unchanged, in ``[0, 1]`` (most
    tasks: 1 correct, 0 wrong; some give partial credit, e.g. chain_sum ``len(gold) / len(answer)`` when the gold
    string occurs inside a wrong answer; countdown 0.01 for a malformed expression); 0 for what is refused above.

    ## Starting State

    ``reset(options={"index": i})`` (or ``{"task_id": "i"}``: a problem's id is ``str(i)``) picks problem ``i``
    of the split; without options one is drawn from ``self.np_random`` (reproducible with ``seed``). Every
    problem is usable (:meth:`usable_task_indices`); ``do_nothing_action is None`` (an empty answer scores 0).
    :meth:`demonstration` writes the gold answer as ``<answer>gold</answer>`` (scores 1); it raises ``ValueError``
    for a problem whose task gives no gold answer (boxnet, graph_color, propositional_logic, rubiks_cube,
    rush_hour: their verifiers check a solution), which has no demonstration.

    ## Episode End

    Termination after the one step (``terminated=True``, ``truncated=False``,
    ``info["termination_reason"] == "answered"``). ``step`` again raises ``RuntimeError("episode has ended; call
    reset()")``; ``step`` before ``reset`` raises ``RuntimeError`` too.

    Info: on reset and step ``messages``, ``tools`` (``[]``), ``index``, ``task_id``, ``split``, ``question``,
    ``answer`` (the gold answer: for logging, not for the policy), ``task`` (the generator's name),
    ``task_config`` (its resolved config, with the split's generator ``seed``), ``source_index`` (the item's
    index in that generator); after the step also ``extracted`` (``str | None``), ``termination_reason`` and,
    when flagged, ``action_error``.

    ## Arguments

    Args:
        task: one generator name (default ``"chain_sum"`` when ``tasks`` is not given).
        tasks: ``{name: weight > 0}`` for a weighted mix (instead of ``task``).
        split: ``"train"`` or ``"test"``.
        task_config: ``task``'s config dict, or with ``tasks`` ``{name: config dict}``; ``seed`` / ``size`` are
            the env's (below).
        level: the curriculum's global level for every task (``None``: the library's config defaults); a
            ``task_config`` key that the level also sets is an error.
        train_seed, test_seed: generator seeds of the splits (default 11 / 22; must differ).
        train_size, test_size: problems per split (default 1000 / 200). Each split depends on its own seed and
            size only (the hash partition keeps them disjoint; the two seeds must differ).
        system_prompt: system message before the question; ``None`` or ``""`` for none.
        render_mode: ``None`` or ``"ansi"``.

    Raises:
        ValueError: an unknown task name or config key (the message lists the library's valid ones), a config the
            library rejects, a task whose verifier evaluates text and that has no answer grammar (none in
            reasoning-gym 0.1.25; a library upgrade that adds one is refused until it gets one), a bad weight / level / split / seed / size / ``options``, equal seeds, or a split
            that cannot be filled from its side of the hash partition (a task with very few distinct questions).
        TypeError: ``step`` with an action outside the action space.
        RuntimeError: ``step`` before ``reset`` or after the episode ended.

    ## Example

    ```python
    >>> import gymnasium as gym, envs
    >>> gym.register_envs(envs)
    >>> env = gym.make("ReasoningGym-v1", task="chain_sum", split="test",
    ...                task_config={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2})
    >>> obs, info = env.reset(seed=0, options={"index": 0})
    >>> [m["role"] for m in obs], info["task"]
    (['system', 'user'], 'chain_sum')
    >>> obs, reward, terminated, truncated, info = env.step(f"Adding them up.\\n{info['answer']}")
    >>> reward, terminated, info["extracted"] == info["answer"]
    (1.0, True, True)

    ```

    ## Version History

    Policy (:mod:`envs`): the version is bumped whenever the reward semantics change; one bullet per version.

    - v0 (2026-11-25, 456d7d6): released: reward = the library's ``score_answer`` on the extracted answer; train =
      the first ``train_size`` items of ``train_seed``, test = items of ``test_seed`` not in train. No longer
      registered (``gym.make("ReasoningGym-v0")`` raises ``DeprecatedEnv`` naming ReasoningGym-v1).
    - v1 (2026-11-25, 79adad0): **splits are a 75/25 hash partition of the question text** (v0's test split was
      skewed to 2-digit sums); ran as "ReasoningGym-v0" until renamed 2026-11-26. Since, no bump: answers outside
      an evaluating verifier's grammar, or taking it over 1.5 s, score 0 with ``action_error`` (2d47f0a, eacccb9;
      security fix, issue 34); hexadecimal answers and gold answers over 4,096 characters read whole.
    """

    def __init__(
        self,
        task: str | None = None,
        tasks: dict[str, float] | None = None,
        split: str = "train",
        task_config: dict | None = None,
        level: int | None = None,
        train_seed: int = DEFAULT_TRAIN_SEED,
        test_seed: int = DEFAULT_TEST_SEED,
        train_size: int = DEFAULT_TRAIN_SIZE,
        test_size: int = DEFAULT_TEST_SIZE,
        system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
        render_mode: str | None = None,
    ):
        self._check_common_args(system_prompt, render_mode)
        if task is None and tasks is None:
            task = "chain_sum"
        self.spec_tasks = resolve_spec(task, tasks, task_config, level)
        seed = train_seed if split == "train" else test_seed
        self._problems = split_items(self.spec_tasks, split, train_seed=train_seed, test_seed=test_seed,
                                     train_size=train_size, test_size=test_size)
        self._scorer = dataset_for(self.spec_tasks, seed, len(self._problems))
        default_pool().start()  # the verifiers run there (envs.grader_process): started now, not at the first step
        self._configs = self.spec_tasks.configs()
        self.level = level
        self._init_single_turn(split, system_prompt, render_mode)

    # ------------------------------------------------------------------ data and grading (SingleTurnTextEnv hooks)
    @property
    def num_tasks(self) -> int:
        """Number of problems in the split (valid ``index`` range is ``[0, num_tasks)``)."""
        return len(self._problems)

    def demonstration(self, options: dict | None) -> list[dict]:
        """The gold answer of the problem ``options`` picks, written the way the env extracts answers:
        ``[{"role": "assistant", "content": "<answer>{gold}</answer>"}]`` (scores 1.0 with the library's scorer).

        Raises:
            ValueError: options that pick no problem, or bad options (as for ``reset``); a problem whose task gives
                its items no gold answer (boxnet, graph_color, propositional_logic, rubiks_cube, rush_hour in
                reasoning-gym 0.1.25: their verifiers check a solution), which has no demonstration (the message
                names the task and not the problem, so a caller can group them).
        """
        p = self._problems[self._pick_task(options)]
        if p["answer"] is None:
            name = p["metadata"].get("source_dataset", self.spec_tasks.tasks[0][0])
            raise ValueError(f"reasoning_gym task {name!r} gives its items no gold answer (its verifier checks a "
                             f"solution), so it has no demonstration")
        return [{"role": "assistant", "content": f"<answer>{p['answer']}</answer>"}]

    def _prompt(self, index: int) -> str:
        return self._problems[index]["question"]

    def _task_info(self, index: int) -> dict:
        p = self._problems[index]
        name = p["metadata"].get("source_dataset", self.spec_tasks.tasks[0][0])
        return {"question": p["question"], "answer": p["answer"], "task": name,
                "task_config": dict(self._configs[name], seed=p["seed"]), "source_index": p["source_index"]}

    def _grade(self, text: str) -> tuple[float, dict, str | None]:
        p = self._problems[self._index]
        entry = {"question": p["question"], "answer": p["answer"], "metadata": copy.deepcopy(p["metadata"])}
        # the verifier that judges: the one task's, or the one a mix (the library's composite) dispatches the item to
        task = self.spec_tasks.tasks[0][0] if len(self.spec_tasks.tasks) == 1 else p["metadata"]["source_dataset"]
        reward, grade = score(self._scorer, text, entry, task)
        error = grade.get("error")
        if error is None and "<tool_call>" in text[-MAX_TEXT_CHARS:]:
            error = TOOL_CALL_IN_ANSWER
        return reward, {k: v for k, v in grade.items() if k != "error"}, error  # extracted, grader_* flags
