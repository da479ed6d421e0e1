"""Shipper processes: the node agent's inserts run in child processes of their own.

Reading the spool and sealing batches (``agent/agent.py``'s read loop) and sending them
(clickhouse-driver's client-side encoding) each take about a core at a million records
a second; in one process they share one interpreter lock. So for a store another process
can open (``Store.reopen_spec``: a ClickHouse server) each shipper thread of
:meth:`Agent.run` hands its batches to a child process of its own, a
:class:`ShipperProcess`, which reads the sealed batch from the disk buffer (uncompressed
Arrow IPC is memory-mapped, not copied), delivers it (``agent/deliver.py``: the same
pieces, ids and checks) and answers with the rows inserted. Everything else stays in the
agent: which batch is next (oldest first), the ``attempted`` marker (durable before the
batch is handed over), removing a batch once it is stored, retries, counters.

A shipper process that dies (killed, out of memory) is a failed send: the batch stays
buffered, marked attempted, and is retried (by a new process) with the check against the
store first, exactly as after an agent crash mid-insert: its connection ends with a reset
(``SO_LINGER`` 0), so an insert the server had not received whole never starts, and one
it had is waited for (``system.processes``) and counted. A shipper process ends when the
agent closes its pipe, and is killed (``PR_SET_PDEATHSIG``) if the agent dies; one idle
for ``idle_s`` exits and is started again when a batch comes.

Protocol (JSON lines): the agent writes ``{"store": spec, "folder": batches folder}``
once (the child answers ``{"ready": pid}``), then ``{"seq", "verify", "settle_s"}`` per batch; the child answers each with
``{"seq", "inserted", "already_stored", "partial"}`` or ``{"seq", "error", "kind"}``
(``kind`` ``store``: a StoreError, retried; ``unreadable``: the batch files are damaged).
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import sys
import time
from typing import IO

from ranksight.store import StoreError

from . import heap
from .deliver import Delivered

log = logging.getLogger("ranksight.agent")

_PR_SET_PDEATHSIG = 1
_RELEASE_AFTER_S = 1.0
"""A shipper process with no batch for this long gives its free heap back (seconds)."""
_CHILD = "import sys; from ranksight.agent.shipper import main; sys.exit(main(sys.argv[1:]))"


class BatchUnreadable(Exception):
    """The shipper process could not read a buffered batch (its files are damaged)."""


class ShipperProcess:
    """One child process that delivers buffered batches to the store ``spec`` names.

    ``spec``: ``Store.reopen_spec()``; ``folder``: the disk buffer's ``batches`` folder.
    Started by :meth:`start` or on first use (:meth:`deliver`), again after it died; not
    thread-safe (one shipper thread owns it). ``idle_s``: :meth:`close_if_idle` ends it after that long
    without a batch.
    """

    def __init__(self, spec: dict, folder: str, idle_s: float = 30.0) -> None:
        self.spec, self.folder, self.idle_s = spec, str(folder), idle_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0
        """Processes started so far (restarts after a death included)."""
        self.ready = False
        """Whether a child runs and has said it is ready."""
        self._last_used = time.monotonic()

    @property
    def pid(self) -> int | None:
        """The running child's pid (None if none runs)."""
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def start(self) -> None:
        """Start the child (if none runs) and wait until it is ready: imports done, store
        opened (not yet connected). Raises StoreError if it dies first."""
        if self.proc is not None and self.proc.poll() is None:
            return
        self._reap()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
        )
        self.started += 1
        self._last_used = time.monotonic()
        try:
            self._send({"store": self.spec, "folder": self.folder})
            line = self._pipes()[1].readline()
        except OSError:
            line = b""
        if not line:
            code = self._reap()
            raise StoreError(f"shipper process exited at start (exit status {code})")
        self.ready = True

    def _pipes(self) -> tuple[IO[bytes], IO[bytes]]:
        """The child's stdin and stdout. Raises OSError when no child runs (a dead child,
        to the callers)."""
        proc = self.proc
        if proc is None or proc.stdin is None or proc.stdout is None:
            raise OSError("no shipper process runs")
        return proc.stdin, proc.stdout

    def _send(self, message: dict) -> None:
        stdin = self._pipes()[0]
        stdin.write((json.dumps(message) + "\n").encode())
        stdin.flush()

    def deliver(self, seq: int, verify: bool, settle_s: float) -> Delivered:
        """Have the child deliver batch ``seq`` (``verify``: check each piece against the
        store first, see ``deliver.deliver``). Raises StoreError if the store failed or
        the child died (then it is reaped and the next call starts a new one),
        BatchUnreadable if the batch's files are damaged."""
        self.start()
        self._last_used = time.monotonic()
        try:
            self._send({"seq": seq, "verify": verify, "settle_s": settle_s})
            line = self._pipes()[1].readline()
        except (BrokenPipeError, OSError):
            line = b""
        if not line:
            code = self._reap()
            raise StoreError(f"shipper process died (exit status {code}) sending batch {seq}")
        answer = json.loads(line)
        self._last_used = time.monotonic()
        if answer.get("seq") != seq:  # never expected: a confused child is replaced
            self.close()
            raise StoreError(f"shipper process answered {answer!r:.200} for batch {seq}")
        if "error" in answer:
            if answer["kind"] == "unreadable":
                raise BatchUnreadable(answer["error"])
            raise StoreError(answer["error"])
        return Delivered(answer["inserted"], answer["already_stored"], answer["partial"])

    def close_if_idle(self) -> None:
        """End the child if it has had no batch for ``idle_s`` (it costs memory)."""
        if self.proc is not None and time.monotonic() - self._last_used > self.idle_s:
            self.close()

    def close(self, timeout: float = 10.0) -> None:
        """End the child: close its pipe (it exits after the batch in hand), kill it if it
        has not within ``timeout`` seconds. Safe to call twice."""
        if self.proc is None:
            return
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._reap()

    def _reap(self) -> int | None:
        """Wait for a dead (or killed) child and drop it; its exit status."""
        if self.proc is None:
            return None
        proc, self.proc, self.ready = self.proc, None, False
        if proc.poll() is None:
            proc.kill()
        code = proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            try:
                if pipe is not None:
                    pipe.close()
            except OSError:
                pass
        return code


