"""Specifies refdec.atomic.atomic_write: a reader sees the old file or the whole new one; errors
name the target (not the temporary); a special file (FIFO, device, directory) is never replaced."""

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
