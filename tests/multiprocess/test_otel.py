"""OpenTelemetry export for real: a node agent's batches become OTLP spans and its counters
OTLP metrics, sent over HTTP by opentelemetry-sdk's exporters to an in-process OTLP
receiver that decodes the protobuf requests."""

from __future__ import annotations

import gzip
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pandas as pd
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from ranksight.agent import Agent
from ranksight.agent.otel import OtelExport, step_span_id, trace_id
from ranksight.store import open_store


class Receiver:
    """An OTLP/HTTP receiver on 127.0.0.1: keeps every decoded request by path."""

    def __init__(self) -> None:
        self.traces: list[ExportTraceServiceRequest] = []
        self.metrics: list[ExportMetricsServiceRequest] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path == "/v1/traces":
                    outer.traces.append(ExportTraceServiceRequest.FromString(body))
                elif self.path == "/v1/metrics":
                    outer.metrics.append(ExportMetricsServiceRequest.FromString(body))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def spans(self) -> list:
        return [
            s
            for r in self.traces
            for rs in r.resource_spans
            for ss in rs.scope_spans
            for s in ss.spans
        ]

    def metric_points(self) -> dict[str, list]:
        out: dict[str, list] = {}
        for r in self.metrics:
            for rm in r.resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        kind = m.WhichOneof("data")
                        out.setdefault(m.name, []).extend(getattr(m, kind).data_points)
        return out

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def _attrs(span) -> dict:
    out = {}
    for kv in span.attributes:
        v = kv.value
        out[kv.key] = getattr(v, v.WhichOneof("value"))
    return out


def test_steps_and_phases_become_spans_and_agent_health_metrics(tmp_path, receiver):
    t0 = 1_800_000_000_000_000_000
    ranks = pd.DataFrame({"run_id": "otel-run", "attempt": 0, "rank": [0, 1], "world_size": 2,
                          "host": ["node-a", "node-b"], "dp": [0, 1], "tp": 0, "pp": 0, "start_ns": t0})  # fmt: skip
    steps = pd.DataFrame({"run_id": "otel-run", "attempt": 0, "rank": [0, 1, 0, 1], "step": [0, 0, 1, 1],
                          "start_ns": [t0, t0 + 5, t0 + 1000, t0 + 1005],
                          "end_ns": [t0 + 900, t0 + 950, t0 + 1900, t0 + 2500],
                          "loss": [2.5, float("nan"), 2.25, float("nan")], "tokens": 64})  # fmt: skip
    phases = pd.DataFrame({"run_id": "otel-run", "attempt": 0, "rank": 1, "step": 1,
                           "phase": ["forward", "backward"], "microbatch": [0, 0], "stage": 0,
                           "start_ns": [t0 + 1010, t0 + 1400], "end_ns": [t0 + 1390, t0 + 2400],
                           "wait_ns": [0, 700]})  # fmt: skip
    with open_store(f"chdb://{tmp_path / 'store'}") as store:
        store.init_schema()
        agent = Agent(str(tmp_path / "spool"), store, interval_s=0.1)
        export = OtelExport(receiver.url, host="node-a", interval_s=60)
        agent.taps.append(export.tap)
        export.watch(agent)
        for name, frame in (("ranks", ranks), ("steps", steps), ("phases", phases)):
            agent.submit(name, frame)
        agent.poll_once()
        assert export.force_flush()
        shipped, accepted = agent.stats.shipped, agent.stats.accepted
        agent.close()
        export.shutdown()
    spans = receiver.spans()
    assert len(spans) == 6 and export.exported == 6
    by = {(s.name, _attrs(s)["ranksight.rank"], _attrs(s)["ranksight.step"]): s for s in spans}
    step = by[("step", 1, 1)]
    assert (step.start_time_unix_nano, step.end_time_unix_nano) == (t0 + 1005, t0 + 2500)
    assert int.from_bytes(step.trace_id, "big") == trace_id("otel-run", 0, 1)
    assert int.from_bytes(step.span_id, "big") == step_span_id("otel-run", 0, 1, 1)
    assert step.parent_span_id == b""
    want = {"ranksight.run_id": "otel-run", "ranksight.attempt": 0, "ranksight.rank": 1,
            "ranksight.step": 1, "host.name": "node-b", "ranksight.dp": 1, "ranksight.tp": 0,
            "ranksight.pp": 0, "ranksight.tokens": 64}  # fmt: skip
    assert {k: v for k, v in _attrs(step).items() if k in want} == want
    back = by[("backward", 1, 1)]
    assert back.parent_span_id == step.span_id and back.trace_id == step.trace_id
    assert (back.start_time_unix_nano, back.end_time_unix_nano) == (t0 + 1400, t0 + 2400)
    assert _attrs(back)["ranksight.wait_ns"] == 700 and _attrs(back)["ranksight.dp"] == 1
    assert _attrs(by[("step", 0, 0)])["ranksight.loss"] == 2.5
    assert "ranksight.loss" not in _attrs(by[("step", 1, 0)])  # NaN: no loss on that rank
    assert by[("step", 0, 1)].trace_id == step.trace_id  # one trace per step: all ranks
    assert by[("step", 1, 0)].trace_id != step.trace_id
    points = receiver.metric_points()
    assert points["ranksight.agent.records.shipped"][-1].as_int == shipped >= 8
    assert points["ranksight.agent.records.accepted"][-1].as_int == accepted  # spool records only
    assert points["ranksight.agent.records.dropped"][-1].as_int == 0
    assert points["ranksight.agent.backlog.records"][-1].as_int == 0
    assert points["ranksight.agent.lag"][-1].as_double == 0.0


