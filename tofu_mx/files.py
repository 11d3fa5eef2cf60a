"""Files written atomically: a reader sees the old file or the new one, never half of one."""
from __future__ import annotations

import os
import tempfile
from typing import Callable


def atomic_write(path: str, write: Callable[[str], None]) -> None:
    """Call ``write(tmp_path)`` on a temporary file in ``path``'s folder, then rename it over
    ``path``. The file gets the permissions ``open(path, "w")`` would give it (the umask
    applied), not ``mkstemp``'s 0600. On any error the temporary file is removed and
    ``path`` is left as it was."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{os.path.basename(path)}.", dir=folder)
    os.close(fd)
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def atomic_write_bytes(path: str, data: bytes) -> None:
    """:func:`atomic_write` of ``data``."""
    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            f.write(data)
    atomic_write(path, write)
