"""The digit-sum family's declaration (:mod:`envs.families`): id ``DigitSum-v0``, its config keys (``min_digits`` /
``max_digits`` under ``econfig.params``; the splits' seeds and sizes and ``system_prompt`` are schema keys), kwargs and
data check. Loaded on its own by :func:`envs.families.discover`; the env module loads only when :func:`check_data` or
the env runs."""
from __future__ import annotations

from envs.families import EnvFamily, register_family

ENV_ID = "DigitSum-v0"


def make_kwargs(section: dict, split: str, dataset_path: str | None, runtime) -> tuple[str, dict]:
    """``DigitSum-v0``'s kwargs: ``split``, the digit range, the splits' seeds and sizes, ``system_prompt`` when set.

    Raises:
        ValueError: a dataset path (the problems are generated: it would be silently ignored).
    """
    if dataset_path:
        raise ValueError(f"train_dataset.path / valid_dataset.path ({dataset_path!r}) is not used by {ENV_ID} (its "
                         f"problems are generated from econfig.train_seed/test_seed); leave it null")
    kw = {"split": split, **{k: int(section[k]) for k in ("min_digits", "max_digits", "train_seed", "test_seed",
                                                          "train_size", "test_size")}}
    if section["system_prompt"]:
        kw["system_prompt"] = section["system_prompt"]
    return ENV_ID, kw


def check_data(section: dict, datasets) -> dict[str, str]:
    """Generate both splits (a bad digit range or size fails here); each source names the split, seed and size.

    Raises:
        ValueError: bad digits / sizes (:func:`envs.digit_sum.env.generate_numbers`), or a dataset path.
    """
    from envs.digit_sum.env import DigitSumEnv

    out = {}
    for name, (split, path) in datasets.items():
        _, kw = make_kwargs(section, split, path, {})
        env = DigitSumEnv(**kw)
        out[name] = (f"digit_sum {kw['min_digits']}-{kw['max_digits']} digits split={split} generator seed="
                     f"{kw['train_seed'] if split == 'train' else kw['test_seed']} problems={env.num_tasks}")
    return out


FAMILY = register_family(EnvFamily(
    name="digit_sum", ids={ENV_ID: "envs.digit_sum.env:DigitSumEnv"},
    config={"min_digits": 2, "max_digits": 4, "train_seed": 11, "test_seed": 22, "train_size": 1000,
            "test_size": 200, "system_prompt": None},
    make_kwargs=make_kwargs, check_data=check_data))
