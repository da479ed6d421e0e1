"""Score ``ranksight import`` on the corpus of real posted logs (``tests/data/realworld``).

Each case folder holds the log lines exactly as posted in a public thread and
``case.json``: its source, the cause the thread states, and the right answer (kind,
culprit ranks, suspects, ranks not to blame; ``kind_also``: other kinds the lines cannot
tell from it, e.g. a lone SIGABRT with no other line, a crash in the process or NCCL's
watchdog after a hang). A case is **right** when the report's first finding is of the
right kind, every rank named at confidence >= 0.7 is a right
culprit, every right culprit and suspect is named (as a culprit or a suspect), and no
rank of ``not_culprits`` is blamed with confidence. **Undecided** is a report that says
the lines show no fault and nothing can be told from them (never "healthy").
**Confident false culprit** and **hang reported as healthy** must never happen.

    python -m tests.helpers.realworld            # print the table
    python -m tests.helpers.realworld --write    # and write it into docs/import-validation.md
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from dataclasses import dataclass

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(TESTS, "data", "realworld")
DOC = os.path.join(TESTS, "..", "docs", "import-validation.md")
CONFIDENT = 0.7
KIND_ALIASES = {
    "network": {"hardware"},
    "hardware": {"network"},
    "oom": {"crash"},
    "data_loader": {"hang", "crash"},  # a stall, or a worker's death (cause data_loader)
}
"""Answer kinds and the finding kinds that say the same."""
ALLOWED = ("right", "undecided")
"""Verdicts a test accepts: "undecided" is the report saying the lines show no fault."""
BEGIN, END = "<!-- realworld:begin -->", "<!-- realworld:end -->"


@dataclass
class Score:
    """One case's outcome."""

    case: str
    url: str
    want: str
    got: str
    verdict: str  # right | partly | wrong | confident false culprit | hang as healthy


def cases() -> list[str]:
    """Case folders of the corpus, sorted."""
    return sorted(
        d for d in os.listdir(CORPUS) if os.path.isfile(os.path.join(CORPUS, d, "case.json"))
    )


def _inputs(folder: str) -> list[str]:
    return sorted(os.path.join(folder, f) for f in os.listdir(folder) if f != "case.json")


def case_events(case: str):
    """The ``log_events`` frame every file of corpus case ``case`` gives (the line
    readers alone, no store)."""
    import pandas as pd

    from ranksight.importer.logs import read_file

    folder = os.path.join(CORPUS, case)
    rows = [e.row() for name in _inputs(folder) for e in read_file(name)]
    return pd.DataFrame(rows)


def case_findings(case: str) -> tuple[list, list[str]]:
    """``(findings, notes)`` of the log detectors on corpus case ``case``, with no mesh
    coordinates (what the lines alone say)."""
    import pandas as pd

    from ranksight.analyzer.log_evidence import log_findings

    return log_findings(case_events(case), pd.DataFrame(columns=["dp", "tp", "pp", "host"]))


def judge(answer: dict, findings: list, failed: bool = True) -> str:
    """The verdict of ``findings`` (``Finding`` objects, report order) against ``answer``;
    ``failed``: the import stored the run as failed (its lines show a fault)."""
    kind = answer["kind"]
    culprits, suspects = set(answer.get("culprits") or []), set(answer.get("suspects") or [])
    if not findings:
        if kind == "healthy":
            return "right"
        if not failed:  # the report says "undecided": the lines show no fault
            return "undecided"
        return "hang as healthy" if kind == "hang" else "wrong"
    confident = {
        f.culprit_rank for f in findings if f.culprit_rank >= 0 and f.confidence >= CONFIDENT
    }
    if confident - culprits:
        return "confident false culprit"
    named = {f.culprit_rank for f in findings if f.culprit_rank >= 0}
    for f in findings:
        named |= {int(r) for r in (f.evidence.get("suspects") or [])}
    top = findings[0].kind
    kinds = {kind, *answer.get("kind_also", ())}  # the lines cannot tell these apart
    kind_ok = any(top == k or top in KIND_ALIASES.get(k, set()) for k in kinds)
    if kind == "data_loader":
        kind_ok = kind_ok and any(f.cause == "data_loader" for f in findings)
    if not kind_ok:
        return "wrong"
    want = culprits | suspects
    if want - named:
        return (
            "partly"
            if want & named or len(want) > 8 and len(want & named) * 2 >= len(want)
            else "wrong"
        )
    return "right"