def test_an_absent_collector_never_stalls_the_agent(tmp_path):
    """Nothing listens at the endpoint: spans are dropped by the SDK, shipping goes on."""
    with open_store(f"chdb://{tmp_path / 'store'}") as store:
        store.init_schema()
        agent = Agent(str(tmp_path / "spool"), store, interval_s=0.1)
        export = OtelExport("http://127.0.0.1:9", interval_s=60)
        agent.taps.append(export.tap)
        agent.submit("steps", pd.DataFrame({"run_id": "r", "attempt": 0, "rank": 0, "step": [0],
                                            "start_ns": [1], "end_ns": [2]}))  # fmt: skip
        t = time.monotonic()
        agent.poll_once()
        assert time.monotonic() - t < 5
        assert agent.stats.shipped >= 1
        agent.close()
        export.shutdown()


def test_endpoint_must_be_an_otlp_http_base_url() -> None:
    from ranksight.agent.otel import check_endpoint

    assert check_endpoint("http://collector:4318/") == "http://collector:4318"
    assert check_endpoint("https://otel.example.com") == "https://otel.example.com"
    for bad, why in [
        ("notaurl", "not an http:// or https:// URL"),
        ("collector:4318", "did you mean http://collector:4318?"),
        ("grpc://collector:4317", "not an http:// or https:// URL"),
        ("http://:4318", "no host"),
        ("http://collector:99999", "bad port"),
        ("http://collector:4318/v1/traces", "give the base URL"),
    ]:
        with pytest.raises(ValueError, match=re.escape(f"{bad!r}: ") + ".*" + re.escape(why)):
            check_endpoint(bad)


def test_agent_once_exports_to_the_otlp_endpoint_too(tmp_path, receiver):
    """``ranksight agent --once --otlp-endpoint``: the one pass exports as a running
    agent does (it used to skip the export): the receiver gets the agent's metrics."""
    import subprocess
    import sys

    (tmp_path / "spool").mkdir()
    got = subprocess.run(
        [sys.executable, "-m", "ranksight.cli", "agent", "--spool", str(tmp_path / "spool"),
         "--store", f"chdb://{tmp_path / 'store'}", "--once", "--otlp-endpoint", receiver.url],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr
    assert "ranksight.agent.records.shipped" in receiver.metric_points()


def test_tokens_the_script_never_gave_are_left_out_not_exported_as_zero():
    from ranksight.agent.otel import _numbers

    assert _numbers({"loss": 2.0, "tokens": 0, "lr": 0.0}, ("loss", "tokens", "lr")) == {
        "ranksight.loss": 2.0, "ranksight.lr": 0.0
    }  # fmt: skip
    assert _numbers({"tokens": 64}, ("tokens",)) == {"ranksight.tokens": 64}
