"""Record real NVML answers once, replay them anywhere: the GPU collector's test double.

:class:`RecordingNvml` wraps the real ``pynvml`` module and writes down every answer it
gives (a value, or the NVML error code it raised), keyed by function and arguments, per
GPU and per snapshot. :class:`ReplayNvml` is a stand-in for the ``pynvml`` module that
gives those answers back, raising the real ``pynvml.NVMLError`` subclasses for recorded
errors, so the collector runs on a machine without a GPU exactly as it ran on one.

Recording format (JSON)::

    {"meta": {...},
     "system": {"nvmlSystemGetDriverVersion()": {"value": "580.159.04"}, ...},
     "snapshots": [{"devices": [{"nvmlDeviceGetClockInfo(1)": {"value": 1980},
                                 "nvmlDeviceGetTotalEccErrors(0, 0)": {"error": "NVMLError_NotSupported", "code": 3},
                                 "fields": {"138:-": {"ret": 0, "type": 3, "value": 123}}, ...}, ...]}]}

A structure is recorded as a dict of its fields, a list of structures as a list of dicts;
replay turns them back into objects with the same attribute names.
"""

from __future__ import annotations

import ctypes
import gzip
import json
import time
from types import SimpleNamespace
from typing import Any

import pynvml

_NO_HANDLE = {
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetHandleByPciBusId",
}
_VALUE_MEMBER = {
    0: "dVal",
    1: "uiVal",
    2: "ulVal",
    3: "ullVal",
    4: "sllVal",
    5: "siVal",
    6: "usVal",
}
"""``c_nvmlValue_t`` member holding a field value, by ``nvmlValueType_t`` (nvml.h)."""


def call_key(name: str, args: tuple) -> str:
    """``name(arg, ...)`` with plain arguments by value and others (handles) as ``*``."""
    shown = [repr(a) if isinstance(a, (int, float, str)) else "*" for a in args]
    return f"{name}({', '.join(shown)})"


def field_key(field: Any) -> str:
    """``"<fieldId>:<scopeId>"`` for a field id or ``(fieldId, scopeId)`` pair (``-``: no scope)."""
    if isinstance(field, tuple):
        return f"{field[0]}:{field[1]}"
    return f"{field}:-"


def to_plain(value: Any) -> Any:
    """A pynvml answer as JSON-able data: structures as dicts, bytes as text."""
    if isinstance(value, ctypes.Structure):
        return {name: to_plain(getattr(value, name)) for name, *_ in value._fields_}
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, (list, tuple, ctypes.Array)):
        return [to_plain(v) for v in value]
    if isinstance(value, (int, float, str)) or value is None:
        return value
    return repr(value)


def to_object(value: Any) -> Any:
    """Inverse of :func:`to_plain` for attribute access: dicts become namespaces."""
    if isinstance(value, dict):
        return SimpleNamespace(**{k: to_object(v) for k, v in value.items()})
    if isinstance(value, list):
        return [to_object(v) for v in value]
    return value


def _field_answer(fv: Any) -> dict:
    """One ``c_nvmlFieldValue_t`` as ``{"ret", "type", "value"}``."""
    member = _VALUE_MEMBER.get(fv.valueType)
    value = getattr(fv.value, member) if member and fv.nvmlReturn == 0 else None
    return {"ret": int(fv.nvmlReturn), "type": int(fv.valueType), "value": value}


