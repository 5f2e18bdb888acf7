"""axe-core, the accessibility checker the browser tests run in the waiting page.

Downloaded once from the npm registry into ``.cache/`` (gitignored; another
directory with ``$XDG_CACHE_HOME``), its tarball checked against the sha512
integrity the registry published for this version (pinned here, so neither a
changed tarball nor a changed registry answer goes unnoticed), and kept as the
one file the page needs, ``axe.min.js``.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import io
import os
import tarfile
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VERSION = "4.14.1"
TARBALL = f"https://registry.npmjs.org/axe-core/-/axe-core-{VERSION}.tgz"
# The registry's dist.integrity for this version (GET https://registry.npmjs.org/axe-core/4.14.1).
INTEGRITY = (
    "sha512-"
    "FHfa+lmNjQZfJz1q8wKqIDwC6DExcHt/pkjNQb09a3NPjCKg2rhu5qb2S4r76ASyFNNtuFooJpZe37OgudVGtQ=="
)
# What the page must satisfy: WCAG 2.1 A and AA (2.0's rules are part of 2.1).
WCAG_21_AA = ("wcag2a", "wcag2aa", "wcag21a", "wcag21aa")


def _cache_dir() -> Path:
    """Where the script is kept between sessions."""
    base = os.environ.get("XDG_CACHE_HOME")
    return Path(base) / "flashsale-gateway" if base else REPO / ".cache"


@functools.cache
def axe_source() -> str:
    """axe-core's ``axe.min.js``: from the cache, or downloaded and checked first.

    Raises AssertionError when the tarball is not the one the registry published."""
    kept = _cache_dir() / f"axe-core-{VERSION}.min.js"
    if kept.exists():
        return kept.read_text()
    with urllib.request.urlopen(TARBALL, timeout=60) as resp:
        tarball: bytes = resp.read()
    digest = "sha512-" + base64.b64encode(hashlib.sha512(tarball).digest()).decode()
    assert digest == INTEGRITY, f"{TARBALL} is not the published tarball: {digest}"
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as archive:
        member = archive.extractfile("package/axe.min.js")
        assert member is not None
        source = member.read().decode()
    kept.parent.mkdir(parents=True, exist_ok=True)
    partial = kept.with_suffix(".part")
    partial.write_text(source)
    partial.replace(kept)  # whole or absent, should two sessions download at once
    return source
