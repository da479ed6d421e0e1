"""The owner rule: what a rank hands the agent is trusted only if this user alone could
have written it.

The agent's local endpoint is its spool folder: only the agent's own user may use it.

Ranks hand records to the agent by writing files under the spool folder; nothing
listens on a socket. The folder is made ``0700`` (owner only), so another user's process
can neither read the records nor plant its own; a folder owned by another user is
refused. Spool files owned by another user are skipped by the tailer, and Flight
Recorder dumps by the collector (:func:`untrusted_file`). Ground of the house: it imports
nothing of ranksight, so the hooks, the collectors and the agent all use this one rule.
"""

from __future__ import annotations

import os
import stat


def secure_spool_dir(path: str) -> None:
    """Create ``path`` if missing and make it ``0700``. Raises PermissionError naming it
    if it belongs to another user (its records could be forged or read)."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    info = os.stat(path)
    if info.st_uid != os.getuid():
        raise PermissionError(
            f"spool folder {path} belongs to uid {info.st_uid}, not this agent's uid "
            f"{os.getuid()}: refusing records another user could forge or read"
        )
    if stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(path, 0o700)


def untrusted_file(path: str) -> str:
    """Why the file at ``path``, which a rank of this agent's user should have written (a
    Flight Recorder dump), is not to be read, or "": the spool's owner rule for files. It
    must be a regular file (no link: one in ``/tmp`` may point anywhere), owned by this
    agent's uid, and writable by no one else (group or world: anyone could have written
    it). OSError reads as a reason too."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        return f"cannot stat it: {exc.strerror or exc}"
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file (a link, a FIFO or a device)"
    if info.st_uid != os.getuid():
        return f"owned by uid {info.st_uid}, not this agent's uid {os.getuid()}"
    if stat.S_IMODE(info.st_mode) & 0o022:
        return f"writable by others (mode {stat.S_IMODE(info.st_mode):o})"
    return ""
