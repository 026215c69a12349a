"""IFEval-style instruction following as a one-turn Gymnasium env (id ``IFEval-v0``).

:mod:`.data` loads prompts with their verifiable instructions, :mod:`.grading` scores a response with
the maintained verifiers of ``if-verifiable`` (strict and loose), :mod:`.env` is the env.
"""
