"""Specifies refdec.atomic.atomic_write: a reader sees the old file or the whole new one; errors
name the target (not the temporary); a special file (FIFO, device, directory) is never replaced;
a replaced file keeps its mode (and its owner, where the process may set it)."""

from __future__ import annotations

import pytest


def test_atomic_write_names_the_target_and_never_replaces_a_special_file(tmp_path):
    import os
    import stat

    from refdec.atomic import atomic_write

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="pipe: it exists and is not a regular file"):
        atomic_write(fifo, [b"x"])
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)  # still the FIFO (a rename would have replaced it)
    with pytest.raises(FileNotFoundError, match=r"cannot write .*missing/i.refdec: No such file") as info:
        atomic_write(tmp_path / "missing" / "i.refdec", [b"x"])
    assert ".tmp-" not in str(info.value)
    link = tmp_path / "link"
    (tmp_path / "target").write_bytes(b"old")
    link.symlink_to(tmp_path / "target")
    atomic_write(link, [b"new"])  # a link to a regular file is replaced, as before
    assert link.read_bytes() == b"new"


@pytest.mark.parametrize("mode", [0o755, 0o444, 0o600, 0o4755])
def test_a_replaced_file_keeps_its_mode_and_a_new_file_gets_a_new_files(tmp_path, mode):
    import os
    import stat

    from refdec.atomic import atomic_write

    path = tmp_path / "script"
    path.write_bytes(b"old")
    os.chmod(path, mode)
    atomic_write(path, [b"new"])
    assert path.read_bytes() == b"new" and stat.S_IMODE(os.stat(path).st_mode) == mode
    link = tmp_path / "link"
    link.symlink_to(path)
    atomic_write(link, [b"newer"])  # the link becomes a file with its target's mode
    assert not link.is_symlink() and stat.S_IMODE(os.stat(link).st_mode) == mode
    umask = os.umask(0o022)
    try:
        atomic_write(tmp_path / "fresh", [b"x"])
    finally:
        os.umask(umask)
    assert stat.S_IMODE(os.stat(tmp_path / "fresh").st_mode) == 0o644


def test_a_replaced_file_keeps_its_owner_where_the_process_may_set_it(tmp_path):
    import os

    from refdec.atomic import atomic_write

    path = tmp_path / "owned"
    path.write_bytes(b"old")
    try:
        os.chown(path, 4321, 4322)
    except PermissionError:
        # not root: the file stays this user's, its mode kept all the same
        os.chmod(path, 0o750)
        atomic_write(path, [b"new"])
        assert (os.stat(path).st_uid, os.stat(path).st_mode & 0o777) == (os.getuid(), 0o750)
        return
    os.chmod(path, 0o640)
    atomic_write(path, [b"new"])
    st = os.stat(path)
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (4321, 4322, 0o640) and path.read_bytes() == b"new"
