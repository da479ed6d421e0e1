"""The folders the hooks create are the rank's owner's only (``0700``), whatever the umask.

The spool is the agent's local endpoint (``ranksight/ground/ownership.py``): another user who can list
it can read every record, and one who can write it can plant records. ``os.makedirs``
applies its mode to the last folder only, and through the umask, so each missing folder
is made here one by one and set to ``0700``. Folders that already exist are left as they
are (they are the user's or the agent's); a spool root writable by group or others gets
one warning from :func:`spool_root_problem`.
"""

from __future__ import annotations

import os
import stat

PRIVATE = 0o700


def make_private_dirs(path: str) -> list[str]:
    """Create ``path`` and its missing parents, each ``0700``; returns the folders this
    call created (outermost first). Raises OSError as ``os.mkdir`` does (a parent that is
    a file, no permission). A folder another process creates at the same moment is
    theirs: it is not changed."""
    missing = []
    folder = os.path.abspath(path)
    while not os.path.isdir(folder):
        missing.append(folder)
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    created = []
    for folder in reversed(missing):
        try:
            os.mkdir(folder, PRIVATE)
        except FileExistsError:
            if os.path.isdir(folder):
                continue
            raise
        os.chmod(folder, PRIVATE)  # mkdir's mode went through the umask
        created.append(folder)
    return created


def spool_root_problem(path: str) -> str | None:
    """Why an existing spool root ``path`` would expose the records, or None: owned by
    another user (the agent refuses it), or writable by group or others without the
    sticky bit. A root that does not exist yet is made ``0700``: None."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    if info.st_uid != os.getuid():
        return (f"spool folder {path} belongs to uid {info.st_uid}, not this process's uid "
                f"{os.getuid()}: the node agent refuses it, and its owner can read the records")  # fmt: skip
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o022 and not mode & stat.S_ISVTX:
        return (f"spool folder {path} is writable by group or others (mode {mode:o}): "
                "another user could plant or remove records; make it 0700 (chmod 700)")  # fmt: skip
    return None
