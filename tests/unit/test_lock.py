"""requirements.lock is pyproject.toml's resolution, so every install gets the same versions.

Every requirement of pyproject.toml, of every extra, is pinned in the lock at a
version its specifier allows, and the lock pins nothing pyproject.toml no longer
reaches. Either failing means pyproject.toml changed without ``make lock``.
"""

from __future__ import annotations

import tomllib
from collections import deque
from importlib import metadata
from pathlib import Path
from typing import cast

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import NormalizedName, canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements.lock"
STALE = "requirements.lock is stale: run make lock"
# The lock is for Python 3.11 on this platform; uv reads "3.11" as its first
# release. This interpreter's markers count too, so a requirement either holds
# is reached.
HERE = cast(dict[str, str], default_environment())
ENVIRONMENTS = ({**HERE, "python_version": "3.11", "python_full_version": "3.11.0"}, HERE)


def _locked() -> dict[NormalizedName, Version]:
    """The lock's pins: name -> version."""
    pins: dict[NormalizedName, Version] = {}
    for line in LOCK.read_text().splitlines():
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        pin = Requirement(text)
        [spec] = pin.specifier
        assert spec.operator == "==", f"not a pin: {line}"
        pins[canonicalize_name(pin.name)] = Version(spec.version)
    return pins


def _required() -> list[Requirement]:
    """pyproject.toml's requirements, of the package and of every extra."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"].values()
    return [Requirement(r) for r in [*project["dependencies"], *(r for e in extras for r in e)]]


def _applies(requirement: Requirement, extras: set[str]) -> bool:
    """Whether ``requirement`` holds for a package installed with ``extras``."""
    marker = requirement.marker
    return marker is None or any(
        marker.evaluate({**env, "extra": extra}) for env in ENVIRONMENTS for extra in {"", *extras}
    )


def _reached() -> set[NormalizedName]:
    """Every package pyproject.toml's requirements lead to, through the installed
    packages' own requirements (a package this interpreter has no copy of, its
    markers false here, ends its branch)."""
    extras: dict[NormalizedName, set[str]] = {}
    todo = deque(_required())
    while todo:
        requirement = todo.popleft()
        name = canonicalize_name(requirement.name)
        known = extras.get(name)
        if known is not None and requirement.extras <= known:
            continue
        wanted = extras.setdefault(name, set())
        wanted |= requirement.extras
        try:
            requires = metadata.distribution(name).requires or []
        except metadata.PackageNotFoundError:
            continue
        todo.extend(r for r in map(Requirement, requires) if _applies(r, wanted))
    return set(extras)


def test_every_requirement_is_pinned_at_a_version_it_allows() -> None:
    """Each requirement of pyproject.toml, every extra's included, is in the lock,
    at a version that satisfies its specifier."""
    locked = _locked()
    wrong = []
    for requirement in _required():
        pinned = locked.get(canonicalize_name(requirement.name))
        if pinned is None or not requirement.specifier.contains(pinned, prereleases=True):
            wrong.append(f"{requirement} (locked: {pinned})")
    assert not wrong, f"{STALE}: {wrong}"


def test_the_lock_pins_only_what_pyproject_reaches() -> None:
    """No package stays pinned after pyproject.toml stopped needing it."""
    unreached = sorted(set(_locked()) - _reached())
    assert not unreached, f"{STALE}: {unreached}"
