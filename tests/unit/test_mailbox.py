"""The control channel's mailbox drops messages of an earlier communicator: MPICH reuses
context ids, so a notice still in flight when one communicator was freed can reach the next
one's receive, numbered with a call the new communicator also makes (tests/test_mpich failed
on exactly that: a stale ``Bcast_init`` refusal raised RemoteArgumentError in a later test).
Single process: the messages are sent to this rank itself on a duplicate of COMM_SELF."""

from __future__ import annotations

from mpi4py import MPI

from bmlmpi.agreement import ERROR, TAG_MAIL, Mailbox, decode, encode


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
