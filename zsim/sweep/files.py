"""Writing a sweep's folder: cache entries one by one, the outputs as one set, one sweep at a time.

- `write_text`: one file (a cache entry, a point's result.json), written to a temporary name and
  renamed into place, mode 0644 as `zsim run`'s files; a kill leaves the old file or the new one.
- `OutputSwap`: the outputs of one sweep (sweep.csv, sweep.jsonl, sweep.json, the plots) are written
  into a fresh folder `.sets/<id>/`, then published by renaming one symlink, `.current -> .sets/<id>`
  (rename(2) is atomic). `sweep.csv` and its siblings are symlinks `sweep.csv -> .current/sweep.csv`,
  so a reader, and a kill at any moment (SIGKILL included), sees the old set or the new one, never a mix.
- `sweep_lock`: an exclusive `flock` on `.lock` in the folder for the whole sweep; a second sweep into
  the same folder is refused at once (it would rewrite the same outputs and cache).
- A full disk or an unwritable folder is a ZsimError naming the file (zsim.report.outputs._explain).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from zsim.errors import ZsimError, printable
from zsim.report.outputs import _explain, signals_held, temp_name

SETS = ".sets"
CURRENT = ".current"
LOCK = ".lock"


def write_text(path: Path, text: str) -> Path:
    """Write `text` to `path` through a temporary name and a rename (mode 0644 under the usual umask).
    No fsync: a cache entry lost to a crash of the machine reads back damaged and is rerun
    (zsim.sweep.cache). Raises ZsimError naming `path` when the disk is full or the folder unwritable."""
    tmp = temp_name(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as exc:
        raise _explain(exc, path) from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()  # gone after the rename; left only when something failed
    return path


def drop_temporaries(folder: Path) -> int:
    """Remove what writes killed between their write and their rename left under `folder/cache` and
    `folder/points` (`write_text`'s `.<name>.tmp-<pid>-<hex><suffix>` files); returns how many. Call it only
    while holding the folder's lock: no other sweep can be writing there then."""
    gone = 0
    for sub in ("cache", "points"):
        for path in (folder / sub).rglob(".*.tmp-*") if (folder / sub).is_dir() else ():
            with contextlib.suppress(OSError):
                path.unlink()
                gone += 1
    return gone


@contextlib.contextmanager
def sweep_lock(folder: Path) -> Iterator[None]:
    """Hold `folder/.lock` exclusively for the block.

    Raises:
        ZsimError: another sweep holds it (naming the folder and what to do), or it cannot be created.
    """
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as exc:
        raise _explain(exc, folder / LOCK) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ZsimError(f"{printable(str(folder))}: another zsim sweep is writing this folder; wait for it "
                            "to finish or give this one another -o") from None
        yield
    finally:
        os.close(fd)  # releases the lock


class OutputSwap:
    """One sweep's outputs, written into a fresh folder and published together.

        swap = OutputSwap(out)
        swap.write("sweep.csv", text)      # into .sets/<id>/sweep.csv
        path = swap.path("x.png")          # a writer's own path inside the set
        swap.publish()                     # .current -> .sets/<id>; links out/<name> -> .current/<name>

    Until `publish`, the folder shows the previous set. `discard` removes an unpublished set.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.id = f"{os.getpid()}-{os.urandom(6).hex()}"
        self.dir = folder / SETS / self.id
        try:
            self.dir.mkdir(parents=True, mode=0o755)
        except OSError as exc:
            raise _explain(exc, self.dir) from None
        self.names: list[str] = []
        self.published = False

    def path(self, name: str) -> Path:
        """Where the file `name` of this set is written (it is published as `folder/name`)."""
        if name not in self.names:
            self.names.append(name)
        return self.dir / name

    def write(self, name: str, text: str) -> Path:
        """Write `name` into the set. Returns its published path. Raises ZsimError naming the file."""
        path = self.path(name)
        try:
            path.write_text(text)
        except OSError as exc:
            raise _explain(exc, self.folder / name) from None
        return self.folder / name

    def publish(self) -> None:
        """Make this set the folder's current one (one atomic rename), then point `folder/<name>` at it
        and remove links to files this set no longer has and older sets.

        Raises:
            ZsimError: a full disk or an unwritable folder (the previous set stays current).
        """
        try:
            for name in self.names:  # durable before they become visible
                fd = os.open(self.dir / name, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            link = temp_name(self.folder / CURRENT)
            os.symlink(f"{SETS}/{self.id}", link)
            with signals_held():
                os.replace(link, self.folder / CURRENT)  # the moment the new set becomes the outputs
                self.published = True
            for name in self.names:
                self._link(name)
        except OSError as exc:
            raise _explain(exc, self.folder / CURRENT) from None
        self._tidy()

    def _link(self, name: str) -> None:
        """`folder/name -> .current/name` (an old regular file of that name is replaced by the link)."""
        final, target = self.folder / name, f"{CURRENT}/{name}"
        if final.is_symlink() and os.readlink(final) == target:
            return
        if final.is_dir() and not final.is_symlink():
            raise ZsimError(f"{printable(str(final))}: is a folder; the sweep writes a file there")
        tmp = temp_name(final)
        os.symlink(target, tmp)
        os.replace(tmp, final)

    def _tidy(self) -> None:
        """Remove links to names the current set lacks, and every set but the current one."""
        for entry in self.folder.iterdir():
            if entry.is_symlink() and entry.name != CURRENT and os.readlink(entry).startswith(f"{CURRENT}/") \
                    and entry.name not in self.names:
                entry.unlink(missing_ok=True)
        for old in (self.folder / SETS).iterdir():
            if old.name != self.id:
                shutil.rmtree(old, ignore_errors=True)

    def discard(self) -> None:
        """Remove this set, unless it was published (then it is the folder's outputs)."""
        if not self.published:
            shutil.rmtree(self.dir, ignore_errors=True)