class RecordingNvml:
    """The real ``pynvml`` module, writing down every answer (see the module doc)."""

    def __init__(self, real: Any = pynvml, meta: dict | None = None) -> None:
        self._real = real
        self._handles: dict[int, int] = {}
        self.data: dict = {"meta": dict(meta or {}), "system": {}, "snapshots": []}
        self.snapshot()

    def snapshot(self) -> None:
        """Start a new snapshot: later answers go into it."""
        self.data["snapshots"].append({"devices": []})

    def save(self, path: str) -> None:
        """Write the recording as JSON to ``path``."""
        with open(path, "w") as f:
            json.dump(self.data, f, indent=1, sort_keys=True)

    def __getattr__(self, name: str) -> Any:
        real = getattr(self._real, name)
        if not (callable(real) and name.startswith("nvml")):
            return real
        return lambda *args: self._call(name, real, args)

    def _slot(self, name: str, args: tuple) -> tuple[dict, tuple]:
        """Where an answer goes (system or one GPU of the current snapshot), and the
        arguments that name it."""
        if not name.startswith("nvmlDevice") or name in _NO_HANDLE or not args:
            return self.data["system"], args
        index = self._handles.get(_address(args[0]), -1)
        devices = self.data["snapshots"][-1]["devices"]
        while len(devices) <= index:
            devices.append({})
        return (devices[index] if index >= 0 else self.data["system"]), args[1:]

    def _call(self, name: str, fn: Any, args: tuple) -> Any:
        slot, rest = self._slot(name, args)
        try:
            value = fn(*args)
        except self._real.NVMLError as exc:
            slot[call_key(name, rest)] = {"error": type(exc).__name__, "code": int(exc.value)}
            raise
        if name == "nvmlDeviceGetHandleByIndex":
            self._handles[_address(value)] = int(args[0])
        if name == "nvmlDeviceGetFieldValues":
            fields = slot.setdefault("fields", {})
            for requested, fv in zip(rest[0], value, strict=True):
                fields[field_key(requested)] = _field_answer(fv)
        else:
            slot[call_key(name, rest)] = {"value": to_plain(value)}
        return value


def check_recording(recording: Any, source: str) -> None:
    """Raise ValueError naming ``source`` and the place if ``recording`` is not of the
    shape in the module doc: ``system`` a dict of answers, ``snapshots`` a non-empty
    list of ``{"devices": [answers, ...]}``, each answer ``{"value": ...}`` or
    ``{"error": name, "code": int}``, each field ``{"ret": int, "type": int, "value"}``."""
    if not isinstance(recording, dict):
        raise ValueError(f"{source}: no NVML recording (a {type(recording).__name__})")
    snaps = recording.get("snapshots")
    if not isinstance(snaps, list) or not snaps:
        raise ValueError(f"{source}: 'snapshots' is no list of snapshots")
    _check_answers(recording.get("system"), f"{source}: system")
    for k, snap in enumerate(snaps):
        devices = snap.get("devices") if isinstance(snap, dict) else None
        if not isinstance(devices, list):
            raise ValueError(f"{source}: snapshot {k} has no list of devices")
        for i, answers in enumerate(devices):
            _check_answers(answers, f"{source}: snapshot {k} GPU {i}")


def _check_answers(answers: Any, where: str) -> None:
    if not isinstance(answers, dict):
        raise ValueError(f"{where} is no dict of answers")
    for key, answer in answers.items():
        if key == "fields":
            _check_fields(answer, where)
        elif not isinstance(answer, dict) or not (
            type(answer.get("code")) is int if "error" in answer else "value" in answer
        ):
            raise ValueError(f"{where}: {key} is no answer ({answer!r:.60})")


def _check_fields(fields: Any, where: str) -> None:
    if not isinstance(fields, dict):
        raise ValueError(f"{where}: fields is no dict")
    for key, fv in fields.items():
        if not (isinstance(fv, dict) and type(fv.get("ret")) is int
                and type(fv.get("type")) is int and "value" in fv):  # fmt: skip
            raise ValueError(f"{where}: field {key} is no field answer ({fv!r:.60})")


def _address(handle: Any) -> int:
    """A device handle's address (handles from different calls compare by it)."""
    if isinstance(handle, _ReplayHandle):
        return handle.index
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


class _ReplayHandle:
    """A device handle of :class:`ReplayNvml`."""

    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"<replay GPU {self.index}>"


