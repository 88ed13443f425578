"""Where specgen keeps what it derives (converted GGUFs, measured costs): never the HF cache."""

from __future__ import annotations

import os
from pathlib import Path


def specgen_home() -> Path:
    env = os.environ.get("SPECGEN_HOME")
    return Path(env) if env else Path.home() / ".cache" / "specgen"
