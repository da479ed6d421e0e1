"""OpenTelemetry export from the node agent: steps and phases as spans, the agent's health
as metrics, over OTLP/HTTP (protobuf) with opentelemetry-sdk's exporters, so Jaeger, Tempo
or Grafana show them next to everything else.

Spans (one per rank and step, one per phase), with the times the hooks measured (explicit
start and end, ns since the epoch; nothing is timed here):

- trace: one per ``(run_id, attempt, step)``: every rank's step and phases of that step
  side by side; trace id = the first 16 bytes of blake2b of ``run_id:attempt:step``;
- ``step`` span: per rank, id from ``run_id:attempt:rank:step``, so a phase span finds its
  parent without waiting for the step to end (phases end first);
- ``<phase>`` span (``forward``, ``backward``, ``optimizer``, ``data_wait``, ``gc`` ...):
  child of its rank's step span;
- attributes: ``ranksight.run_id``, ``ranksight.attempt``, ``ranksight.rank``,
  ``ranksight.step``, the mesh coordinates ``ranksight.dp`` / ``.tp`` / ``.pp`` and
  ``host.name`` (from the rank's ``ranks`` record, when this agent saw it), and per span
  its numbers (``ranksight.loss``, ``ranksight.tokens``, ``ranksight.wait_ns``,
  ``ranksight.microbatch``, ``ranksight.stage``).

Metrics (observed every ``interval_s`` from the agent's counters): counters
``ranksight.agent.records.accepted`` / ``.shipped`` / ``.dropped`` / ``.rejected``,
``ranksight.agent.store_errors``; gauges ``ranksight.agent.backlog.records`` and
``.bytes`` (the disk buffer) and ``ranksight.agent.lag`` (seconds since the oldest
unshipped batch was sealed; 0 when none waits).

Spans are handed to a BatchSpanProcessor (a bounded queue: a slow or absent collector
drops spans, never stalls the agent).
"""

from __future__ import annotations

import hashlib
import logging
import socket
import time
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, TraceFlags

log = logging.getLogger("ranksight.agent")
_SCOPE = InstrumentationScope("ranksight.agent")
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


def _id(text: str, size: int) -> int:
    """A non-zero id of ``size`` bytes from blake2b of ``text``."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=size).digest(), "big") or 1


def trace_id(run_id: str, attempt: int, step: int) -> int:
    """The trace of one step of a run attempt (128 bits)."""
    return _id(f"{run_id}:{attempt}:{step}", 16)


def step_span_id(run_id: str, attempt: int, rank: int, step: int) -> int:
    """The span of one rank's step (64 bits)."""
    return _id(f"{run_id}:{attempt}:{rank}:{step}", 8)


def check_endpoint(endpoint: str) -> str:
    """``endpoint`` (trailing ``/`` dropped) if it is what :class:`OtelExport` sends to: an
    OTLP/HTTP base URL, ``http://`` or ``https://``, a host, an optional port 1-65535, and
    no ``/v1/traces`` or ``/v1/metrics`` (those are appended). Raises ValueError quoting
    it and saying what is wrong (OTLP/gRPC, ``grpc://`` or a bare ``host:4317``, is not
    spoken here)."""
    parts = urlsplit(endpoint.strip())
    want = "an OTLP/HTTP URL like http://collector:4318"
    if parts.scheme not in ("http", "https"):
        bare = ":" in endpoint and "://" not in endpoint  # host:port
        hint = f"; did you mean http://{endpoint}?" if bare else ""
        raise ValueError(f"{endpoint!r}: not an http:// or https:// URL (want {want}){hint}")
    if not parts.hostname:
        raise ValueError(f"{endpoint!r}: no host (want {want})")
    try:
        _ = parts.port  # raises for a port that is not 1-65535
    except ValueError:
        raise ValueError(f"{endpoint!r}: bad port (want a number 1-65535)") from None
    if parts.path.rstrip("/").endswith(("/v1/traces", "/v1/metrics")):
        raise ValueError(
            f"{endpoint!r}: give the base URL; /v1/traces and /v1/metrics are appended"
        )
    return endpoint.strip().rstrip("/")


