"""The Reasoning Gym family's declaration (:mod:`envs.families`): id ``ReasoningGym-v1``, its config keys (the
generator's task(s), config, level, split seeds and sizes), kwargs and data check. Loaded on its own by
:func:`envs.families.discover`; ``reasoning_gym`` loads only when :func:`check_data` or the env runs."""
from __future__ import annotations

from envs.families import EnvFamily, register_family

ENV_ID = "ReasoningGym-v1"


def make_kwargs(section: dict, split: str, dataset_path: str | None, runtime) -> tuple[str, dict]:
    """``ReasoningGym-v1``'s kwargs: ``split``, ``task`` (default ``chain_sum``) or ``tasks``, ``task_config``,
    ``level``, the splits' seeds and sizes, ``system_prompt`` when set.

    Raises:
        ValueError: a dataset path (the problems are generated: it would be silently ignored).
    """
    if dataset_path:
        raise ValueError(f"train_dataset.path / valid_dataset.path ({dataset_path!r}) is not used by "
                         f"{ENV_ID} (its problems are generated: econfig.task/tasks/task_config/level/"
                         f"train_seed/test_seed); leave it null, or pick a data-backed env (--config-name "
                         f"grpo_gsm8k)")
    s = section
    kw = {"split": split, "task_config": dict(s["task_config"] or {}), "level": s["level"],
          "train_seed": int(s["train_seed"]), "test_seed": int(s["test_seed"]), "train_size": int(s["train_size"]),
          "test_size": int(s["test_size"])}
    if s["tasks"]:
        kw["tasks"] = dict(s["tasks"])
    else:
        kw["task"] = s["task"] or "chain_sum"
    if s["system_prompt"]:
        kw["system_prompt"] = s["system_prompt"]
    return ENV_ID, kw


def check_data(section: dict, datasets) -> dict[str, str]:
    """Build both splits (a bad task name or config key fails here, listing the valid ones); each source names the
    tasks, split, generator seed and number of problems.

    Raises:
        ValueError: a bad task, config key or level (:func:`envs.reasoning_gym.data.resolve_spec`), or a dataset path.
    """
    from envs.reasoning_gym.env import ReasoningGymEnv

    out = {}
    for name, (split, path) in datasets.items():
        _, kw = make_kwargs(section, split, path, {})
        env = ReasoningGymEnv(**kw)
        out[name] = (f"reasoning_gym {sorted(env.spec_tasks.configs())} split={split} generator seed="
                     f"{kw['train_seed'] if split == 'train' else kw['test_seed']} problems={env.num_tasks}")
    return out


FAMILY = register_family(EnvFamily(
    name="reasoning_gym", ids={ENV_ID: "envs.reasoning_gym.env:ReasoningGymEnv"},
    config={"task": None, "tasks": None, "task_config": None, "level": None, "train_seed": 11, "test_seed": 22,
            "train_size": 1000, "test_size": 200, "system_prompt": None},
    make_kwargs=make_kwargs, check_data=check_data))
