"""How this rank's process ends, recorded by the rank itself as a ``rank_ends`` record.

A crashed job is diagnosed by telling the rank that failed first from the ranks the
launcher tore down afterwards. So each rank records its own end, with what it had in
flight:

- a clean ``close()``: reason ``finished``;
- an uncaught exception (``sys.excepthook``): reason ``exception`` with its type and
  message (``KeyboardInterrupt``: reason ``signal``, SIGINT);
- ``SIGTERM`` (torchrun's elastic agent stops the surviving workers with it, then
  SIGKILL): reason ``signal``. Python runs signal handlers only on the main thread, between
  bytecodes, and a rank blocked in a C++ collective would not get there; so the C-level
  handler's wakeup byte (``signal.set_wakeup_fd``) is read by a watcher thread, which
  writes the record, in-flight ops (``end_ns`` 0) and a last progress snapshot, closes the
  spool, and re-raises SIGTERM with the default action: the process dies as it would
  have, a few milliseconds later, with the same exit status;
- interpreter exit without ``close()`` (``atexit``): reason ``exit``.

A process killed outright (SIGKILL, ``os._exit``, a segfault, the OOM killer) records
nothing: its records stop, which is itself the signature the analyzer looks for. For
those, ``faulthandler`` (enabled here if the script has not enabled it) writes the Python
stacks of a fatal signal (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL) to
``crash-rank<rank>-<pid>.txt`` beside the rank's spool file.

The handlers are installed only where nothing else claimed them: a script's own SIGTERM
handler or wakeup fd is left alone (then only ``atexit`` and the excepthook record).
"""

from __future__ import annotations

import atexit
import ctypes
import faulthandler
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any


def crash_stack_path(spool_file: str, rank: int) -> str:
    """Where ``faulthandler`` writes this process's stacks on a fatal signal."""
    return os.path.join(os.path.dirname(spool_file), f"crash-rank{rank:05d}-{os.getpid()}.txt")


class ExitRecorder:
    """Installs the end-of-process recorders described in the module docstring.

    ``end(reason, code, detail)`` is the hooks' callback that writes the ``rank_ends``
    record and closes the spool (safe to call from any thread, once; later calls do
    nothing). ``install()`` returns the undo function.
    """

    def __init__(self, end: Callable[[str, int, str], None], crash_file: str | None = None) -> None:
        self._end = end
        self._crash_file = crash_file
        self._once = threading.Lock()
        self._done = False
        self._written = threading.Event()
        self._undo: list[Callable[[], None]] = []
        self._pipe: tuple[int, int] | None = None
        self._fh_undo: Callable[[], None] | None = None

    def end(self, reason: str, code: int = -1, detail: str = "", wait_s: float = 10.0) -> bool:
        """Record the end once; True if this call recorded it. A later call (the SIGTERM
        watcher and the main thread's handler both get there) waits up to ``wait_s`` for
        the first to finish writing, so neither kills the process under the other."""
        with self._once:
            first, self._done = not self._done, True
        if not first:
            self._written.wait(wait_s)
            return False
        try:
            self._end(reason, code, detail)
        except Exception:  # a dying process must still die
            pass
        finally:
            self._written.set()
        return True

    # ------------------------------------------------------------------ install
    def install(self) -> Callable[[], None]:
        """Install the recorders; returns the function that removes them."""
        atexit.register(self._at_exit)
        self._undo.append(lambda: atexit.unregister(self._at_exit))
        self._install_excepthook()
        if threading.current_thread() is threading.main_thread():
            self._install_sigterm()
        self._install_faulthandler()

        def undo() -> None:
            for fn in reversed(self._undo):
                try:
                    fn()
                except Exception:
                    pass
            self._undo.clear()

        return undo

    def _at_exit(self) -> None:
        self.end("exit", -1, "interpreter exit without hooks.close()")
        if self._fh_undo is not None:  # past the script: an empty crash file goes
            self._fh_undo()

    def _install_excepthook(self) -> None:
        previous = sys.excepthook

        def hook(exc_type, exc, tb) -> None:
            if issubclass(exc_type, KeyboardInterrupt):
                self.end("signal", int(signal.SIGINT), "SIGINT (KeyboardInterrupt)")
            else:
                self.end("exception", -1, f"{exc_type.__name__}: {exc}"[:2000])
            previous(exc_type, exc, tb)

        sys.excepthook = hook

        def undo() -> None:
            if sys.excepthook is hook:
                sys.excepthook = previous

        self._undo.append(undo)

    def _install_sigterm(self) -> None:
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return  # the script (or its launcher library) handles SIGTERM itself
        r, w = os.pipe()
        os.set_blocking(w, False)
        try:
            old_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except (ValueError, OSError):
            os.close(r)
            os.close(w)
            return
        if old_fd != -1:  # someone else (asyncio) owns the wakeup fd: give it back
            signal.set_wakeup_fd(old_fd)
            os.close(r)
            os.close(w)
            return
        self._pipe = (r, w)
        signal.signal(signal.SIGTERM, self._on_sigterm_main)
        threading.Thread(target=self._watch, args=(r,), name="ranksight-exit", daemon=True).start()

        def undo() -> None:
            if signal.getsignal(signal.SIGTERM) is self._on_sigterm_main:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.set_wakeup_fd(-1)
            os.close(w)  # the watcher's read returns 0 bytes and it stops

        self._undo.append(undo)

    def _install_faulthandler(self) -> None:
        if self._crash_file is None or faulthandler.is_enabled():
            return
        try:
            f = open(self._crash_file, "w")  # noqa: SIM115 - kept open for a fatal signal
            faulthandler.enable(file=f, all_threads=True)
        except (OSError, ValueError, RuntimeError):
            return

        def undo() -> None:
            if self._fh_undo is None:
                return
            self._fh_undo = None
            faulthandler.disable()
            f.close()
            try:  # nothing was written: no crash, no file
                if os.path.getsize(self._crash_file) == 0:
                    os.unlink(self._crash_file)
            except OSError:
                pass

        self._fh_undo = undo
        self._undo.append(undo)

    # ------------------------------------------------------------------ SIGTERM
    def _on_sigterm_main(self, signum: int, frame: Any) -> None:
        """The Python-level handler (main thread, when it gets there first)."""
        self._die(signum)

    def _watch(self, fd: int) -> None:
        """The watcher thread: wakes on the C handler's byte, whatever the main thread does."""
        while True:
            try:
                data = os.read(fd, 64)
            except OSError:
                return
            if not data:
                return
            if int(signal.SIGTERM) in data:
                self._die(int(signal.SIGTERM))
                return

    def _die(self, signum: int) -> None:
        self.end("signal", signum, signal.Signals(signum).name)
        _reraise_default(signum)


def _reraise_default(signum: int) -> None:
    """Die of ``signum`` with its default action (the exit status the launcher expects).
    ``signal.signal`` works only on the main thread, so libc's is called directly; if that
    fails, exit with 128 + signum as a shell would report it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal(ctypes.c_int(signum), ctypes.c_void_p(0))  # SIG_DFL
        os.kill(os.getpid(), signum)
        time.sleep(5)  # delivery is asynchronous
    except Exception:
        pass
    os._exit(128 + signum)
