"""Writing output files so that none is ever left half-written (issue 13).

- `check_dir` / `check_file`: is an output folder or file writable? Called *before* a simulation, so
  that a bad `-o` or `--json` costs nothing (ZsimError, exit 2).
- `write_atomic`: one file, written to a temporary name in the same folder and renamed into place
  (`os.replace` is atomic on POSIX): a reader sees the old complete file or the new complete one.
- `OutputSet`: several files that belong together (a run's result.json, trace.json, memory.csv, ...),
  written to temporary names and renamed into place together, under a lock on the folder and with
  SIGINT/SIGTERM held back during the renames: a second run into the same folder waits, and Ctrl-C
  leaves either the old complete set or the new complete set.
- A full disk or a folder that turns read-only is a ZsimError naming the file; the old outputs stay.

Temporary names start with '.' and contain '.tmp-' (`.result.json.tmp-<pid>-<hex>.json`); a run killed
by SIGKILL may leave one behind, never a truncated file under the real name.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from zsim.errors import ZsimError, printable

LOCK_WAIT_S = 120.0  # how long a second writer waits for the folder before giving up


def _explain(exc: OSError, path: Path) -> ZsimError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return ZsimError(f"{printable(str(path))}: no space left on the device; earlier outputs are unchanged")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return ZsimError(f"{printable(str(path))}: not writable ({exc.strerror})")
    return ZsimError(f"{printable(str(path))}: cannot write ({exc.strerror or exc})")


def check_dir(path: str | Path, *, flag: str = "-o") -> Path:
    """`path` as an output folder: an existing writable folder, or one that can be created (its first
    existing ancestor is a writable folder). Creates nothing.

    Raises:
        ZsimError: `path` is a file, lies under a file, or cannot be written (naming `flag`).
    """
    if not str(path).strip():
        raise ZsimError(f"{flag} '': expected a folder name")
    path = Path(path)
    where = printable(str(path))
    if path.exists() and not path.is_dir():
        raise ZsimError(f"{flag} {where}: is a file, not a folder")
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise ZsimError(f"{flag} {where}: {printable(str(probe))} is a file, so no folder can be made under it")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ZsimError(f"{flag} {where}: {printable(str(probe))} is not writable")
    return path


def check_file(path: str | Path, *, flag: str = "--json") -> Path:
    """`path` as an output file: not a folder, in an existing writable folder (as a shell redirect).

    Raises:
        ZsimError: naming `flag` and what is wrong.
    """
    if not str(path).strip():
        raise ZsimError(f"{flag} '': expected a file name")
    where = printable(str(path))
    if str(path).endswith(os.sep) or Path(path).is_dir():
        raise ZsimError(f"{flag} {where}: is a folder, expected a file name")
    path = Path(path)
    parent = path.parent
    if not parent.exists():
        raise ZsimError(f"{flag} {where}: no folder {printable(str(parent))}")
    if not parent.is_dir():
        raise ZsimError(f"{flag} {where}: {printable(str(parent))} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ZsimError(f"{flag} {where}: not writable")
    return path


def temp_name(path: Path) -> Path:
    """A fresh temporary name beside `path`, keeping its suffix (matplotlib picks the format by it)."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{os.urandom(4).hex()}{path.suffix}")


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | Path, content: str | bytes | Callable[[Path], object]) -> Path:
    """Write `content` (text, bytes, or a function that writes the file at the path it is given) to
    `path` through a temporary file and a rename. Returns `path`.

    Raises:
        ZsimError: the disk is full or the folder not writable; `path` is then unchanged.
    """
    path = Path(path)
    fd = own_descriptor(path)
    if fd is not None:  # /dev/stdout of `>> log`: renaming over log would lose what it held (issue 28)
        return _write_descriptor(fd, path, content)
    if path.exists() and not path.is_file() and not path.is_dir():  # (both follow links)
        return _write_through(path, content)  # a FIFO or a device (/dev/tty): a rename would replace it
    if path.is_symlink():  # write the file the link points at, and keep the link
        path = path.resolve()
    tmp = temp_name(path)
    try:
        try:
            if callable(content):
                content(tmp)
            elif isinstance(content, bytes):
                tmp.write_bytes(content)
            else:
                tmp.write_text(content)
            _fsync(tmp)
            os.replace(tmp, path)
        except OSError as exc:
            raise _explain(exc, path) from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()  # gone after the rename; left only when something failed
    return path


# /dev/fd/N, /proc/self/fd/N, /proc/thread-self/fd/N, /proc/<pid>/fd/N: open descriptors (proc(5))
_FD_PATH = re.compile(r"^/(?:dev/fd|proc/(self|thread-self|\d+)/fd)/(\d+)$")
_STD_PATHS = {"/dev/stdin": 0, "/dev/stdout": 1, "/dev/stderr": 2}
_MAX_LINKS = 40  # symlinks followed before giving up, as Linux's MAXSYMLINKS (path_resolution(7))


