"""Errors raised while resolving, fetching or loading a model spec (all subclass ``ValueError``)."""
from __future__ import annotations

__all__ = ["ModelResolutionError", "ModelNotCachedError", "ChecksumError"]


class ModelResolutionError(ValueError):
    """A spec could not be turned into a loadable model (unknown alias, bad path, hub failure)."""


class ModelNotCachedError(ModelResolutionError):
    """A packaged alias is not cached and could not be downloaded."""


class ChecksumError(ModelResolutionError):
    """A downloaded wheel or an extracted model file does not have the expected sha256."""
