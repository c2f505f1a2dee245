"""The control channel's mailbox drops messages of an earlier communicator: MPICH reuses
context ids, so a notice still in flight when one communicator was freed can reach the next
one's receive, numbered with a call the new communicator also makes (tests/test_mpich failed
on exactly that: a stale ``Bcast_init`` refusal raised RemoteArgumentError in a later test).
Single process: the messages are sent to this rank itself on a duplicate of COMM_SELF."""

from __future__ import annotations

from mpi4py import MPI

from bmlmpi.agreement import ERROR, SIGNATURE, TAG_MAIL, Mailbox, decode, encode


def test_messages_round_trip_with_their_token():
    msg = decode(encode(7, ERROR, 42, 3, "bad buffer", token=(1 << 61) + 5))
    assert (msg.seq, msg.kind, msg.value, msg.rank, msg.text, msg.token) == \
        (7, ERROR, 42, 3, "bad buffer", (1 << 61) + 5)


def test_a_notice_with_another_token_is_dropped():
    control = MPI.COMM_SELF.Dup()
    try:
        box = Mailbox(control, token=1234)
        stale = encode(1, ERROR, 0, 0, "an earlier communicator's notice", token=99)
        control.Send([stale, MPI.BYTE], 0, TAG_MAIL)
        assert box.failure(0) is None
        own = encode(1, ERROR, 0, 0, "this communicator's notice", token=1234)
        control.Send([own, MPI.BYTE], 0, TAG_MAIL)
        got = box.failure(0)
        assert got is not None and got.text == "this communicator's notice"
        box.close()
    finally:
        control.Free()


def test_a_signature_exchange_this_rank_did_not_make_is_found():
    """Another rank's signature message about a call this rank started without an exchange
    (its signature checked before) proves the ranks run different signatures: found for the
    calls this rank has started, not for a later one nor for one already handled."""
    control = MPI.COMM_SELF.Dup()
    try:
        box = Mailbox(control, token=7)
        sig = encode(3, SIGNATURE, 11, 0, "allreduce count=5 compressed (wire fp16)", token=7)
        control.Send([sig, MPI.BYTE], 0, TAG_MAIL)
        assert box.failure(0) is None          # takes it in; a signature is not a failure
        assert box.unchecked(1, 2) is None     # this rank has not started call 3 yet
        got = box.unchecked(1, 3)
        assert got is not None and (got.seq, got.rank, got.text) == \
            (3, 0, "allreduce count=5 compressed (wire fp16)")
        assert box.unchecked(4, 9) is None     # call 3's failure was handled already
        box.close()
    finally:
        control.Free()
