"""The one writer of every file the package saves: a file, or a folder of files, replaced whole or not at all.

``write_file(path, content)``: a temporary file beside ``path`` (same directory, so the same filesystem) is
written, flushed and fsynced, renamed over ``path`` (``os.replace``, atomic within a filesystem), and the
directory is fsynced so that the rename itself survives a power cut.

``write_folder(folder, fill)``: ``fill(temporary)`` writes the files into a temporary folder beside ``folder``;
every file in it, and the folder, are fsynced; then the temporary folder is swapped into place. POSIX has no
rename that replaces a non-empty folder, so the swap is two renames, under an flock of the parent directory
(concurrent saves of one folder take turns)::

    1. remove the aside ``.<name>.pfb-old`` if ``folder`` exists (an older copy; never read while ``folder`` exists)
    2. rename ``folder`` -> ``.<name>.pfb-old``               (only if ``folder`` exists)
    3. rename the temporary folder -> ``folder``
    4. fsync the parent directory, then remove ``.<name>.pfb-old``

A process killed between 2 and 3 leaves no ``folder`` but a complete ``.<name>.pfb-old`` (the previous save).
``readable_folder(folder)`` returns that aside in this case, so every loader goes through it. The invariant that
makes the aside trustworthy: an aside is only ever deleted (step 1 or 4) while ``folder`` exists, so whenever
``folder`` is missing, an aside that exists is whole. The next save puts its folder in place and then removes the
aside. (A pointer file naming the live folder would avoid the missing-folder moment, but changes the layout every
reader of ``folder`` sees; Linux's ``renameat2(RENAME_EXCHANGE)`` would too, but only on some filesystems.)

Temporary files and folders are named ``.<name>.<host>.<pid>.<token>.pfb-tmp``, so a later save can tell a killed
writer's leftover (its pid is gone) from a live writer's, and removes the former. docs/checkpoints.md states the
guarantee once for the whole package.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import shutil
import socket
import stat
from typing import BinaryIO, Callable, Iterator, Union

try:  # the folder swap's lock; Windows has no fcntl (and one process per checkpoint folder is the usual case)
    import fcntl
except ImportError:  # pragma: no cover - not Linux or macOS
    fcntl = None  # type: ignore[assignment]

#: Suffix of the temporary files and folders a save writes next to its target.
TEMP_SUFFIX = ".pfb-tmp"
#: Suffix of the previous folder while ``write_folder`` swaps the new one in (``.<name>.pfb-old``).
ASIDE_SUFFIX = ".pfb-old"

PathLike = Union[str, "os.PathLike[str]"]
Content = Union[bytes, bytearray, memoryview, Callable[[BinaryIO], None]]


def _temp_prefix(name: str) -> str:
    if len(name.encode()) <= 120:
        return f".{name}."
    # A long target name is shortened (and told apart by a hash) so the temporary name stays under NAME_MAX (255).
    return f".{name.encode()[:80].decode(errors='ignore')}~{hashlib.sha256(name.encode()).hexdigest()[:12]}."


def temp_path(directory: str, name: str) -> str:
    """A fresh temporary name for target ``name`` in ``directory``."""
    # host and pid in the name let a later save tell a killed writer's leftover from a live writer's file.
    return os.path.join(
        directory, f"{_temp_prefix(name)}{socket.gethostname()}.{os.getpid()}.{secrets.token_hex(4)}{TEMP_SUFFIX}"
    )


def aside_path(folder: PathLike) -> str:
    """Where ``write_folder`` keeps the previous ``folder`` while it swaps the new one in."""
    directory, name = os.path.split(os.path.abspath(os.fspath(folder)))
    return os.path.join(directory, f"{_temp_prefix(name)}{ASIDE_SUFFIX[1:]}")


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def orphaned_temp_files(path: PathLike) -> list[str]:
    """Returns the temporary files (and folders) of ``path`` left by saves killed on this host (their process is
    gone)."""
    target = os.path.abspath(os.fspath(path))
    directory, name = os.path.split(target)
    prefix, host, found = _temp_prefix(name), socket.gethostname(), []
    with os.scandir(directory) as entries:
        for entry in entries:
            if not (entry.name.startswith(prefix) and entry.name.endswith(TEMP_SUFFIX)):
                continue
            parts = entry.name[len(prefix) : -len(TEMP_SUFFIX)].rsplit(".", 2)
            if len(parts) != 3 or parts[0] != host or not parts[1].isdigit():
                continue
            pid = int(parts[1])
            if pid != os.getpid() and not _process_alive(pid):
                found.append(entry.path)
    return sorted(found)


def _remove(path: str) -> None:
    """Removes a file or a folder tree; a missing one is fine."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _remove_orphans(target: str) -> None:
    for orphan in orphaned_temp_files(target):
        with contextlib.suppress(OSError):
            _remove(orphan)


