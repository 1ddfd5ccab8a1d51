"""eosink's version, read from the installed distribution: ``pyproject.toml`` is its one source."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    VERSION = version("eosink")
except PackageNotFoundError:  # imported from a checkout that was never installed
    VERSION = "0+unknown"
