"""Delivery ranges: the happy path of deliveries without a row per delivery — the pure part
(proof locators, slot packing, per-slot state), no I/O.

A hand-out of first-time deliveries writes ONE ``orbit_delivery_ranges`` row per
subscription: the sequence numbers it handed out, and per delivery (a *slot*) its random id,
its event id, the SHA-256 digest of its one-time proof and, once acked, its ack time. The
row's lease is each slot's lease; its budget each slot's budget (first attempt: attempts 1).

* **Proof locator.** The proof a consumer receives is ``d1.`` + base64url(range id ‖ slot
  index ‖ 24 random bytes). An ack parses the range id and index out of it, locks that one
  range row by primary key and checks the slot's delivery id and the digest of the whole
  proof — so no index per delivery is needed, and only the digest is stored.
* **Delivery ids** are 128-bit random values; the ids of one range share their first two
  bytes (the range's random ``id_bucket``), so a delivery can be found by its id alone (the
  operator's budget call, the error of a forged proof) through the index on
  ``(namespace_id, id_bucket)``: 1/65,536 of a namespace's ranges.
* **Slots move out**: a nack, an expired lease, a closing connection or an operator's budget
  *materialises* the slot as an ``orbit_deliveries`` row with the same delivery id, the same
  proof digest and attempts 1 (then today's per-delivery machinery applies: redelivery with
  a new proof, backoff, EXHAUSTED, budget), and sets the slot's ``moved`` bit. From then on
  the row is the truth about that delivery; the range keeps the slot for history only.

A slot is *open* (leased here) while it is neither acked nor moved. The range is LEASED
while a slot is open, then DONE (every slot acked) or RECLAIMED (some slot moved).
"""

from __future__ import annotations

import base64
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

#: Proofs of range slots start with this (other proofs are plain random secrets).
PROOF_PREFIX = "d1."
SECRET_BYTES = 24
ID_BYTES = 16
DIGEST_BYTES = 32
#: Most slots in one range (a hand-out is bounded by the pull/stream batch anyway).
MAX_SLOTS = 1000

_EPOCH = datetime(1970, 1, 1)


class RangeState(StrEnum):
    LEASED = "LEASED"  # some slot is open
    DONE = "DONE"  # every slot acked here
    RECLAIMED = "RECLAIMED"  # no slot open, some slot moved to an orbit_deliveries row


# ---------------------------------------------------------------------------------- locators


def make_proof(range_id: bytes, index: int, secret: bytes | None = None) -> str:
    """The one-time proof of slot ``index`` of range ``range_id`` (fresh random secret)."""
    if len(range_id) != ID_BYTES or not 0 <= index < MAX_SLOTS:
        raise ValueError("bad range locator")
    secret = os.urandom(SECRET_BYTES) if secret is None else secret
    if len(secret) != SECRET_BYTES:
        raise ValueError("bad secret")
    raw = range_id + struct.pack(">H", index) + secret
    return PROOF_PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def parse_proof(proof: str) -> tuple[bytes, int] | None:
    """(range id, slot index) of a range proof, or None when ``proof`` is not one (any other
    text, in time linear in its length). Whether it is *the* proof is the digest's call."""
    if not proof.startswith(PROOF_PREFIX):
        return None
    body = proof[len(PROOF_PREFIX) :]
    want = ID_BYTES + 2 + SECRET_BYTES
    if len(body) != (want * 4 + 2) // 3:
        return None
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    except (ValueError, TypeError):
        return None
    if len(raw) != want:
        return None
    (index,) = struct.unpack(">H", raw[ID_BYTES : ID_BYTES + 2])
    if index >= MAX_SLOTS:
        return None
    return raw[:ID_BYTES], index


def new_delivery_ids(n: int, bucket: bytes | None = None) -> tuple[bytes, list[bytes]]:
    """A random two-byte bucket and ``n`` random delivery ids that start with it."""
    bucket = os.urandom(2) if bucket is None else bucket
    return bucket, [bucket + os.urandom(ID_BYTES - 2) for _ in range(n)]


def bucket_of(delivery_id: bytes) -> int:
    """The ``id_bucket`` column value for a delivery id."""
    return int.from_bytes(delivery_id[:2], "big")


# ---------------------------------------------------------------------------------- packing


