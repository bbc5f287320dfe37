"""Fetch the web UI's rendering libraries (markdown, sanitiser, highlighting, math, diagrams, PDF text) into
server/webui/assets/vendor/ from the npm registry, reproducibly: each package at the version pinned in
LIBS (`npm pack NAME@VERSION`, the published tarball, its sha512 integrity checked by npm), the files
taken exactly as published, and every file's sha256 checked against server/webui/assets/vendor/VERSIONS.json
(tests/test_webui.py checks the checked-in files against the same record).

Run: .venv/bin/python scripts/vendor_webui.py            fetch, verify against VERSIONS.json, copy in
     .venv/bin/python scripts/vendor_webui.py --check    fetch and verify only (vendor/ untouched)
     .venv/bin/python scripts/vendor_webui.py --record   after changing a version in LIBS: rewrite the
                                                         record from what was fetched, then copy in
Needs `npm` (Node); nothing is fetched at run time by the page itself."""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENDOR = ROOT / "server" / "webui" / "assets" / "vendor"
RECORD = VENDOR / "VERSIONS.json"

# folder under vendor/ -> (npm package, version, license, {file in the package (a glob for fonts): its
# path under the folder}). Only what the page loads: KaTeX's fonts as woff2 alone (every browser the UI
# supports reads it, so its CSS never falls back to the .woff/.ttf it also names).
LIBS: dict[str, tuple[str, str, str, dict[str, str]]] = {
    "marked": ("marked", "18.3.0", "MIT", {"lib/marked.esm.js": "marked.esm.js", "LICENSE": "LICENSE"}),
    "dompurify": (
        "dompurify",
        "3.5.0",
        "MPL-2.0 OR Apache-2.0",
        {"dist/purify.es.mjs": "purify.es.mjs", "LICENSE": "LICENSE"},
    ),
    "highlight.js": (
        "@highlightjs/cdn-assets",
        "11.12.0",
        "BSD-3-Clause",
        {"es/highlight.min.js": "highlight.min.js", "LICENSE": "LICENSE"},
    ),
    "katex": (
        "katex",
        "0.19.1",
        "MIT",
        {
            "dist/katex.min.js": "katex.min.js",
            "dist/katex.min.css": "katex.min.css",
            "dist/fonts/*.woff2": "fonts/",
            "LICENSE": "LICENSE",
        },
    ),
    "mermaid": ("mermaid", "11.12.2", "MIT", {"dist/mermaid.min.js": "mermaid.min.js", "LICENSE": "LICENSE"}),
    # pdf.js: the text of an attached PDF (loaded on the first PDF; its worker is a file of its own, which
    # the page's CSP allows as worker-src 'self')
    "pdfjs": (
        "pdfjs-dist",
        "6.5.438",
        "Apache-2.0",
        {
            "build/pdf.min.mjs": "pdf.min.mjs",
            "build/pdf.worker.min.mjs": "pdf.worker.min.mjs",
            "LICENSE": "LICENSE",
        },
    ),
}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fetch(package: str, version: str, into: Path) -> Path:
    """The package's published tarball, unpacked under `into`; returns its `package/` folder."""
    into.mkdir(parents=True)
    out = (
        subprocess.run(
            ["npm", "pack", f"{package}@{version}", "--silent", "--pack-destination", str(into)],
            check=True,
            capture_output=True,
            text=True,
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    with tarfile.open(into / out) as tar:
        tar.extractall(into / "unpacked", filter="data")
    return into / "unpacked" / "package"


def taken(package_dir: Path, files: dict[str, str]) -> dict[str, Path]:
    """Each file to vendor, by its path under the library's folder."""
    chosen: dict[str, Path] = {}
    for source, target in files.items():
        if target.endswith("/"):
            matches = sorted(package_dir.glob(source))
            if not matches:
                raise SystemExit(f"{source}: nothing in the package")
            chosen |= {target + m.name: m for m in matches}
        else:
            chosen[target] = package_dir / source
    return chosen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="fetch and verify only")
    mode.add_argument("--record", action="store_true", help="rewrite VERSIONS.json from what was fetched")
    args = parser.parse_args()
    record = json.loads(RECORD.read_text()) if RECORD.exists() else {}
    new_record: dict[str, dict[str, object]] = {}
    problems: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        staged: dict[str, dict[str, Path]] = {}
        for folder, (package, version, license_, files) in LIBS.items():
            package_dir = fetch(package, version, Path(tmp) / folder)
            chosen = taken(package_dir, files)
            sums = {name: sha256(path) for name, path in chosen.items()}
            new_record[folder] = {"package": package, "version": version, "license": license_, "files": sums}
            old = record.get(folder, {})
            if not args.record and (old.get("version") != version or old.get("files") != sums):
                problems.append(f"{folder}: {package}@{version} does not match VERSIONS.json")
            staged[folder] = chosen
        if problems:
            print("\n".join(problems), file=sys.stderr)
            return 1
        if args.check:
            print("every vendored file matches VERSIONS.json")
            return 0
        for folder, chosen in staged.items():
            shutil.rmtree(VENDOR / folder, ignore_errors=True)
            for name, path in chosen.items():
                (VENDOR / folder / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, VENDOR / folder / name)
    if args.record:
        RECORD.write_text(json.dumps(new_record, indent=2) + "\n")
    print(f"vendored {', '.join(f'{p}@{v}' for p, v, _, _ in LIBS.values())} into {VENDOR.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
