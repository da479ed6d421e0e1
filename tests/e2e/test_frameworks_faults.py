"""Faults from outside the job on every trainer under zero-code attach (``ranksight
launch --``, 4 gloo ranks): a CPU quota on rank 1's cgroup is the straggler
``cpu_contention``, a SIGSTOPped rank 1 a hang ``stopped`` (kept once it recovered), a
SIGKILLed rank 1 the crash; each named live and in the final report, stored as reported,
the text report printed. One short job per case (``tests/helpers/frameworks.py`` ``run_case``);
``bench/frameworks_faults.py`` runs the full matrix, clean runs included, for
``docs/frameworks.md``. The clean runs of DDP, the HF Trainer and Lightning are the
``seen whole`` tests of ``tests/e2e/test_frameworks_{ddp,hf,lightning}.py``; FSDP2's is here.
"""

from __future__ import annotations

import pytest

from tests.helpers.frameworks import FAULTS, FRAMEWORKS, run_case

pytest.importorskip("lightning", reason="lightning is in the test extras: pip install -e '.[test]'")
pytest.importorskip("transformers", reason="transformers is in the test extras")
pytestmark = pytest.mark.training

CASES = [
    *[(fw, fault) for fw in ("plain DDP", "FSDP2", "HF Trainer", "Lightning")
      for fault in ("quota", "sigstop", "sigkill")],
    ("FSDP2", "clean"),
    ("Lightning (own launcher)", "sigstop"),
]  # fmt: skip
"""Every framework with every fault, in one run each; Lightning's own launcher with the
fault that depends on how its ranks are started and found (the agent's process state)."""


@pytest.mark.parametrize(("framework", "fault"), CASES)
def test_a_fault_from_outside_is_named_on_every_trainer(tmp_path, framework, fault):
    out = run_case(str(tmp_path), FRAMEWORKS[framework], FAULTS[fault])
    assert out.right, out.explain()
    # the job keeps its own exit code: only the one with a killed rank fails
    assert (out.exit_code != 0) == (fault == "sigkill"), out.explain()
    if fault == "sigstop":
        live = next(f for f in out.live if f.kind == "hang" and f.culprit_rank == 1)
        assert "is stopped (SIGSTOP, state T), alive: it never entered" in live.summary, (
            live.summary
        )
        assert live.evidence["blocked"], live.evidence  # the peers, inside the collective
        print(f"{framework} live hang: {live.summary}")
        assert out.final[0].evidence.get("recovered"), out.explain()  # kept once it ran on
    if fault == "quota":
        assert out.final[0].evidence.get("onset_step", -1) >= 0, out.final[0].evidence
    print(f"{framework} / {fault}: detected in {out.detected_s} s: "
          f"{out.final[0].summary if out.final else 'no finding'}")  # fmt: skip