def pack_fixed(items: Sequence[bytes], width: int) -> bytes:
    if any(len(x) != width for x in items):
        raise ValueError(f"items must be {width} bytes")
    return b"".join(items)


def unpack_fixed(blob: bytes, width: int) -> list[bytes]:
    if len(blob) % width:
        raise ValueError(f"blob is not a multiple of {width} bytes")
    return [bytes(blob[i : i + width]) for i in range(0, len(blob), width)]


def pack_seqs(seqs: Sequence[int]) -> bytes:
    return struct.pack(f">{len(seqs)}Q", *seqs)


def unpack_seqs(blob: bytes) -> list[int]:
    return list(struct.unpack(f">{len(blob) // 8}Q", blob))


def to_us(at: datetime) -> int:
    """Microseconds since 1970 of a naive UTC datetime (the database clock's form)."""
    if at.tzinfo is not None:
        at = at.astimezone(UTC).replace(tzinfo=None)
    delta = at - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_us(us: int) -> datetime:
    from datetime import timedelta

    return _EPOCH + timedelta(microseconds=us)


def empty_bitmap(n: int) -> bytes:
    return bytes((n + 7) // 8)


def bit(bitmap: bytes, i: int) -> bool:
    return bool(bitmap[i >> 3] >> (i & 7) & 1)


def with_bit(bitmap: bytes, i: int) -> bytes:
    out = bytearray(bitmap)
    out[i >> 3] |= 1 << (i & 7)
    return bytes(out)


def popcount(bitmap: bytes) -> int:
    return sum(bin(b).count("1") for b in bitmap)


# ---------------------------------------------------------------------------------- a range


@dataclass(slots=True)
class Slots:
    """A range row's per-slot data, decoded, and the edits a transaction makes to it.

    ``acked_us[i]`` is the ack time of slot ``i`` (0: not acked here); ``moved`` the bitmap
    of slots materialised as rows. :meth:`ack` and :meth:`move` keep ``open_n`` /
    ``acked_n`` in step; :meth:`state` is what the row's state must be.
    """

    seqs: list[int]
    delivery_ids: list[bytes]
    event_ids: list[bytes]
    digests: list[bytes]
    acked_us: list[int]
    moved: bytes

    @classmethod
    def decode(
        cls,
        seqs: bytes,
        delivery_ids: bytes,
        event_ids: bytes,
        digests: bytes,
        acked_us: bytes,
        moved: bytes,
    ) -> Slots:
        s = cls(
            seqs=unpack_seqs(seqs),
            delivery_ids=unpack_fixed(delivery_ids, ID_BYTES),
            event_ids=unpack_fixed(event_ids, ID_BYTES),
            digests=unpack_fixed(digests, DIGEST_BYTES),
            acked_us=unpack_seqs(acked_us),
            moved=bytes(moved),
        )
        n = len(s.seqs)
        if not (
            len(s.delivery_ids) == len(s.event_ids) == len(s.digests) == len(s.acked_us) == n
            and len(s.moved) == (n + 7) // 8
        ):
            raise ValueError("range slots are inconsistent")
        return s

    def __len__(self) -> int:
        return len(self.seqs)

    def is_acked(self, i: int) -> bool:
        return self.acked_us[i] != 0

    def is_moved(self, i: int) -> bool:
        return bit(self.moved, i)

    def is_open(self, i: int) -> bool:
        return not self.is_acked(i) and not self.is_moved(i)

    @property
    def open_n(self) -> int:
        return sum(1 for i in range(len(self)) if self.is_open(i))

    @property
    def acked_n(self) -> int:
        return sum(1 for us in self.acked_us if us)

    def ack(self, i: int, at: datetime) -> None:
        if not self.is_open(i):
            raise ValueError("slot is not open")
        self.acked_us[i] = max(1, to_us(at))

    def move(self, i: int) -> None:
        if not self.is_open(i):
            raise ValueError("slot is not open")
        self.moved = with_bit(self.moved, i)

    def state(self) -> RangeState:
        if self.open_n:
            return RangeState.LEASED
        return RangeState.RECLAIMED if popcount(self.moved) else RangeState.DONE

    def acked_blob(self) -> bytes:
        return pack_seqs(self.acked_us)

    def index_of(self, delivery_id: bytes) -> int | None:
        try:
            return self.delivery_ids.index(delivery_id)
        except ValueError:
            return None
