"""The dashboard's static files (one stylesheet, one script), shipped inside the package and
read once: the dashboard needs no network and no front-end build."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources

FILES = {"dashboard.css": "text/css", "dashboard.js": "text/javascript"}


@dataclass(frozen=True)
class Asset:
    body: bytes
    mimetype: str
    etag: str


class Assets:
    def __init__(self) -> None:
        root = resources.files("postjob_sa.web") / "assets"
        self._files = {
            name: Asset(body, mimetype, hashlib.sha1(body).hexdigest()[:16])
            for name, mimetype in FILES.items()
            for body in [(root / name).read_bytes()]
        }

    def get(self, name: str) -> Asset | None:
        return self._files.get(name)

    def version(self, name: str) -> str:
        """A fingerprint for the asset's URL, so a new release is fetched at once."""
        return self._files[name].etag[:8]
