"""Scoring a response against a prompt's verifiable instructions (IFEval / IFBench).

IFEval (Zhou et al. 2023, "Instruction-Following Evaluation for Large Language Models",
arXiv:2311.07911) attaches to each prompt a list of *verifiable instructions* (``instruction_id_list``,
e.g. ``"punctuation:no_comma"``, with one ``kwargs`` dict each); a program checks each one. IFBench
(Pyatkin et al. 2025, arXiv:2507.02833) uses the same format with 58 new instruction types.

The checkers are not re-written here: they come from the maintained package ``if-verifiable``
(``pip install 'torchrl-grpo[ifeval]'``), which carries both instruction registries (IFEval's 25 types,
IFBench's 58; their ids do not overlap, so an id names its registry) and IFEval's strict / loose
protocol (:func:`if_verifiable.common.evaluate_instructions`):

* strict: the instruction's checker accepts the response as it is;
* loose (IFEval §2.2): the checker accepts *any* of 8 variants: the response, with its first line,
  its last line or both removed, each also with every markdown ``*`` removed.

Per prompt: ``strict`` = fraction of its instructions followed strictly (IFEval's
instruction-level strict accuracy, restricted to this prompt), ``loose`` likewise, and
``prompt_strict`` / ``prompt_loose`` = 1.0 when *all* are followed (prompt-level accuracy).

A ``<think>...</think>`` block is removed before checking (if-verifiable's ``strip_thinking``); an
empty response follows no instruction.

Offline note: a few checkers need NLTK data (``punkt`` sentence splitter, stopwords, a POS tagger).
Nothing here reaches the network unless asked: if-verifiable's IFBench module calls ``nltk.download`` when
it is imported; we import it with ``nltk.download`` replaced by a stand-in that downloads nothing and logs
how to get the data (where we diverge from if-verifiable: a library must not fetch data behind the
caller's back; set ``IFEVAL_NLTK_DOWNLOAD=1`` to let it download). Without the data the checkers raise
``LookupError``; :func:`instruction_available` tells such instructions apart so the env can leave their
prompts out (``python -m nltk.downloader punkt punkt_tab stopwords averaged_perceptron_tagger_eng`` makes
them available).
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import random
from typing import Any

from envs.contract import grader_flags
from envs.grader_process import grade, register_worker_module

__all__ = ["get_checker_class", "check_kwargs", "instruction_available", "score_response", "not_followed"]

_INSTALL = "pip install 'torchrl-grpo[ifeval]' (or: pip install if-verifiable)"
#: How to get the NLTK data some checkers need (said wherever it is missing).
NLTK_DATA_HINT = "python -m nltk.downloader punkt punkt_tab stopwords averaged_perceptron_tagger_eng"
_log = logging.getLogger(__name__)


@contextlib.contextmanager
def _no_nltk_download():
    """Within the block ``nltk.download`` downloads nothing (it logs what is missing and how to get it), unless
    ``IFEVAL_NLTK_DOWNLOAD=1``. Not thread-safe against another thread calling ``nltk.download`` meanwhile (used
    only around one import, under ``_registry``'s cache)."""
    if os.environ.get("IFEVAL_NLTK_DOWNLOAD") == "1":
        yield
        return
    import nltk

    real, asked = nltk.download, []

    def no_download(info_or_id=None, *args, **kwargs) -> bool:
        asked.append(str(info_or_id))
        return False

    nltk.download = no_download
    try:
        yield
    finally:
        nltk.download = real
        if asked:
            _log.warning("NLTK data %s is missing and was not downloaded (envs never reach the network unless asked): "
                         "%s, or set IFEVAL_NLTK_DOWNLOAD=1", asked, NLTK_DATA_HINT)
#: Texts every checker can run on; used only to see whether the checker's NLTK data is there. The long one reaches
#: the code a checker runs only on longer answers: IFBench's ``words:keywords_specific_position`` tokenizes words
#: (NLTK ``punkt_tab``) only once the answer has its ``n``-th sentence (``n`` 20-30), so the short probe alone
#: listed its prompts as usable and 23+ sentences raised ``LookupError`` (issue 42).
_PROBES = ("Hello world. This is a short probe text, with two sentences.",
           "This is one of many sentences in a longer probe text. " * 64)


@functools.lru_cache(maxsize=None)
def _registry(name: str) -> dict:
    try:
        if name == "ifeval":
            from if_verifiable.ifeval.instructions_registry import INSTRUCTION_DICT
        else:  # imported only when needed: IFBench's module tries to download NLTK data on import (stopped)
            with _no_nltk_download():
                from if_verifiable.ifbench.instructions_registry import INSTRUCTION_DICT
    except ImportError as err:
        raise ImportError(f"IFEval-v0 needs the 'if-verifiable' package: {_INSTALL}") from err
    return dict(INSTRUCTION_DICT)


def get_checker_class(instruction_id: str):
    """The checker class of ``instruction_id`` from IFEval's registry, else IFBench's.

    Raises:
        KeyError: the id is in neither registry.
        ImportError: ``if-verifiable`` is not installed.
    """
    for name in ("ifeval", "ifbench"):
        cls = _registry(name).get(instruction_id)
        if cls is not None:
            return cls
    raise KeyError(f"unknown instruction id {instruction_id!r} (not in IFEval's or IFBench's registry)")


@contextlib.contextmanager
def _keep_global_random():
    """Checkers draw missing kwargs from the global ``random`` module: restore its state so that grading never
    shifts a trainer's random stream."""
    state = random.getstate()
    try:
        yield
    finally:
        random.setstate(state)


def _build(instruction_id: str, kwargs: dict | None, prompt: str):
    checker = get_checker_class(instruction_id)(instruction_id)
    checker.build_description(**{k: v for k, v in (kwargs or {}).items() if v is not None})
    args = checker.get_instruction_args()
    if args and "prompt" in args:
        checker.build_description(prompt=prompt)
    return checker


def check_kwargs(instruction_id: str, kwargs: dict | None, prompt: str) -> None:
    """Build the checker once, so an unknown id or a bad ``kwargs`` dict fails at load, not mid-training.

    Raises:
        KeyError: unknown instruction id.
        TypeError / ValueError: kwargs the checker does not accept.
    """
    with _keep_global_random():
        _build(instruction_id, kwargs, prompt)


@functools.lru_cache(maxsize=None)
def instruction_available(instruction_id: str) -> bool:
    """Whether the checker of ``instruction_id`` can run here: ``False`` when it needs NLTK data that is not
    installed (it raises ``LookupError`` on a probe text: a short one and one of 64 sentences). Cached per id.
    """
    for probe in _PROBES:
        try:
            with _keep_global_random():
                _build(instruction_id, None, probe).check_following(probe)
        except LookupError:
            return False
        except Exception:  # noqa: BLE001 - a probe with default kwargs may fail otherwise; only NLTK data matters here
            continue
    return True


def _evaluate_in_worker(response: str, instruction_id_list: list[str], kwargs: list[dict],
                        prompt: str) -> list[tuple[str, bool, bool]]:
    """In a grader worker (:mod:`envs.grader_process`): if-verifiable's ``evaluate_instructions`` as
    ``[(instruction_id, strict, loose)]`` (``[]`` for an empty response), the worker's global ``random`` seeded to 0
    and restored (checkers draw missing kwargs from it: the same response scores the same in every worker)."""
    from if_verifiable.common import evaluate_instructions

    registry = {i: get_checker_class(i) for i in instruction_id_list}
    with _keep_global_random():
        random.seed(0)
        results, _ = evaluate_instructions(response=response, instruction_id_list=list(instruction_id_list),
                                           kwargs_list=list(kwargs), prompt=prompt, instruction_registry=registry)
    return [(r.instruction_id, bool(r.strict_pass), bool(r.loose_pass)) for r in results]


def _worker_setup() -> None:
    """Run once in each grader worker before its limits: import if-verifiable's registries (and NLTK), so that no
    call pays for them."""
    for name in ("ifeval", "ifbench"):
        try:
            _registry(name)
        except ImportError:  # not installed: IFEval-v0 cannot be made, and no call comes
            return


register_worker_module(__name__, preload=("if_verifiable.ifeval.instructions_registry",))  # not IFBench's: it downloads


def score_response(response: str, instruction_id_list: list[str], kwargs: list[dict], prompt: str) -> dict[str, Any]:
    """Check ``response`` against each instruction, strictly and loosely (if-verifiable's protocol), in a grader
    worker process (:mod:`envs.grader_process`: CPU-time, memory and wall-clock bounds; the checkers are code we do
    not own, some superlinear, some raising on odd text).

    Args:
        response: the model's text.
        instruction_id_list: the prompt's instruction ids (``n`` of them, ``n >= 1``).
        kwargs: one dict per instruction (``len == n``).
        prompt: the prompt (some checkers compare with it, e.g. ``combination:repeat_prompt``).

    Returns:
        ``{"strict": float, "loose": float, "prompt_strict": float, "prompt_loose": float,
        "instructions": [{"instruction_id", "strict", "loose"}, ...], "grader_timeout": bool, "grader_memory": bool,
        "grader_error": bool}`` (``n`` instruction entries, prompt order). When the checkers failed (past a bound of
        the worker, or raised: a checker's ``LookupError`` for missing NLTK data, an ``IndexError`` on one
        character), every instruction counts as not followed, the flag of that kind is ``True`` and ``"error"`` holds
        the env's ``action_error`` (``"grader_<kind>: ..."``).

    Cost: each checker runs up to 9 times (strict + 8 loose variants), and some of if-verifiable's checkers are
    superlinear in ``len(response)`` (``\\[.*?\\]`` placeholders, bullet lists, postscript, ``<<title>>``,
    ``format:newline``); beyond the worker's bounds nothing here bounds the length: :class:`envs.ifeval.env.IFEvalEnv`
    grades responses of at most ``max_response_chars`` characters (issue 34; ``tests/test_step_bounds.py`` times the
    slowest checkers there). One round trip to a worker per call.
    """
    rows, failure = grade(_evaluate_in_worker, response, list(instruction_id_list), list(kwargs), prompt)
    if failure is not None:
        return {**not_followed(instruction_id_list), **failure.flags(), "error": failure.action_error}
    if not rows:  # an empty response (after removing <think>): if-verifiable returns no rows; none followed
        return {**not_followed(instruction_id_list), **grader_flags()}
    per = [{"instruction_id": i, "strict": strict, "loose": loose} for i, strict, loose in rows]
    n = len(per)
    s = sum(p["strict"] for p in per)
    lo = sum(p["loose"] for p in per)
    return {"strict": s / n, "loose": lo / n, "prompt_strict": float(s == n), "prompt_loose": float(lo == n),
            "instructions": per, **grader_flags()}


def not_followed(instruction_id_list: list[str]) -> dict[str, Any]:
    """:func:`score_response`'s scores for a response that follows no instruction (without the flags)."""
    per = [{"instruction_id": i, "strict": False, "loose": False} for i in instruction_id_list]
    return {"strict": 0.0, "loose": 0.0, "prompt_strict": 0.0, "prompt_loose": 0.0, "instructions": per}