def fsync_directory(directory: str) -> None:
    """Makes the renames and creations in ``directory`` durable (a no-op where a directory cannot be fsynced)."""
    if os.name == "nt":  # Windows cannot open a directory to fsync it; NTFS journals the rename itself
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:  # some filesystems (certain FUSE and network mounts) cannot fsync a directory
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def make_directories(directory: PathLike, fsync: bool = True) -> None:
    """``os.makedirs(directory, exist_ok=True)``, and each folder it creates made durable in its parent (else a
    power cut could lose a new folder together with the checkpoint saved into it)."""
    missing, current = [], os.path.abspath(os.fspath(directory))
    while not os.path.isdir(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):  # made meanwhile by another writer: as good
            os.mkdir(folder)
        if fsync:
            fsync_directory(os.path.dirname(folder))


def write_file(path: PathLike, content: Content, fsync: bool = True) -> None:
    """Replaces ``path`` with ``content`` (bytes, or a function writing to a binary file) atomically.

    A reader sees the old file or the new one, never a mix, whatever moment the writer dies. If anything fails
    before the rename, the temporary file is removed and ``path`` is untouched. An existing file's permission bits
    are kept. After a successful save, temporary files of ``path`` left by killed saves on this host are removed.
    ``fsync=False`` skips the fsyncs: the file then survives the death of the writing process (the rename is still
    atomic) but not the machine's, for a caller that rewrites it many times a second.
    """
    target = os.path.abspath(os.fspath(path))
    directory, name = os.path.split(target)
    temp = temp_path(directory, name)
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            with contextlib.suppress(FileNotFoundError):  # keep an existing file's permissions
                os.chmod(f.fileno(), stat.S_IMODE(os.stat(target).st_mode))
            if callable(content):
                content(f)
            else:
                f.write(content)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    if fsync:
        fsync_directory(directory)  # makes the rename itself durable
    _remove_orphans(target)


def _fsync_tree(folder: str) -> None:
    """fsyncs every file and folder under ``folder`` (and ``folder``): all of it is on disk before the swap."""
    for here, _dirs, files in os.walk(folder):
        for name in files:
            fd = os.open(os.path.join(here, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_directory(here)


@contextlib.contextmanager
def _parent_locked(directory: str) -> Iterator[None]:
    """Holds an exclusive flock on ``directory`` itself (no lock file to leave behind) where the OS offers one."""
    if fcntl is None:
        yield
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:  # some network filesystems refuse flock on a directory: go on unlocked
            if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF, errno.ENOLCK):
                raise
        yield
    finally:
        os.close(fd)  # releases the lock


def write_folder(folder: PathLike, fill: Callable[[str], None], fsync: bool = True) -> None:
    """Replaces ``folder`` with what ``fill(temporary_folder)`` writes, as one unit (this module's docstring).

    ``fill`` writes plain files (no fsync needed: they are all fsynced here before the swap). If ``fill`` or the
    swap fails, the temporary folder is removed and ``folder`` is untouched. Read the result through
    ``readable_folder``, which also finds the previous save when a writer was killed in the middle of the swap.
    """
    target = os.path.abspath(os.fspath(folder))
    parent, name = os.path.split(target)
    temp = temp_path(parent, name)
    os.mkdir(temp)
    try:
        fill(temp)
        if fsync:
            _fsync_tree(temp)
        _swap_in(temp, target, fsync)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    _remove_orphans(target)


def _swap_in(temp: str, target: str, fsync: bool) -> None:
    parent = os.path.dirname(target)
    aside = aside_path(target)
    with _parent_locked(parent):
        if os.path.lexists(target):
            # The aside, if any, is older than target; it must go first, since a rename cannot replace a non-empty
            # folder. Deleting it while target exists keeps the invariant: a missing target's aside is whole.
            _remove(aside)
            os.rename(target, aside)
        # else: target is missing; an aside present is the last whole save (a writer killed between the renames)
        # and stays until the new folder is in place.
        os.rename(temp, target)
        if fsync:
            fsync_directory(parent)
        _remove(aside)


def readable_folder(folder: PathLike) -> str:
    """The folder a loader should read for ``folder``: itself, or, when a save was killed between its two renames
    (``folder`` missing), the previous save kept aside. A path that does not exist is returned as given, so the
    loader's own FileNotFoundError names it."""
    path = os.fspath(folder)
    if os.path.lexists(path):
        return path
    aside = aside_path(path)
    return aside if os.path.isdir(aside) else path