def own_descriptor(path: Path) -> int | None:
    """The open file descriptor of this process that `path` names, following symlinks: `/dev/stdout`
    is 1 whatever it points at (a pipe, a terminal, or the file of `>> log`), `/dev/fd/3` is 3. None for
    any other path. Renaming over such a path would replace the file the shell opened (truncating an
    appended log), so it is written into instead (`write_atomic`)."""
    text = os.path.abspath(path)
    for _ in range(_MAX_LINKS):
        if text in _STD_PATHS:
            return _STD_PATHS[text]
        match = _FD_PATH.match(text)
        if match and match.group(1) in (None, "self", "thread-self", str(os.getpid())):
            return int(match.group(2))
        try:
            target = os.readlink(text)
        except OSError:  # not a link (or gone): an ordinary path
            return None
        text = os.path.normpath(os.path.join(os.path.dirname(text), target))
    return None


def _write_descriptor(fd: int, path: Path, content: str | bytes | Callable[[Path], object]) -> Path:
    """Write `content` to the open descriptor `fd` (named by `path`) at its current offset, as the shell
    set it up (appending after `>>`); Python's own buffer of that stream is flushed first, so the text
    before stays before."""
    if callable(content):  # a writer that wants a path: let it write a private file, then copy the bytes
        with tempfile.TemporaryDirectory(prefix="zsim-") as tmpdir:
            tmp = Path(tmpdir) / f"out{path.suffix}"
            content(tmp)
            data = tmp.read_bytes()
    else:
        data = content if isinstance(content, bytes) else content.encode()
    stream = {1: sys.stdout, 2: sys.stderr}.get(fd)
    try:
        if stream is not None:
            stream.flush()
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except OSError as exc:
        raise _explain(exc, path) from None
    return path


def _write_through(path: Path, content: str | bytes | Callable[[Path], object]) -> Path:
    """Write `content` to the existing non-regular file `path` (a FIFO, a character device) in place."""
    try:
        if callable(content):
            content(path)
        elif isinstance(content, bytes):
            with open(path, "wb") as fh:
                fh.write(content)
        else:
            with open(path, "w") as fh:
                fh.write(content)
    except OSError as exc:
        raise _explain(exc, path) from None
    return path


@contextlib.contextmanager
def folder_lock(folder: Path, *, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """Hold an exclusive lock on `folder` (flock on the folder itself: no lock file to leave behind).
    A second holder waits up to `wait_s` seconds, then gets a ZsimError."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise ZsimError(f"{printable(str(folder))}: another zsim run is writing this folder "
                                    f"(waited {wait_s:.0f} s)") from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # releases the lock


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM delivered only after the block (a few renames: microseconds)."""
    held = {signal.SIGINT, signal.SIGTERM}
    try:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    except (ValueError, OSError):  # not the main thread of a platform without masks: no hold
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class OutputSet:
    """Files of one output folder, committed together.

        outputs = OutputSet(folder)             # folder checked (check_dir) and created
        write_trace(result, outputs.stage("trace.json"))   # a writer writes the temporary path
        outputs.text("result.json", text)
        outputs.commit()                         # lock, rename all, unlock

    If `commit` is never reached (an error, Ctrl-C), `discard` (also run by the context manager)
    removes the temporary files and the folder keeps what it had.
    """

    def __init__(self, folder: str | Path, *, flag: str = "-o") -> None:
        self.folder = check_dir(folder, flag=flag)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _explain(exc, self.folder) from None
        self._staged: dict[Path, Path] = {}  # final -> temporary

    def stage(self, name: str) -> Path:
        """A temporary path to write the file `name` to (committed later under `folder/name`)."""
        final = self.folder / name
        tmp = self._staged.get(final) or temp_name(final)
        self._staged[final] = tmp
        return tmp

    def write(self, name: str, writer: Callable[[Path], object]) -> Path:
        """Run `writer(temporary path)`; a full disk becomes a ZsimError. Returns the final path."""
        tmp = self.stage(name)
        try:
            writer(tmp)
        except OSError as exc:
            raise _explain(exc, self.folder / name) from None
        return self.folder / name

    def text(self, name: str, text: str) -> Path:
        return self.write(name, lambda p: p.write_text(text))

    def commit(self, *, wait_s: float = LOCK_WAIT_S) -> list[Path]:
        """Rename every staged file into place, under the folder's lock, with Ctrl-C held back."""
        try:
            for tmp in self._staged.values():
                _fsync(tmp)
        except OSError as exc:
            raise _explain(exc, self.folder) from None
        with folder_lock(self.folder, wait_s=wait_s), signals_held():
            for final, tmp in self._staged.items():
                os.replace(tmp, final)
        done = list(self._staged)
        self._staged.clear()
        return done

    def discard(self) -> None:
        for tmp in self._staged.values():
            with contextlib.suppress(OSError):
                tmp.unlink()
        self._staged.clear()

    def __enter__(self) -> OutputSet:
        return self

    def __exit__(self, *exc_info) -> None:
        self.discard()
