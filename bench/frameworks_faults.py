"""Faults from outside the job on every trainer under zero-code attach: the full matrix.

Every trainer of ``tests/helpers/frameworks.py`` :data:`FRAMEWORKS` (plain DDP, FSDP2, the
Hugging Face Trainer, Lightning under torchrun and under its own launcher; 4 CPU ranks on
gloo, ``ranksight launch --``) with every fault of :data:`FAULTS` (none, a CPU quota on
rank 1's cgroup, SIGSTOP of rank 1, SIGKILL of rank 1), one short job each, judged by
``run_case`` as the tests judge it. Writes the table of ``docs/frameworks.md`` (framework,
attach mode, fault, culprit and cause found, time to detection, clean run) with the
machine and its load average, and prints it.

Run: python3 bench/frameworks_faults.py [--out FILE] [--only FRAMEWORK ...]
(20 runs, about 1 min each on a 2-core machine, 2 min under a load of 10-15).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.helpers.frameworks import FAULTS, FRAMEWORKS, Outcome, described, run_case  # noqa: E402


def _found(o: Outcome) -> str:
    """The final analysis' first finding in words (and how many more)."""
    if not o.final:
        return "no finding"
    f = o.final[0]
    more = f" (+{len(o.final) - 1} more: {described(o.final[1:])})" if len(o.final) > 1 else ""
    text = f.summary if len(f.summary) <= 240 else f.summary[:240].rsplit("; ", 1)[0] + " ..."
    return f"{f.kind} rank {f.culprit_rank}, `{f.cause}`: {text}{more}"


def _row(o: Outcome, clean: Outcome | None) -> str:
    detect = f"{o.detected_s:.1f} s" if o.detected_s is not None else "-"
    if not o.fault.kind:
        detect = "-"
    verdict = "right" if o.right else "WRONG"
    clean_text = "-"
    if clean is not None:
        clean_text = "no finding" if clean.right else f"WRONG: {described(clean.final)}"
    load = f"{o.load[0]:.0f}"
    return (
        f"| {o.framework.name} | {o.framework.attach} | {o.fault.words} | {verdict}: "
        f"{_found(o)} | {detect} (load {load}) | {clean_text} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/frameworks_faults.md")
    parser.add_argument("--only", nargs="*", default=sorted(FRAMEWORKS))
    args = parser.parse_args()
    cpus = os.cpu_count()
    lines = [
        f"Machine: {platform.node()}, {cpus} CPUs, {platform.platform()}, Python "
        f"{platform.python_version()}; load average at the start "
        f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}; {time.strftime('%Y-%m-%d %H:%M')}",
        "",
        "| framework | attach | fault | culprit and cause found (final report) "
        "| time to detection | clean run of the same job |",
        "|---|---|---|---|---|---|",
    ]
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="frameworks-faults-") as tmp:
        for name in args.only:
            fw = FRAMEWORKS[name]
            outcomes: dict[str, Outcome] = {}
            for fault in FAULTS.values():
                folder = os.path.join(tmp, f"{len(os.listdir(tmp))}")
                t0 = time.monotonic()
                outcomes[fault.name] = o = run_case(folder, fw, fault)
                print(f"{name} / {fault.name}: {'right' if o.right else 'WRONG'} in "
                      f"{time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)  # fmt: skip
                if not o.right:
                    print(o.explain(), file=sys.stderr, flush=True)
            clean = outcomes.get("clean")
            for fault in FAULTS:
                if fault != "clean":
                    lines.append(_row(outcomes[fault], clean))
    lines += ["", f"{len(args.only) * len(FAULTS)} runs in {time.monotonic() - start:.0f} s."]
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
