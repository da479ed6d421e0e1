"""The fifth batch of real posted logs (``tests/data/realworld/bk5-*``, sources in
``bk5-INDEX.md``): lines that were skipped or read wrong, asserted on the reading itself,
beyond the corpus verdict that ``test_realworld.py`` checks."""

from __future__ import annotations

from ranksight.importer.logs import read_lines
from tests.helpers.realworld import case_findings


def _read(case: str) -> list:
    return case_findings(case)[0]


def test_a_store_wait_timeout_is_a_hang_whose_waiter_is_not_at_fault() -> None:
    """ms-swift#4906: ``DistStoreError: wait timeout after 300000ms, keys:
    /broadcast_from/0/75465`` under vLLM's store barrier. It said 'crash: rank 0'."""
    (f,) = _read("bk5-ms-swift-4906")
    assert (f.kind, f.culprit_rank, f.evidence["suspects"]) == ("hang", -1, [])
    assert f.evidence["key"] == "/broadcast_from/0/75465" and f.evidence["waiting"] == [0]


def test_a_store_socket_that_timed_out_names_the_stores_address() -> None:
    """ms-swift#3343: c10d's ``waitForInput: socket SocketImpl(... remote=[::ffff:
    33.148.62.162]:23456) timed out after 900000ms``: the store never answered. Skipped."""
    (f,) = _read("bk5-ms-swift-3343")
    assert (f.kind, f.evidence["addresses"]) == ("network", ["33.148.62.162:23456"])


def test_gloo_failing_to_connect_its_pairs_is_a_network_failure_at_start_up() -> None:
    """dmlcloud#47: ``Gloo connectFullMesh failed with [...pair.h:301] Connect timeout``
    in ``init_process_group``. It said 'crash: exception'."""
    (f, *_) = _read("bk5-dmlcloud-47")
    assert (f.kind, f.cause, f.culprit_rank) == ("network", "rendezvous", -1)


def test_gloo_receiving_more_bytes_than_posted_is_a_desync() -> None:
    """prime-diloco#68: ``[enforce fail at .../gloo/transport/tcp/pair.cc:446]
    op.preamble.length <= op.nbytes. 1046204 vs 1040256``. Skipped."""
    (f,) = _read("bk5-prime-diloco-68")
    assert (f.kind, f.culprit_rank, f.evidence["sizes"]) == ("desync", -1, [1046204, 1040256])


def test_rocm_hsa_hardware_exceptions_are_a_gpu_fault() -> None:
    """legacy-rocm-build#4021 (MI300X): eleven ``HW Exception by GPU node-9 (Agent handle:
    ...) reason :GPU Hang``. Skipped."""
    (f,) = _read("bk5-rocm-4021")
    assert (f.kind, f.culprit_rank) == ("hardware", -1)
    assert "KFD node 9" in f.summary and "GPU Hang" in f.summary


def test_horovods_stall_inspector_names_the_ranks_not_ready() -> None:
    """horovod#364: every stalled allreduce lists ``[ready ranks: 0, 7, 3, 2, 4, 6]``: ranks
    1 and 5 never submitted it. Skipped."""
    (f,) = _read("bk5-horovod-364")
    assert (f.kind, sorted(f.evidence["suspects"])) == ("hang", [1, 5])
    (e, *_) = read_lines(["allreduce.bn1.bias [ready ranks: 0, 2], "])
    assert (e.kind, e.op, e.rank, e.pg) == ("timeout", "all_reduce", 0, "horovod")
