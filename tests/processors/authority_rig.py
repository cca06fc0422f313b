"""A partition folded by `step` under a `KeyringVerifier`, for the trust-boundary tests.

`Rig` sends inputs as the processor would see them: with a source, signed by a key of
`RING` (by default the honest key of that source, `HONEST`), and keeps the receipts,
dispatches and loopbacks. `RING` holds a key per role, plus the keys the attacks need: a
connector key with any tool (as `torpor keys new` makes one without `--tool`), a gateway
of another tenant, and a gateway key rotated out at `ROTATED_AT`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.processors.fold_scenarios import completion
from torpor.processors.fold.state import ThreadState
from torpor.processors.fold.verify import KeyringVerifier
from torpor.processors.step import StepOutput, StepRecord, step
from torpor.processors.store.kv import MemoryStore
from torpor.processors.store.tables import load_state, read_entries
from torpor.schemas import signing
from torpor.schemas.keyring import KeyRing, KeyVersion
from torpor.schemas.records import Dispatch, Input, InputBody, Receipt, ToolCall


def _key(seed: int) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(bytes((seed + i) % 256 for i in range(32)))


def _raw(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


ROTATED_AT = 5_000_000  # gw-old's valid_until, gw-new's valid_from

KEYS = {
    "operator-1": _key(1),
    "tools-1": _key(2),  # connector:tools, for search and fetch only
    "timer-1": _key(3),
    "proc-1": _key(4),
    "gateway-acme": _key(5),
    "gateway-globex": _key(6),
    "shell-1": _key(7),  # connector:shell as `torpor keys new` makes it: tools default to any
    "gw-old": _key(8),  # acme's previous gateway key, rotated out at ROTATED_AT
    "gw-new": _key(9),
}
RING = KeyRing((
    KeyVersion("operator-1", _raw(KEYS["operator-1"]), sources=("operator:*",), scopes=("*",)),
    KeyVersion("tools-1", _raw(KEYS["tools-1"]), sources=("connector:tools",), tools=("search", "fetch")),
    KeyVersion("timer-1", _raw(KEYS["timer-1"]), sources=("timer",), tools=("timer",)),
    KeyVersion("proc-1", _raw(KEYS["proc-1"]), sources=("processor",)),
    KeyVersion("gateway-acme", _raw(KEYS["gateway-acme"]), sources=("user:*",), tenants=("acme",),
               scopes=("read",)),
    KeyVersion("gateway-globex", _raw(KEYS["gateway-globex"]), sources=("user:*",), tenants=("globex",),
               scopes=("*",)),
    KeyVersion("shell-1", _raw(KEYS["shell-1"]), sources=("connector:shell",)),
    KeyVersion("gw-old", _raw(KEYS["gw-old"]), sources=("user:*",), tenants=("acme",), scopes=("read",),
               valid_until=ROTATED_AT),
    KeyVersion("gw-new", _raw(KEYS["gw-new"]), sources=("user:*",), tenants=("acme",), scopes=("read",),
               valid_from=ROTATED_AT),
))
HONEST = {"operator:ops": "operator-1", "connector:tools": "tools-1", "timer": "timer-1",
          "processor": "proc-1", "user:alice": "gateway-acme", "connector:shell": "shell-1"}
"""Which key signs honestly for each source."""


@dataclass
class Rig:
    """One partition's store, folded by `step` under the key ring, as the processor does."""

    store: MemoryStore = field(default_factory=MemoryStore)
    ring: KeyRing = RING
    clock: int = 1_000_000
    counter: int = 0
    receipts: list[Receipt] = field(default_factory=list)
    dispatches: list[Dispatch] = field(default_factory=list)
    loopbacks: list[Input] = field(default_factory=list)
    # Every record folded, as the log holds it (a replay folds them again).
    records: list[StepRecord] = field(default_factory=list)

    def envelope(self, body: InputBody, source: str, thread: str = "t", message_id: str | None = None,
                 created_at: int | None = None) -> Input:
        self.counter += 1
        self.clock += 1000
        return Input(message_id=f"m{self.counter}" if message_id is None else message_id, thread_id=thread,
                     created_at=self.clock if created_at is None else created_at, source=source,
                     expires_at=None, key_id=None, signature=None, body=body)

    def fold(self, *records: StepRecord, partitions: int | None = None) -> StepOutput:
        self.records.extend(records)
        out = step(self.store, list(records), verifier=KeyringVerifier(self.ring), partitions=partitions)
        self.receipts.extend(out.receipts)
        self.dispatches.extend(out.dispatches)
        self.loopbacks.extend(out.loopbacks)
        return out

    def send(self, body: InputBody, source: str, key_id: str | None = "honest", thread: str = "t",
             message_id: str | None = None, created_at: int | None = None) -> Receipt:
        """Fold one input from `source`, signed by `key_id` ("honest": the source's own key)."""
        out = self.send_for_output(body, source, key_id, thread, message_id, created_at)
        assert len(out.receipts) == 1
        return out.receipts[0]

    def send_for_output(self, body: InputBody, source: str, key_id: str | None = "honest",
                        thread: str = "t", message_id: str | None = None,
                        created_at: int | None = None) -> StepOutput:
        """`send`, returning the whole step output (its receipt, records and appended history)."""
        record = self.envelope(body, source, thread, message_id, created_at)
        chosen = HONEST.get(source) if key_id == "honest" else key_id
        if chosen is not None:
            record = signing.sign(record, chosen, KEYS[chosen])
        return self.fold(StepRecord(record, appended_at=self.clock))  # the broker appends it now

    def deliver_loopbacks(self) -> list[Receipt]:
        """Fold the processor's loopbacks, signed with its key, as the processor would."""
        pending, self.loopbacks = self.loopbacks, []
        signed = [StepRecord(signing.sign(loopback, "proc-1", KEYS["proc-1"]), appended_at=self.clock)
                  for loopback in pending]
        return [receipt for record in signed for receipt in self.fold(record).receipts]

    def complete(self, reply: str = "", calls: tuple[ToolCall, ...] = (), thread: str = "t") -> Receipt:
        """The model stage's answer to the thread's pending completion request."""
        state = self.state(thread)
        assert state is not None and state.pending_request is not None
        return self.send(completion(state.pending_request, reply, calls), "processor", thread=thread,
                         message_id=state.pending_request)

    def state(self, thread: str = "t") -> ThreadState | None:
        return load_state(self.store, thread)

    def history(self, thread: str = "t") -> list[object]:
        return [e.body for e in read_entries(self.store, thread)]
