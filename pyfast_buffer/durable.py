"""The one writer of every file the package saves: a file, or a folder of files, replaced whole or not at all.

``write_file(path, content)``: a temporary file beside ``path`` (same directory, so the same filesystem) is
written, flushed and fsynced, renamed over ``path`` (``os.replace``, atomic within a filesystem), and the
directory is fsynced so that the rename itself survives a power cut. Both writers create missing parent folders
(``make_directories``: each new folder fsynced into its parent), so every save of the package behaves alike.

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
aside. A loader that reads more than one file of ``folder`` reads them inside ``read_folder(folder)``: it holds a
shared flock of the same parent directory, so no swap runs between its reads (else it could pair a file of one
save with a file of the next). (A pointer file naming the live folder would avoid the missing-folder moment, but
changes the layout every reader of ``folder`` sees; Linux's ``renameat2(RENAME_EXCHANGE)`` would too, but only on
some filesystems.)

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
    power cut could lose a new folder together with the checkpoint saved into it). A part of the path that exists
    as a file raises NotADirectoryError naming it."""
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
        if not os.path.isdir(folder):
            raise NotADirectoryError(errno.ENOTDIR, "exists and is not a folder; cannot save below it", folder)
        if fsync:
            fsync_directory(os.path.dirname(folder))


def _file_target(path: PathLike) -> str:
    """``path`` made absolute, or ValueError for a path that names no file (empty, or ending in a separator)."""
    name = os.fspath(path)
    if not name:
        raise ValueError("cannot save to '': the path is empty; pass a file path, such as 'ckpt/buffer.pfb'")
    if name.endswith(os.sep) or (os.altsep is not None and name.endswith(os.altsep)):
        raise ValueError(
            f"cannot save to {name!r}: a path ending in {name[-1]!r} names a folder, not a file; pass a file path "
            f"inside it, such as {os.path.join(name, 'buffer.pfb')!r}"
        )
    target = os.path.abspath(name)
    if os.path.isdir(target) and not os.path.islink(target):  # a link is replaced by the file, as documented
        raise IsADirectoryError(errno.EISDIR, "is a folder; pass a file path inside it, or another file path", name)
    return target


def write_file(path: PathLike, content: Content, fsync: bool = True) -> None:
    """Replaces ``path`` with ``content`` (bytes, or a function writing to a binary file) atomically.

    A reader sees the old file or the new one, never a mix, whatever moment the writer dies. If anything fails
    before the rename, the temporary file is removed and ``path`` is untouched. An existing file's permission bits
    are kept. After a successful save, temporary files of ``path`` left by killed saves on this host are removed.
    ``fsync=False`` skips the fsyncs: the file then survives the death of the writing process (the rename is still
    atomic) but not the machine's, for a caller that rewrites it many times a second. Missing parent folders are
    created (``make_directories``). An empty path, or one ending in a separator, raises ValueError; a path that is
    a folder raises IsADirectoryError; both before anything is written.
    """
    target = _file_target(path)
    directory, name = os.path.split(target)
    make_directories(directory, fsync)
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
def _parent_locked(directory: str, shared: bool = False) -> Iterator[None]:
    """Holds an flock on ``directory`` itself (no lock file to leave behind) where the OS offers one: exclusive for
    a swap, shared for ``read_folder``'s readers (they exclude swaps, not each other)."""
    if fcntl is None:
        yield
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
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
    ``read_folder`` (or ``readable_folder`` for one file), which also finds the previous save when a writer was
    killed in the middle of the swap. Missing parent folders are created; an empty path raises ValueError, and so
    does a ``folder`` that exists as something other than a folder (a file is never replaced by a folder).
    """
    name = os.fspath(folder)
    if not name:
        raise ValueError("cannot save a folder to '': the path is empty; pass a folder path, such as 'ckpt/state'")
    target = os.path.abspath(name)
    _refuse_non_folder(target)
    parent, name = os.path.split(target)
    make_directories(parent, fsync)
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


def _refuse_non_folder(target: str) -> None:
    if os.path.lexists(target) and not os.path.isdir(target):
        raise ValueError(
            f"cannot save a folder to {target!r}: a file (not a folder) is there, and a folder save would delete it; "
            "move or remove that file, or save to another path"
        )


def _swap_in(temp: str, target: str, fsync: bool) -> None:
    parent = os.path.dirname(target)
    aside = aside_path(target)
    with _parent_locked(parent):
        _refuse_non_folder(target)  # again under the lock: a file may have appeared while fill ran
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


@contextlib.contextmanager
def read_folder(folder: PathLike) -> Iterator[str]:
    """``with read_folder(folder) as path:`` yields ``readable_folder(folder)`` and, until the block ends, holds a
    shared flock of the parent directory, the lock ``write_folder`` holds exclusive while it swaps a folder in. The
    files read inside the block are therefore all of one save, and the folder cannot vanish between the reads. Read
    the files inside the block and use them after it: a save of the same folder waits (only its swap does; it
    writes its files meanwhile). Where the OS or the filesystem offers no flock, nothing is locked. A missing
    parent is yielded as for ``readable_folder``, so the loader's own FileNotFoundError names the path."""
    parent = os.path.dirname(os.path.abspath(os.fspath(folder)))
    if not os.path.isdir(parent):
        yield readable_folder(folder)
        return
    with _parent_locked(parent, shared=True):
        yield readable_folder(folder)