class OtelExport:
    """Turns the agent's batches into spans and its counters into metrics.

    ``endpoint`` is the OTLP/HTTP base URL (``http://collector:4318``; ``/v1/traces`` and
    ``/v1/metrics`` are appended). ``span_exporter`` / ``metric_exporter`` replace the
    OTLP ones (tests may pass the SDK's in-memory twins). Call :meth:`watch` with the
    agent, add :meth:`tap` to ``agent.taps``, and :meth:`shutdown` at the end."""

    def __init__(
        self,
        endpoint: str | None,
        *,
        host: str | None = None,
        interval_s: float = 10.0,
        span_exporter: Any = None,
        metric_exporter: Any = None,
    ) -> None:
        base = (endpoint or "").rstrip("/")
        self.host = host or socket.gethostname()
        self.resource = Resource.create({"service.name": "ranksight", "host.name": self.host})
        self.spans = BatchSpanProcessor(
            span_exporter or OTLPSpanExporter(endpoint=f"{base}/v1/traces", timeout=5),
            max_queue_size=65536,
            schedule_delay_millis=1000,
        )
        reader = PeriodicExportingMetricReader(
            metric_exporter or OTLPMetricExporter(endpoint=f"{base}/v1/metrics", timeout=5),
            export_interval_millis=interval_s * 1000,
        )
        self.meters = MeterProvider(resource=self.resource, metric_readers=[reader])
        self._ranks: dict[tuple[str, int, int], dict[str, Any]] = {}
        self.exported = 0
        """Spans handed to the span processor so far."""

    # ------------------------------------------------------------------ spans
    def tap(self, tables: dict[str, pa.Table]) -> None:
        """An ``Agent.taps`` entry: spans for the ``steps`` and ``phases`` rows of a batch
        (``ranks`` rows give the mesh attributes). Never raises."""
        try:
            for row in _rows(tables.get("ranks")):
                self._ranks[(row["run_id"], int(row["attempt"]), int(row["rank"]))] = {
                    "host.name": row.get("host") or self.host,
                    **{f"ranksight.{a}": int(row[a]) for a in ("dp", "tp", "pp") if a in row},
                }
            for row in _rows(tables.get("steps")):
                self._span(row, "step", None, _numbers(row, ("loss", "tokens", "lr")))
            for row in _rows(tables.get("phases")):
                self._span(
                    row, str(row["phase"]), row, _numbers(row, ("wait_ns", "microbatch", "stage"))
                )
        except Exception as exc:  # export is best effort; shipping goes on
            log.warning("OpenTelemetry export skipped a batch: %s", exc)

    def _span(self, row: dict, name: str, phase: dict | None, numbers: dict) -> None:
        run_id, attempt, rank, step = (
            row["run_id"],
            int(row["attempt"]),
            int(row["rank"]),
            int(row["step"]),
        )
        tid, sid = trace_id(run_id, attempt, step), step_span_id(run_id, attempt, rank, step)
        parent = None
        if phase is not None:
            parent = SpanContext(tid, sid, is_remote=False, trace_flags=_SAMPLED)
            sid = _id(
                f"{run_id}:{attempt}:{rank}:{step}:{name}:{row.get('microbatch', -1)}:{row['start_ns']}",
                8,
            )
        attributes = {
            "ranksight.run_id": run_id, "ranksight.attempt": attempt, "ranksight.rank": rank,
            "ranksight.step": step, **self._ranks.get((run_id, attempt, rank), {}), **numbers,
        }  # fmt: skip
        span = ReadableSpan(
            name=name,
            context=SpanContext(tid, sid, is_remote=False, trace_flags=_SAMPLED),
            parent=parent,
            resource=self.resource,
            attributes=attributes,
            instrumentation_scope=_SCOPE,
            start_time=int(row["start_ns"]),
            end_time=int(row["end_ns"]),
        )
        self.spans.on_end(span)
        self.exported += 1

    # ------------------------------------------------------------------ metrics
    def watch(self, agent: Any) -> None:
        """Observe ``agent``'s counters (``AgentStats``) and disk buffer as metrics."""
        meter = self.meters.get_meter("ranksight.agent")
        stats = agent.stats

        def counter(name: str, attr: str, unit: str, text: str) -> None:
            meter.create_observable_counter(
                name, callbacks=[lambda _o: [Observation(int(getattr(stats, attr)))]],
                unit=unit, description=text,
            )  # fmt: skip

        counter(
            "ranksight.agent.records.accepted",
            "accepted",
            "{record}",
            "valid records read from the spool",
        )
        counter("ranksight.agent.records.shipped", "shipped", "{record}", "rows the store took")
        counter(
            "ranksight.agent.records.dropped",
            "dropped",
            "{record}",
            "records lost to a full disk buffer",
        )
        counter(
            "ranksight.agent.records.rejected", "rejected", "{record}", "malformed records skipped"
        )
        counter(
            "ranksight.agent.store_errors",
            "store_errors",
            "{error}",
            "failed batch sends (retried)",
        )

        def backlog(_o: CallbackOptions) -> list[Observation]:
            rows, size = agent.buffer.size
            return [Observation(int(rows), {"unit": "records"})]

        def backlog_bytes(_o: CallbackOptions) -> list[Observation]:
            return [Observation(int(agent.buffer.size[1]))]

        def lag(_o: CallbackOptions) -> list[Observation]:
            oldest = agent.buffer.oldest_created_ns()
            return [
                Observation(0.0 if oldest is None else max(0.0, (time.time_ns() - oldest) / 1e9))
            ]

        meter.create_observable_gauge("ranksight.agent.backlog.records", [backlog], unit="{record}",
                                      description="records in the disk buffer, not yet stored")  # fmt: skip
        meter.create_observable_gauge("ranksight.agent.backlog.bytes", [backlog_bytes], unit="By",
                                      description="disk buffer size")  # fmt: skip
        meter.create_observable_gauge("ranksight.agent.lag", [lag], unit="s",
                                      description="age of the oldest batch not yet stored")  # fmt: skip

    def force_flush(self, timeout_s: float = 10.0) -> bool:
        """Export what is queued now; whether both exports finished in time."""
        ms = int(timeout_s * 1000)
        return bool(self.spans.force_flush(ms)) & bool(self.meters.force_flush(ms))

    def shutdown(self) -> None:
        """Flush and stop both pipelines. Safe to call twice."""
        self.spans.shutdown()
        self.meters.shutdown()


def _rows(table: pa.Table | None) -> list[dict]:
    return [] if table is None or table.num_rows == 0 else table.to_pylist()


UNKNOWN_WHEN_ZERO = ("tokens",)
"""Numbers the hooks record as 0 when the script did not give them (``s.set(tokens=...)``):
left out of a span, not exported as a count of 0."""


def _numbers(row: dict, names: tuple[str, ...]) -> dict[str, float | int]:
    """``ranksight.<name>`` for each of ``names`` in ``row`` that is a number (NaN left out,
    and 0 of a number in :data:`UNKNOWN_WHEN_ZERO`: unknown, not none)."""
    out: dict[str, float | int] = {}
    for name in names:
        value = row.get(name)
        if name in UNKNOWN_WHEN_ZERO and value == 0:
            continue
        if isinstance(value, int | float) and value == value:
            out[f"ranksight.{name}"] = value
    return out
