"""``ranksight import`` on the corpus of real posted logs (tests/data/realworld; each
case's ``case.json`` names its thread and right answer): no wrong answer, no confident
false culprit, no hang reported as healthy (``tests/helpers/realworld.py`` judges)."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from tests.helpers import realworld

CASES = realworld.cases()


def test_corpus_is_large_and_traceable() -> None:
    assert len(CASES) >= 40
    silent = 0
    for case in CASES:
        with open(os.path.join(realworld.CORPUS, case, "case.json")) as f:
            meta = json.load(f)
        assert meta["source"]["url"].startswith("https://github.com/"), case
        assert meta["answer"]["kind"] and meta["answer"]["why"], case
        assert any(n != "case.json" for n in os.listdir(os.path.join(realworld.CORPUS, case)))
        silent += bool(meta["answer"].get("culprit_silent"))
    assert silent >= 10


@pytest.mark.parametrize("case", CASES)
def test_real_posted_log(case: str) -> None:
    s = realworld.score(case)
    assert s.verdict in realworld.ALLOWED, f"{case}: want {s.want}; got {s.got}"


def test_judge_rejects_a_confident_wrong_rank() -> None:
    from ranksight.analyzer.findings import Finding

    f = Finding("hang", "stuck", 3, "", -1, -1, -1, 0.8, 100.0, "", {"suspects": [3]})
    answer = {"kind": "hang", "culprits": [], "suspects": [3]}
    assert realworld.judge(answer, [f]) == "confident false culprit"
    assert realworld.judge(answer, [dataclasses.replace(f, confidence=0.5)]) == "right"
    assert realworld.judge(answer, []) == "hang as healthy"
    assert realworld.judge(answer, [], failed=False) == "undecided"
