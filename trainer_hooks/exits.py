"""How this rank's process ends, recorded by the rank itself as a ``rank_ends`` record.

A crashed job is diagnosed by telling the rank that failed first from the ranks the
launcher tore down afterwards. So each rank records its own end, with what it had in
flight:

- a clean ``close()``: reason ``finished``;
- an uncaught exception (``sys.excepthook``): reason ``exception`` with its type and
  message (``KeyboardInterrupt``: reason ``signal``, SIGINT);
- ``SIGTERM`` with no handler of the script's (torchrun's elastic agent stops the
  surviving workers with it, then SIGKILL): reason ``signal``. Python runs signal handlers
  only on the main thread, between bytecodes, and a rank blocked in a C++ collective would
  not get there; so the hooks stand in for the default action with a handler of their
  own, and a watcher thread reads the C-level handler's wakeup byte
  (``signal.set_wakeup_fd``): if that stand-in is still the handler in force, it writes
  the record, in-flight ops (``end_ns`` 0) and a last progress snapshot, closes the
  spool, and re-raises SIGTERM with the default action: the process dies as it would
  have, a few milliseconds later, with the same exit status (143 from a shell);
- ``SIGTERM`` or ``SIGINT`` while any other handler is in force (the script's, installed
  before or after ``attach()``, or Python's ``KeyboardInterrupt``): the handler in force
  decides, exactly as without the hooks (checkpoint and go on, ``sys.exit``, chain to
  the handler it replaced...); the hooks only note the arrival (a ``rank_ends`` record,
  reason ``signal``, once per signal; the spool stays open) and then record whatever
  end follows. A signal set to ``SIG_IGN`` never reaches the process: nothing is noted;
- interpreter exit without ``close()`` (``atexit``): reason ``exit``.

A process killed outright (SIGKILL, ``os._exit``, a segfault, the OOM killer) records
nothing: its records stop, which is itself the signature the analyzer looks for. For
those, ``faulthandler`` (enabled here if the script has not enabled it) writes the Python
stacks of a fatal signal (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL) to
``crash-rank<rank>-<pid>.txt`` beside the rank's spool file.

Nothing the script set is replaced: the SIGTERM stand-in is installed only where SIGTERM
has the default action, the wakeup fd only where none is set (else only ``atexit`` and the
excepthook record, and the stand-in when the main thread runs it), and ``close()`` leaves
a wakeup fd the script set since (asyncio's) in place. A script that takes the wakeup fd
later (an asyncio loop's signal handlers) gets every byte from then on: a rank then
blocked in C++ records a SIGTERM only if the main thread gets back to Python.
"""

from __future__ import annotations

import atexit
import ctypes
import faulthandler
import os
import select
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
    nothing); ``note(reason, code, detail)`` writes a ``rank_ends`` record and leaves the
    spool open (a signal the script handles). ``install()`` returns the undo function.
    """

    def __init__(
        self,
        end: Callable[[str, int, str], None],
        crash_file: str | None = None,
        note: Callable[[str, int, str], None] | None = None,
    ) -> None:
        self._end = end
        self._note = note or (lambda reason, code, detail: None)
        self._noted: set[int] = set()
        self._arrivals = threading.RLock()
        self._default_term = self._on_sigterm_main  # one object: compared with `is`
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
        self.take_arrivals()  # a signal that came before is recorded before this end
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
            self._install_signals()
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

    def _install_signals(self) -> None:
        """The wakeup pipe and its watcher (where the wakeup fd is free), and the
        stand-in for SIGTERM's default action (where SIGTERM has none of the script's)."""
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, self._default_term)
            self._undo.append(self._restore_sigterm)
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        try:
            old_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except (ValueError, OSError):
            old_fd = None
        if old_fd != -1:  # someone else (asyncio) owns the wakeup fd: give it back
            if old_fd is not None:
                signal.set_wakeup_fd(old_fd)
            os.close(r)
            os.close(w)
            return
        self._pipe = (r, w)
        threading.Thread(target=self._watch, args=(r,), name="ranksight-exit", daemon=True).start()
        self._undo.append(self._remove_pipe)

    def _restore_sigterm(self) -> None:
        if signal.getsignal(signal.SIGTERM) is self._default_term:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)

    def _remove_pipe(self) -> None:
        """Take the signals that came, stop using the wakeup fd (a script's own, set since,
        stays: asyncio's), and close the pipe; the watcher then stops."""
        if self._pipe is None:
            return
        self.take_arrivals()
        r, w = self._pipe
        current = signal.set_wakeup_fd(-1)  # ValueError off the main thread: pipe kept
        if current != w:
            signal.set_wakeup_fd(current)  # the script's, with Python's default warning
        self._pipe = None
        os.close(w)  # the watcher's read returns 0 bytes and it stops

    def _install_faulthandler(self) -> None:
        crash_file = self._crash_file
        if crash_file is None or faulthandler.is_enabled():
            return
        try:
            f = open(crash_file, "w")  # noqa: SIM115 - kept open for a fatal signal
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
                if os.path.getsize(crash_file) == 0:
                    os.unlink(crash_file)
            except OSError:
                pass

        self._fh_undo = undo
        self._undo.append(undo)

    # ------------------------------------------------------------------ signals
    def _on_sigterm_main(self, signum: int, frame: Any) -> None:
        """The Python-level stand-in for SIGTERM's default action (main thread, when it
        gets there before the watcher): record the end, then die of the signal."""
        self._die(signum)

    def _watch(self, fd: int) -> None:
        """The watcher thread: wakes on the C handler's byte, whatever the main thread does."""
        try:
            while True:
                select.select([fd], [], [])
                if not self.take_arrivals(fd):
                    return
        except (OSError, ValueError):
            return
        finally:
            os.close(fd)

    def take_arrivals(self, fd: int | None = None) -> bool:
        """Act on the signal bytes waiting in the wakeup pipe (see :meth:`_arrived`);
        False once its write end is closed. Called by the watcher, and by every end
        before it is recorded, so a signal is recorded before what the script did next."""
        fd = fd if fd is not None else (self._pipe[0] if self._pipe else None)
        if fd is None:
            return False
        with self._arrivals:
            try:
                data = os.read(fd, 512)
            except BlockingIOError:
                return True
            except OSError:
                return False
            for signum in dict.fromkeys(data):  # each signal once, in order
                if signum in WATCHED:
                    self._arrived(signum)
            return bool(data)

    def _arrived(self, signum: int) -> None:
        """``signum`` came. Where the stand-in for SIGTERM's default action is in force,
        the process ends now (the main thread may be blocked in C++ and never run it);
        else the signal is noted once and the script's handler (or Python's SIGINT
        handler) decides, when the main thread gets to it."""
        handler = signal.getsignal(signum)
        if handler is self._default_term:
            self._die(signum)
            return
        if signum in self._noted or self._done:
            return
        self._noted.add(signum)
        name = signal.Signals(signum).name
        by = getattr(handler, "__name__", None) if callable(handler) else None
        detail = f"{name} (handled by the script's {by})" if by else f"{name} (ignored)"
        if handler is signal.default_int_handler:
            detail = f"{name} (KeyboardInterrupt)"
        try:
            self._note("signal", signum, detail)
        except Exception:  # noqa: BLE001 - a note must never change how the script goes on
            pass

    def _die(self, signum: int) -> None:
        self.end("signal", signum, signal.Signals(signum).name)
        _reraise_default(signum)


WATCHED = (int(signal.SIGTERM), int(signal.SIGINT))
"""Signals whose arrival is recorded: how launchers and people stop a job."""


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
