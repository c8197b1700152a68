"""Checks shared by the components' config readers (diffusers config.json dicts)."""

from __future__ import annotations

import warnings
from collections.abc import Collection, Mapping
from typing import Any


def check_supported(component: str, cfg: Mapping[str, Any], supported: Mapping[str, tuple]) -> None:
    """Refuse a config whose value for a key of `supported` is not among that key's allowed values.

    A missing key passes: each allowed tuple includes diffusers' default, which the reader assumes.
    """
    for key, allowed in supported.items():
        if key in cfg and cfg[key] not in allowed:
            raise ValueError(f"{component} config: unsupported {key}={cfg[key]!r} (supported: {allowed})")


def warn_unknown(component: str, cfg: Mapping[str, Any], known: Collection[str]) -> None:
    """Warn about keys that are neither known nor private ("_class_name", "_diffusers_version", ...)."""
    unknown = sorted(k for k in cfg if not k.startswith("_") and k not in known)
    if unknown:
        warnings.warn(f"{component} config: ignoring unknown keys {unknown}", stacklevel=2)
