"""The files the search tools see under a folder, as llama-server lists them: inside a git work tree
git's own list, `git ls-files --cached --others --exclude-standard` (tracked files, and untracked ones no
ignore rule covers: every .gitignore, .git/info/exclude, core.excludesFile); outside one, a walk of the
folder that honours the .gitignore files on its way with git's rules (pathspec's: a deeper file's rule
wins, `!` re-includes, an ignored folder is not entered) and lists the JUNK folders without entering
them (llama-server's rule: they can be enormous).

Entries come in the walk's order (a folder's folders, its files, then each folder's own), to `max_depth`
levels when it is set. In git's list a folder is one that holds listed files (git tracks no empty
folder). Either way, with the tools confined (server/builtin_tools/workdir.py), a file whose real path
leaves the working directory (a symlink pointing out) is left out; and the listing stops after
WALK_BUDGET_S (`truncated`). git runs with core.fsmonitor off, so a repository's config names no command
that listing it would run, and without the server's GIT_* variables, so the folder's own repository is
the one asked.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from pathspec import GitIgnoreSpec

from server.builtin_tools.workdir import Workdir

JUNK = frozenset(
    {".git", ".svn", ".hg", "node_modules", "__pycache__", ".venv", "venv", "dist", "build", "target",
     ".cache", ".idea", ".vscode"}
)  # fmt: skip
WALK_BUDGET_S = 15.0
GIT_LS_FILES = (
    "git", "-c", "core.fsmonitor=false", "ls-files", "-z", "--cached", "--others", "--exclude-standard",
)  # fmt: skip


@dataclass
class Listing:
    """One listing's entries (path relative to `base`, is a folder) and whether it stopped early."""

    wd: Workdir
    base: Path
    max_depth: int = 0
    truncated: bool = False

    def entries(self) -> Iterator[tuple[str, bool]]:
        files = self._git_files()
        if files is None:
            yield from self._walk()
            return
        inside = [rel for rel in files if self._listed(self.base / rel)]
        yield from walk_order(inside, self.max_depth)

    # -- inside a git work tree ------------------------------------------------------------------------
    def _git_files(self) -> list[str] | None:
        """git's list of the files under `base`, or None outside a work tree (or without git)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
        try:
            done = subprocess.run(
                GIT_LS_FILES, cwd=self.base, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                timeout=WALK_BUDGET_S, check=False,
            )  # fmt: skip
        except FileNotFoundError:
            return None
        except subprocess.TimeoutExpired as exc:
            self.truncated = True
            return _paths(exc.output or b"")[:-1]  # the last one may be cut off
        return _paths(done.stdout) if done.returncode == 0 else None

    def _listed(self, path: Path) -> bool:
        """A file git names that is there (a deleted tracked file is not) and stays inside."""
        return path.is_file() and self._inside(path)

    # -- outside one -------------------------------------------------------------------------------------
    def _walk(self) -> Iterator[tuple[str, bool]]:
        deadline = time.monotonic() + WALK_BUDGET_S
        rules = {self.base: Ignores.above(self.wd, self.base)}
        for folder, dirs, files in os.walk(self.base, onerror=self._unreadable):
            here = Path(folder)
            depth = len(here.relative_to(self.base).parts) + 1
            if time.monotonic() > deadline:
                self.truncated = True
                return
            ignores = rules.pop(here).read(self.wd, here)
            kept = sorted(d for d in dirs if not ignores.ignored(self.wd, here / d, True))
            for name in kept:
                yield (here / name).relative_to(self.base).as_posix(), True
            # Pruned in place: os.walk then skips them (a symlinked folder is never entered anyway). A JUNK
            # folder is listed (a page may pick it as a working directory) but never entered.
            walked = [d for d in kept if d not in JUNK]
            dirs[:] = [] if self.max_depth and depth >= self.max_depth else walked
            rules.update((here / d, ignores) for d in dirs)
            for name in sorted(files):
                path = here / name
                if self._inside(path) and not ignores.ignored(self.wd, path, False):
                    yield path.relative_to(self.base).as_posix(), False

    def _inside(self, path: Path) -> bool:
        return not path.is_symlink() or self.wd.allows(path.resolve())

    def _unreadable(self, _: OSError) -> None:
        self.truncated = True


@dataclass(frozen=True)
class Ignores:
    """The .gitignore files that apply in a folder, outermost first: (their folder, their rules)."""

    files: tuple[tuple[Path, GitIgnoreSpec], ...] = field(default=())

    @classmethod
    def above(cls, wd: Workdir, base: Path) -> Ignores:
        """Those of the folders from the working directory's root down to `base`'s parent."""
        ignores = cls()
        for folder in reversed(base.parents):
            if wd.contains(folder):
                ignores = ignores.read(wd, folder)
        return ignores

    def read(self, wd: Workdir, folder: Path) -> Ignores:
        """These and `folder`'s own .gitignore, if it has one (inside the working directory)."""
        path = folder / ".gitignore"
        try:
            if not path.is_file() or not wd.allows(path.resolve()):
                return self
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            return self
        return Ignores((*self.files, (folder, GitIgnoreSpec.from_lines(lines))))

    def ignored(self, wd: Workdir, path: Path, is_dir: bool) -> bool:
        """git's verdict: the deepest file whose rules match `path` decides (a `!` rule un-ignores)."""
        for folder, spec in reversed(self.files):
            rel = path.relative_to(folder).as_posix() + ("/" if is_dir else "")
            verdict = spec.check_file(rel).include
            if verdict is not None:
                return verdict
        return False


def _paths(output: bytes) -> list[str]:
    """ls-files -z's paths, once each; an untracked nested repository (`sub/`) is not a file."""
    names = (p for p in output.decode(errors="surrogateescape").split("\0") if p and not p.endswith("/"))
    return list(dict.fromkeys(names))


def walk_order(files: Iterable[str], max_depth: int = 0) -> Iterator[tuple[str, bool]]:
    """Files (relative paths) and the folders holding them, in the walk's order, to `max_depth` levels."""
    tree: dict[str, tuple[set[str], list[str]]] = {}
    for rel in files:
        head, _, name = rel.rpartition("/")
        tree.setdefault(head, (set(), []))[1].append(name)
        while head:
            parent, _, folder = head.rpartition("/")
            tree.setdefault(parent, (set(), []))[0].add(folder)
            head = parent

    def visit(folder: str, depth: int) -> Iterator[tuple[str, bool]]:
        dirs, names = tree.get(folder, (set(), []))
        prefix = f"{folder}/" if folder else ""
        yield from ((prefix + d, True) for d in sorted(dirs))
        yield from ((prefix + n, False) for n in sorted(names))
        if not max_depth or depth < max_depth:
            for d in sorted(dirs):
                yield from visit(prefix + d, depth + 1)

    return visit("", 1)