def _die_with(parent: int) -> None:
    """Get SIGKILL when the agent dies (Linux), and exit now if it already has."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(0)


def main(argv: list[str]) -> int:
    """The child's loop (see the module doc); ``argv``: the agent's pid."""
    _die_with(int(argv[0]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the agent decides when this ends
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s ranksight agent shipper %(levelname)s %(message)s",
    )
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # nothing else may write into the answer pipe
    requests = sys.stdin.buffer
    from ranksight.store.clickhouse_store import reopen

    from .buffer import read_batch
    from .deliver import deliver

    first = requests.readline()
    if not first:
        return 0
    setup = json.loads(first)
    store, folder = reopen(setup["store"]), setup["folder"]
    answers.write((json.dumps({"ready": os.getpid()}) + "\n").encode())
    answers.flush()
    heap.keep()  # the next batch reuses this one's memory (agent/heap.py)
    try:
        while True:
            # One request at a time: after an answer nothing is buffered, so select sees all.
            if not select.select([requests], [], [], _RELEASE_AFTER_S)[0]:
                heap.release()  # no batch for a moment: give the memory back
            line = requests.readline()
            if not line:
                break
            request = json.loads(line)
            seq = request["seq"]
            try:
                batch = read_batch(folder, seq)
            except (OSError, ValueError) as exc:
                answer = {"seq": seq, "error": f"{type(exc).__name__}: {exc}", "kind": "unreadable"}
            else:
                try:
                    done = deliver(
                        store, batch, verify=request["verify"], settle_s=request["settle_s"]
                    )
                    answer = {
                        "seq": seq,
                        "inserted": done.inserted,
                        "already_stored": done.already_stored,
                        "partial": done.partial,
                    }
                except StoreError as exc:
                    answer = {"seq": seq, "error": str(exc), "kind": "store"}
                except Exception as exc:  # noqa: BLE001 - said to the agent, which retries
                    log.exception("delivering batch %d failed", seq)
                    answer = {"seq": seq, "error": f"{type(exc).__name__}: {exc}", "kind": "store"}
                del batch  # unmap its files before the agent deletes them
            answers.write((json.dumps(answer) + "\n").encode())
            answers.flush()
    finally:
        store.close()
    return 0
