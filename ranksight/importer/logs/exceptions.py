"""A rank's own Python exception: the first lines per rank that raise one
(``torch.OutOfMemoryError: CUDA out of memory``, ``RuntimeError: NCCL error in: ...``)
become ``exception`` events: ``op`` the exception type, ``detail.message`` its first 200
characters. Whether it caused the failure or followed it (``DistBackendError`` after a
timeout) the analyzer decides (``analyzer/log_evidence/crash.py``).

A rank's ``Traceback (most recent call last):`` (also cut: ``[rank2]: Traceback (most
recen``, vllm#10453) becomes one ``traceback`` event per rank: the rank raised something,
though its exception may be cut from the excerpt."""

from __future__ import annotations

import re

from .events import Event
from .lines import LogLine

_EXC = re.compile(
    r"^\s*(?:\w+\.)*(?P<type>[A-Z]\w*(?:Error|Exception|Interrupt))(?::\s*(?P<msg>.*))?$"
)
_OOM = re.compile(r"CUDA out of memory\.(?:.*?\bGPU (?P<gpu>\d+)\b)?")
"""PyTorch's CUDA allocator running out (``torch.cuda.OutOfMemoryError: CUDA out of
memory. Tried to allocate 564.00 MiB. GPU 1 has a total capacty of 22.20 GiB``, litgpt#303):
``detail.oom``, and the GPU index it names as ``detail.device`` (and as the local rank of a
line that says no rank, as NCCL's ``[N]`` is read)."""
_LOADER = re.compile(
    r"DataLoader worker \(pids? [^)]*\) (?:is killed by signal: (?P<sig>[\w ]+?)\.?\s*$|exited unexpectedly)"
)
"""A rank's data-loader worker died (``RuntimeError: DataLoader worker (pid 9382) is killed
by signal: Killed.``, Pai-Megatron-Patch#583; ``... exited unexpectedly``): ``detail
.data_loader``, and the signal's word where said."""
_TRACEBACK = "Traceback (most recent call last):"
MARKERS = ("Error", "Exception", "Interrupt", "Traceback (m")
MAX_PER_RANK = 4
"""Exception lines kept per rank (the first ones: the later are mostly the same again)."""


class Reader:
    """Exceptions of one file."""

    name = "exceptions"
    markers = MARKERS

    def __init__(self) -> None:
        self.seen: dict[int, int] = {}
        self.traced: set[int] = set()
        self.out: list[Event] = []

    def feed(self, line: LogLine) -> None:
        """Read an exception line, or a rank's first traceback head."""
        head = line.text.strip()
        if line.rank >= 0 and len(head) >= 11 and _TRACEBACK.startswith(head[:34]):
            if line.rank not in self.traced:
                self.traced.add(line.rank)
                self.out.append(Event("traceback", rank=line.rank, host=line.host,
                                      line=line.number, text=head))  # fmt: skip
            return
        m = _EXC.match(line.text)
        if not m or self.seen.get(line.rank, 0) >= MAX_PER_RANK:
            return
        self.seen[line.rank] = self.seen.get(line.rank, 0) + 1
        detail: dict = {"message": (m.group("msg") or "")[:200]}
        local = line.local_rank
        if loader := _LOADER.search(line.text):
            detail["data_loader"] = True
            if loader.group("sig"):
                detail["signal"] = loader.group("sig")
        if oom := _OOM.search(line.text):
            detail["oom"] = True
            if oom.group("gpu") is not None:
                detail["device"] = f"cuda:{oom.group('gpu')}"
                if line.rank < 0 and local < 0:  # its GPU index, as NCCL's [N]: a local rank
                    local = int(oom.group("gpu"))
        self.out.append(Event("exception", rank=line.rank, local_rank=local,
                              host=line.host, line=line.number, op=m.group("type"),
                              text=line.text, detail=detail))  # fmt: skip

    def finish(self) -> list[Event]:
        """The exceptions read."""
        return self.out