def describe(findings: list) -> str:
    """A short text of the report's findings."""
    if not findings:
        return "no finding"
    parts = []
    for f in findings[:3]:
        who = f"rank {f.culprit_rank}" if f.culprit_rank >= 0 else "no single rank"
        sus = f.evidence.get("suspects") or []
        extra = (
            f", suspects {','.join(map(str, sus[:6]))}" if sus and sus != [f.culprit_rank] else ""
        )
        parts.append(f"{f.kind}/{f.cause}: {who} @ {f.confidence:.2f}{extra}")
    return "; ".join(parts) + (f" (+{len(findings) - 3})" if len(findings) > 3 else "")


def want_text(answer: dict) -> str:
    """The right answer, short."""
    out = answer["kind"]
    if answer.get("culprits"):
        out += f": culprits {','.join(map(str, answer['culprits']))}"
    if answer.get("suspects"):
        out += f"; suspects {','.join(map(str, answer['suspects'][:8]))}"
    return out


def score(case: str) -> Score:
    """Import one case into a fresh embedded store and judge the analysis."""
    from ranksight.analyzer import analyze
    from ranksight.importer import ImportConfig, import_paths
    from ranksight.store import open_store

    folder = os.path.join(CORPUS, case)
    with open(os.path.join(folder, "case.json")) as f:
        meta = json.load(f)
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(os.path.join(tmp, "store"))
        store.init_schema()
        result = import_paths(store, _inputs(folder), ImportConfig(run_id="c"))
        findings = analyze(store, "c").findings if result.imported else []
        runs = store.query("SELECT status FROM runs WHERE run_id = 'c'")["status"]
        status = runs.iloc[-1] if len(runs) else "failed"  # nothing read: never "undecided"
    answer = meta["answer"]
    return Score(
        case,
        meta["source"]["url"],
        want_text(answer),
        describe(findings),
        judge(answer, findings, status == "failed"),
    )


def table(scores: list[Score]) -> str:
    """The markdown table and totals."""
    n = len(scores)
    right = sum(s.verdict == "right" for s in scores)
    lines = [
        f"{right} of {n} right ({100 * right / max(n, 1):.0f}%); "
        + ", ".join(
            f"{v} {sum(s.verdict == v for s in scores)}"
            for v in ("undecided", "partly", "wrong", "confident false culprit", "hang as healthy")
        ),
        "",
        "| case | source | right answer | ranksight's answer | verdict |",
        "|---|---|---|---|---|",
    ]
    for s in scores:
        lines.append(f"| {s.case} | {s.url} | {s.want} | {s.got} | {s.verdict} |")
    return "\n".join(lines)


def write_doc(text: str) -> None:
    """Put ``text`` between the corpus markers of docs/import-validation.md."""
    with open(DOC) as f:
        doc = f.read()
    block = f"{BEGIN}\n{text}\n{END}"
    if BEGIN in doc:
        head, rest = doc.split(BEGIN, 1)
        doc = head + block + rest.split(END, 1)[1]
    else:
        doc = doc.rstrip() + "\n\n## Real posted logs (tests/data/realworld)\n\n" + block + "\n"
    with open(DOC, "w") as f:
        f.write(doc)


def main(argv: list[str] | None = None) -> int:
    """Score every case (or those named); exit 1 on any verdict but right."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cases", nargs="*")
    ap.add_argument("--write", action="store_true", help="write docs/import-validation.md")
    args = ap.parse_args(argv)
    scores = [score(c) for c in (args.cases or cases())]
    text = table(scores)
    print(text)
    if args.write:
        write_doc(text)
    return 0 if all(s.verdict in ALLOWED for s in scores) else 1


if __name__ == "__main__":
    sys.exit(main())
