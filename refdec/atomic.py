"""Atomic file writes: a reader of ``path`` sees the old file or the complete new one, never a part.

Every file refdec writes (index, calibration curves) goes
through :func:`atomic_write`: a temporary ``<path>.tmp-<pid>-<hex>`` in the same
folder, fsync, ``os.replace``, fsync of the folder. A file it replaces keeps its mode
(an executable script edited in place stays executable) and, where this process may
set them, its owner and group. Temporaries left by a killed writer of the same path
are removed once that process is gone and an hour has passed.
"""

from __future__ import annotations

import os
import secrets
import stat
import time
from typing import Iterable


def atomic_write(path, chunks: Iterable[bytes | memoryview]) -> None:
    """Write ``chunks`` (bytes-like, in order) to ``path`` atomically. An OSError names ``path``
    (not the temporary); an existing ``path`` that is not a regular file (a device such as
    /dev/null, a directory, a FIFO) is refused, as the rename would replace it. An existing
    ``path`` (or the file a link there points to) gives the new file its permission bits and,
    where this process may set them, its owner and group (:func:`_keep_metadata`); a new
    ``path`` gets a new file's mode (0o666 less the umask)."""
    path = os.fspath(path)
    if os.path.lexists(path) and not os.path.isfile(path):  # isfile follows a link to a regular file
        raise OSError(f"cannot write {path}: it exists and is not a regular file")
    old = os.stat(path) if os.path.exists(path) else None
    tmp = f"{path}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        with open(tmp, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            if old is not None:
                _keep_metadata(f.fileno(), old)
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_directory(path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise type(exc)(exc.errno, f"cannot write {path}: {exc.strerror or exc}") from exc
        raise
    _remove_stale_temporaries(path)


def _keep_metadata(fd: int, old: os.stat_result) -> None:
    """The replaced file's owner and group onto the new file at ``fd`` where this process may set
    them (a user may not give a file away: the new file stays theirs then), then its permission
    bits (after the owner: a change of owner clears the set-id bits)."""
    new = os.fstat(fd)
    if (new.st_uid, new.st_gid) != (old.st_uid, old.st_gid):
        try:
            os.fchown(fd, old.st_uid, old.st_gid)
        except PermissionError:
            try:  # the group alone: a user may give their file any group they are in
                os.fchown(fd, -1, old.st_gid)
            except PermissionError:
                pass
    os.fchmod(fd, stat.S_IMODE(old.st_mode))


_STALE_TMP_SECONDS = 3600


def _fsync_directory(path: str) -> None:
    """Makes a rename into ``path``'s folder durable (best effort: not every
    platform or filesystem can fsync a folder)."""
    try:
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove_stale_temporaries(path: str) -> None:
    """Removes ``<path>.tmp-<pid>-<hex>`` files that a killed save left behind:
    only when that process no longer exists here and the file has not been
    written for an hour (a save in progress, or one from another machine on a
    shared filesystem, is left alone)."""
    folder, name = os.path.split(os.path.abspath(path))
    prefix = name + ".tmp-"
    try:
        entries = os.listdir(folder)
    except OSError:
        return
    now = time.time()
    for entry in entries:
        if not entry.startswith(prefix):
            continue
        pid_text = entry[len(prefix):].split("-", 1)[0]
        if not pid_text.isdigit() or int(pid_text) == os.getpid():
            continue
        try:
            os.kill(int(pid_text), 0)
            continue  # still running
        except ProcessLookupError:
            pass
        except (PermissionError, OverflowError, OSError):
            continue  # exists (another user's), or not a pid
        full = os.path.join(folder, entry)
        try:
            if now - os.stat(full).st_mtime >= _STALE_TMP_SECONDS:
                os.unlink(full)
        except OSError:
            pass
