"""The GSM8K family's declaration (:mod:`envs.families`): id ``GSM8K-v1``, its config keys, kwargs and data check.
Loaded on its own by :func:`envs.families.discover`; the data module loads only when :func:`check_data` runs."""
from __future__ import annotations

from envs.families import EnvFamily, register_family

ENV_ID = "GSM8K-v1"


def make_kwargs(section: dict, split: str, dataset_path: str | None, runtime) -> tuple[str, dict]:
    """``GSM8K-v1``'s kwargs: ``split``, ``format_reward``, ``data_dir`` (a dataset path) and ``system_prompt``
    when set."""
    kw: dict = {"split": split, "format_reward": float(section["format_reward"])}
    if dataset_path:
        kw["data_dir"] = dataset_path
    if section["system_prompt"]:
        kw["system_prompt"] = section["system_prompt"]
    return ENV_ID, kw


def check_data(section: dict, datasets) -> dict[str, str]:
    """Parse both splits (cached, so the envs reuse them); their sources (:func:`envs.gsm8k.data.data_source`:
    the path, else ``$GSM8K_DATA_DIR``, else the packaged copy).

    Raises:
        FileNotFoundError: a data location that does not exist or lacks the split's file.
        ValueError: a malformed row, naming ``file:line`` (:func:`envs.gsm8k.data.load_gsm8k`).
    """
    from envs.gsm8k.data import data_source, load_gsm8k

    out = {}
    for name, (split, path) in datasets.items():
        load_gsm8k(split, path)
        out[name] = data_source(split, path)
    return out


FAMILY = register_family(EnvFamily(
    name="gsm8k", ids={ENV_ID: "envs.gsm8k.env:GSM8KEnv"},
    config={"format_reward": 0.0, "system_prompt": None}, make_kwargs=make_kwargs, check_data=check_data))
