"""Fetch the pinned clients' sdists from PyPI (for the tests that ship only there), check their sha256,
unpack.

usage: python fetch_sdists.py DEST_DIR
Leaves DEST_DIR/<name>-<version>/ (the unpacked sdist). Already unpacked ones are kept. Standard library only.
`pip download --no-binary :all:` would build each sdist's metadata first, which needs the build backends, so
the files come straight from PyPI's JSON API instead.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tarfile
import urllib.parse
import urllib.request

# (project, version, sdist sha256 as PyPI lists it)
SDISTS = [
    ("stillwarm", "0.1.1", "7cb931cb1579eb5fed622d057eb490951d96e8a11044c70ec1fab07de55a51a0"),
]
INDEX = os.environ.get("LLSC_PYPI_JSON", "https://pypi.org/pypi")


def fetch(dest: str, project: str, version: str, sha256: str) -> str:
    meta_url = f"{INDEX}/{project}/json"
    with urllib.request.urlopen(meta_url, timeout=60) as r:
        meta = json.load(r)
    sdist = next(u for u in meta["releases"][version] if u["packagetype"] == "sdist")
    out_dir = os.path.join(dest, sdist["filename"][: -len(".tar.gz")])
    if os.path.isdir(out_dir):
        return out_dir
    url = urllib.parse.urljoin(meta_url, sdist["url"])
    with urllib.request.urlopen(url, timeout=120) as r:
        data = r.read()
    got = hashlib.sha256(data).hexdigest()
    if got != sha256:
        raise SystemExit(f"{sdist['filename']}: sha256 {got}, expected {sha256}")
    path = os.path.join(dest, sdist["filename"])
    with open(path, "wb") as f:
        f.write(data)
    with tarfile.open(path) as t:
        t.extractall(dest, filter="data")
    return out_dir


def main() -> int:
    dest = sys.argv[1]
    os.makedirs(dest, exist_ok=True)
    for project, version, sha in SDISTS:
        print(fetch(dest, project, version, sha))
    return 0


if __name__ == "__main__":
    sys.exit(main())
