"""Writing into a host's upper directory before it boots: files, symlinks, and the directories above them with
the owner and mode of the machine's directories they hide."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path


def mirror_dirs(upper: Path, rel: Path) -> None:
    """Create upper/rel's parents with the owner and mode of the machine's dirs (an upper dir hides them)."""
    path = upper
    for part in rel.parent.parts:
        path = path / part
        lower = Path("/") / path.relative_to(upper)
        if path.is_dir():
            continue
        path.mkdir()
        if lower.is_dir():
            st = lower.stat()
            os.chown(path, st.st_uid, st.st_gid)
            os.chmod(path, stat.S_IMODE(st.st_mode))


def seed_file(upper: Path, rel: str, text: str, mode: int = 0o644, owner: tuple[int, int] = (0, 0)) -> None:
    target = upper / rel
    mirror_dirs(upper, Path(rel))
    target.write_text(text)
    os.chown(target, *owner)
    os.chmod(target, mode)


def seed_symlink(upper: Path, rel: str, dest: str) -> None:
    target = upper / rel
    mirror_dirs(upper, Path(rel))
    with contextlib.suppress(FileNotFoundError):
        target.unlink()
    target.symlink_to(dest)
