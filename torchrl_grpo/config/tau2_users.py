"""Who plays the tau2 customer, read from an ``econfig`` section: one spelling per concept (a rule about config
values; :func:`torchrl_grpo.config.validate_config` checks it at start-up, :mod:`torchrl_grpo.rollout.env_side` maps
it to the env's ``user=``)."""
from __future__ import annotations

from torchrl_grpo.config.choices import USERS

__all__ = ["tau2_user", "is_tau2"]


def is_tau2(env_id: str) -> bool:
    """Whether ``econfig.env_id`` names a tau2 env (``tau2`` with ``econfig.domain``, or ``tau2/<domain>-v0``)."""
    return env_id.startswith("tau2/") or env_id == "tau2"


def tau2_user(e) -> str | None:
    """The tau2 user an ``econfig`` section asks for: ``solo`` | ``scripted`` | ``llm`` | ``local``; ``None`` for a
    non-tau2 env.

    ``econfig.solo_mode`` (AReaL's name) is the one switch for solo play; with ``solo_mode=false``, ``econfig.user``
    (:data:`~torchrl_grpo.config.choices.USERS`) picks the customer, and when it is null ``user_llm`` does: ``local``
    -> ``local``, another value -> ``llm`` (tau2's LLM user), unset -> ``scripted``.

    Raises:
        ValueError: ``econfig.user=solo`` (naming ``econfig.solo_mode=true``), another value outside ``USERS``,
            or ``solo_mode=true`` together with ``econfig.user`` / ``econfig.user_llm``.
    """
    if not is_tau2(e.env_id):
        return None
    if e.user == "solo":
        raise ValueError("config econfig.user=solo: solo play is econfig.solo_mode=true (econfig.user picks the "
                         f"customer when solo_mode=false: one of {USERS})")
    if e.user is not None and e.user not in USERS:
        raise ValueError(f"config econfig.user={e.user!r} is not one of {USERS} (or null)")
    if e.solo_mode:
        if e.user is not None or e.user_llm:
            raise ValueError(f"config econfig.solo_mode=true has no user, but econfig.user={e.user!r} / "
                             f"econfig.user_llm={e.user_llm!r} is set; set econfig.solo_mode=false to play with a user")
        return "solo"
    if e.user:
        return e.user
    return "local" if e.user_llm == "local" else "llm" if e.user_llm else "scripted"
