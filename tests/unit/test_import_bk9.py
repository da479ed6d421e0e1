"""The ninth batch of real posted logs (``tests/data/realworld/bk9-*``, sources in
``bk9-INDEX.md``): jobs that failed at start-up, asserted on the reading itself."""

from __future__ import annotations

from ranksight.importer.logs import read_lines
from tests.helpers.realworld import case_findings


def test_a_store_port_already_in_use_is_named() -> None:
    """pytorch#85604: ``The server socket has failed to listen on [::]:47531 (errno: 98 -
    Address already in use).``: skipped as saying nothing."""
    (f,) = case_findings("bk9-pytorch85604-eaddrinuse")[0]
    assert (f.kind, f.culprit_rank) == ("network", -1) and "address already in use" in f.summary


def test_an_ipv4_address_in_ipv6_form_is_read_whole() -> None:
    """Open-Sora#667: ``failed to connect to [::ffff:0.104.99.143]:47389`` was read as the
    address '::ffff:0'."""
    (e, *_) = read_lines(["[W socket.cpp:697] [c10d] The client socket has failed to connect "
                          "to [::ffff:0.104.99.143]:47389 (errno: 110 - Connection timed out)."])  # fmt: skip
    assert e.detail["address"] == "0.104.99.143:47389"


def test_nccls_verdicts_on_a_launch_name_the_configuration_not_the_reporters() -> None:
    """horovod#3929 and Megatron-LM#661 ('Duplicate GPU detected'), Lightning#14986 ('rank 1
    of 8 ranks has already checked in'): the reporting ranks were listed as suspects, or an
    'internal NCCL error' said; MambaTree#14 ('Bootstrap : no socket interface found'): the
    host's network configuration."""
    for case, words in (("bk9-horovod-dupgpu", "given one GPU"),
                        ("bk9-megatron-dupgpu", "given one GPU"),
                        ("bk9-lightning-bootstraproot", "given one rank")):  # fmt: skip
        (f, *_) = case_findings(case)[0]
        assert (f.kind, f.culprit_rank, f.evidence["suspects"]) == ("crash", -1, []), case
        assert words in f.summary, (case, f.summary)
    (g, *_) = case_findings("bk9-mambatree-nosockif")[0]
    assert g.kind == "network" and "network configuration" in g.summary
