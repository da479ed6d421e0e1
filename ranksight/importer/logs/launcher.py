"""pdsh and DeepSpeed's launcher: consoles of lines behind a ``host: `` prefix (pdsh runs
the launcher on every host and puts the host, an address or a name, before each line).

- DeepSpeed's ``deepspeed/launcher/launch.py``: when one of a host's workers exits with
  an error, its ``sigkill_handler`` kills the others, one line each, ``[launch.py:315:
  sigkill_handler] Killing subprocess 249`` (DeepSpeed#4510: eight on 192.169.83.120),
  and reports ``Process 249 exits with return code = -6``. One ``child_failed`` event per
  host, ``detail.source`` ``deepspeed_launcher``, ``detail.killed`` the pids it killed,
  ``code`` the first non-zero return code (-1 if none is in the lines): the failure
  began on that host; which local worker, and why, the lines do not say.
- the same launcher lines with no host prefix (one node's console) are that node's, its
  host unknown ("");
- a Python traceback behind a host prefix (``10.0.0.6:   File "...", line 1162, in
  _configure_optimizer``, ``10.0.0.7: Traceback (most recent call last):``): one
  ``traceback`` event per host, its rank unknown (azureml-assets#302: the same failure
  behind both hosts' prefixes, its exception line cut from the post).
"""

from __future__ import annotations

import re

from .events import Event
from .lines import LogLine

_HOST = re.compile(r"^(?P<host>\d{1,3}(?:\.\d{1,3}){3}|[A-Za-z][\w.-]*\w):\s")
_KILL = re.compile(r"sigkill_handler\]? Killing subprocess (?P<pid>\d+)")
_EXIT = re.compile(r"(?:Process (?P<pid>\d+) |\] )?exits with return code = (?P<code>-?\d+)")
_DEEPSPEED = re.compile(r"launch\.py:\d+:sigkill_handler")
"""DeepSpeed's launcher's own words: read with no host prefix too (one node's console:
DeepSpeed#4890's ``[launch.py:321:sigkill_handler [xxx] exits with return code = -9``,
its command redacted)."""
_TRACE = re.compile(r'^(?:Traceback \(most recent call last\)|\s+File "[^"]+", line \d+)')
MARKERS = ("Killing subprocess", "exits with return code", "Traceback (most recent", '  File "')
MAX_PIDS = 64
"""Killed pids kept per host."""


class Reader:
    """Launcher kills and tracebacks per host of one file."""

    name = "launcher"
    markers = MARKERS

    def __init__(self) -> None:
        self.killed: dict[str, dict] = {}  # host -> {pids, code, line, text}
        self.traced: dict[str, Event] = {}

    def feed(self, line: LogLine) -> None:
        """Read one prefixed line (a line with no host prefix is not pdsh's)."""
        text, host = line.text, line.host
        if m := _HOST.match(text):
            host, text = m.group("host"), text[m.end() :]
        if not host and not _DEEPSPEED.search(text):
            return
        k, x = _KILL.search(text), _EXIT.search(text)
        if k or x:
            got = self.killed.setdefault(host, {"pids": [], "code": -1, "line": line.number,
                                                "text": text.strip()})  # fmt: skip
            if k and len(got["pids"]) < MAX_PIDS:
                got["pids"].append(int(k.group("pid")))
            if x and got["code"] == -1 and int(x.group("code")) != 0:
                got["code"] = int(x.group("code"))
        elif _TRACE.match(text):
            if host in self.traced:
                self.traced[host].count += 1
            else:
                self.traced[host] = Event("traceback", rank=line.rank, host=host,
                                          line=line.number, text=text.strip())  # fmt: skip

    def finish(self) -> list[Event]:
        """One ``child_failed`` per host whose launcher killed its workers, one
        ``traceback`` per host."""
        out = [Event("child_failed", host=h, line=k["line"], code=k["code"], text=k["text"],
                     detail={"source": "deepspeed_launcher", "killed": k["pids"]})
               for h, k in self.killed.items()]  # fmt: skip
        return out + list(self.traced.values())
