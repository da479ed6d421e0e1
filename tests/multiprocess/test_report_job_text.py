"""No report path can be crashed by text from a job: rich markup, brackets and control
characters from a log line, a phase name, a host name or a run id are printed as text in
every format (text, markdown, JSON) and in the one-line errors."""

from __future__ import annotations

import io
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from ranksight import report as rep
from ranksight.analyzer import Analysis, Finding

JOB_TEXT = [
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error",
    "[bold]not bold[/bold] [/] [link=file:///etc/passwd]x[/link]",
    "[rank3]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81]",
    "\x1b[31mred\x1b[0m \r\n tab\tend [",
    "[[[", "]]][/red", ":warning: [white on red]",
]  # fmt: skip


def finding(kind: str, text: str) -> Finding:
    """Job text in every free field; kind and cause are vocabulary words (a job's text
    cannot get there: ``ranksight.ground.vocab`` refuses unknown words)."""
    phases = {text: {"rank_ms": 1.0, "peers_ms": 0.5, "ratio": 2.0}}
    waited = {"by_axis_ms": {text: 3.0}, "by_op_ms": {text: 2.0},
              "victims": [{"rank": 1, "waited_ms": 2.0}], "last_share": 0.5}  # fmt: skip
    return Finding(
        kind=kind, cause="unknown", culprit_rank=3, host=text, dp=0, tp=1, pp=0, confidence=0.5,
        impact_pct=10.0, summary=text,
        evidence={"phases": phases, "waited_for_it": waited, "onset_step": 2, "detail": text,
                  "error": text, "nested": {"a": [text]}, "suspects": [1, 2], "alternatives": [text],
                  "waiting_on_root": [{"group": text, "group_id": text, "op": text, "seq": 1,
                                       "blocked_ranks": [1]}],
                  "blocked": {"1": {"group": text, "group_id": text, "op": text, "seq": 1}}},
    )  # fmt: skip


def render_all(analysis: Analysis, run: dict) -> str:
    buf = io.StringIO()
    rep.print_text(analysis, Console(file=buf, width=100), run)
    return buf.getvalue() + rep.to_markdown(analysis, run) + rep.to_json(analysis, run)


@pytest.mark.parametrize("text", JOB_TEXT)
@pytest.mark.parametrize("kind", ["straggler", "crash", "hang", "desync", "slow_communication"])
def test_job_text_in_any_field_is_printed_as_text(kind, text):
    analysis = Analysis(text, 0, [finding(kind, text)], 5, 100.0, [text], {})
    out = render_all(analysis, {"status": text})
    visible = text.split("\x1b")[0].strip() or "red"
    assert visible.split()[0] in out  # shown, not swallowed as markup
    doc = json.loads(rep.to_json(analysis, {"status": text}))
    assert doc["findings"][0]["summary"] == text


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("[]/=:abc \\#@\x1b\n")), max_size=40))
def test_any_bracket_soup_renders(text):
    analysis = Analysis(
        text, 0, [finding("straggler", text), finding("hang", text)], 5, 1.0, [text]
    )
    render_all(analysis, {"status": text})


def test_an_error_line_with_job_text_is_one_line_not_a_markup_error():
    import subprocess
    import sys

    bad = "/tmp/[/__w/pytorch/pair.cc:537] Read error"
    out = subprocess.run(
        [sys.executable, "-m", "ranksight.cli", "runs", "--store", bad],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert "MarkupError" not in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert out.returncode == 1 and bad in out.stderr