class ReplayNvml:
    """A stand-in for the ``pynvml`` module answering from a recording.

    Constants and error classes are the real ``pynvml``'s. ``overrides`` replaces answers:
    ``{(gpu_index, "nvmlDeviceGetClockInfo(1)"): {"error": "NVMLError_GpuIsLost",
    "code": 15}}``; ``events`` are XID events handed out by ``nvmlEventSetWait_v2`` in
    order, as ``(gpu_index, xid)`` pairs. A call the recording does not hold raises
    KeyError naming it, so a collector asking something new is caught by the tests.
    """

    def __init__(
        self, recording: dict, *, overrides: dict | None = None, events=(), source: str = ""
    ) -> None:
        check_recording(recording, source or "the NVML recording")
        self.recording = recording
        self.overrides = dict(overrides or {})
        self.events = list(events)
        self.calls: list[str] = []
        self._snapshot = 0

    @classmethod
    def load(cls, path: str, **kw: Any) -> ReplayNvml:
        """A replay of the JSON recording at ``path`` (``.gz``: gzip-compressed)."""
        opener = gzip.open if path.endswith(".gz") else open
        try:
            with opener(path, "rt") as f:
                recording = json.load(f)
        except (ValueError, EOFError, gzip.BadGzipFile) as exc:  # no JSON, no UTF-8, no gzip
            raise ValueError(f"{path}: no JSON NVML recording ({exc})") from None
        return cls(recording, source=path, **kw)

    def advance(self) -> None:
        """Answer from the next snapshot (the last one stays once reached)."""
        self._snapshot = min(self._snapshot + 1, len(self.recording["snapshots"]) - 1)

    def __getattr__(self, name: str) -> Any:
        real = getattr(pynvml, name)
        if not (callable(real) and name.startswith("nvml")):
            return real
        return lambda *args: self._call(name, args)

    def _answer(self, index: int | None, key: str) -> dict:
        if index is not None and (index, key) in self.overrides:
            return self.overrides[(index, key)]
        if index is None:
            if key not in self.recording["system"]:
                raise KeyError(f"the NVML recording holds no answer to {key}")
            return self.recording["system"][key]
        for snap in reversed(self.recording["snapshots"][: self._snapshot + 1]):
            devices = snap["devices"]
            if index < len(devices) and key in devices[index]:
                return devices[index][key]
        raise KeyError(f"the NVML recording holds no answer to {key} for GPU {index}")

    def _call(self, name: str, args: tuple) -> Any:
        if name == "nvmlEventSetWait_v2":
            return self._event(args)
        if name == "nvmlEventSetCreate":
            self._answer(None, call_key(name, args))  # recorded as created
            return _ReplayHandle(-1)
        device = name.startswith("nvmlDevice") and name not in _NO_HANDLE and args
        if device and not isinstance(args[0], _ReplayHandle):  # as NVML answers a bad handle
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        index = args[0].index if device else None
        rest = args[1:] if device else args
        if name == "nvmlDeviceGetFieldValues":
            return [self._field(args[0].index, f) for f in rest[0]]
        key = call_key(name, rest)
        self.calls.append(key)
        answer = self._answer(index, key)
        if "error" in answer:
            raise pynvml.NVMLError(answer["code"])
        if name == "nvmlDeviceGetHandleByIndex":
            return _ReplayHandle(int(args[0]))
        return to_object(answer["value"])

    def _event(self, args: tuple) -> SimpleNamespace:
        """The next scripted XID event, else the recorded answer after waiting the
        timeout (``args[1]``, ms) as the real call blocks."""
        if self.events:
            index, xid = self.events.pop(0)
            return SimpleNamespace(device=_ReplayHandle(index), eventType=8, eventData=xid)
        time.sleep(args[1] / 1000)
        waits = [k for k in self.recording["system"] if k.startswith("nvmlEventSetWait_v2(")]
        if not waits:
            raise KeyError("the NVML recording holds no answer to nvmlEventSetWait_v2")
        answer = self.recording["system"][waits[0]]  # whatever the recorded timeout
        if "error" in answer:
            raise pynvml.NVMLError(answer["code"])
        return to_object(answer["value"])

    def _field(self, index: int, field: Any) -> SimpleNamespace:
        """The field's answer from the latest snapshot (up to the current) holding it."""
        key = field_key(field)
        answer = self.overrides.get((index, f"field {key}"))
        for snap in reversed(self.recording["snapshots"][: self._snapshot + 1]):
            if answer is not None:
                break
            devices = snap["devices"]
            if index < len(devices):
                answer = devices[index].get("fields", {}).get(key)
        if answer is None:
            raise KeyError(f"the NVML recording holds no field {key} for GPU {index}")
        member = _VALUE_MEMBER.get(answer["type"], "ullVal")
        value = SimpleNamespace(**{member: answer["value"]})
        fid = field[0] if isinstance(field, tuple) else field
        return SimpleNamespace(
            fieldId=fid, nvmlReturn=answer["ret"], valueType=answer["type"], value=value
        )
