"""Processors: what folds `inputs` into threads, in four rooms.

- `fold/`: the pure fold. `transitions.fold(state, input, facts)` and the modules it is
  made of (the state, the effects, the built-in tools, children, receipts, the history
  chain, the verifiers and the authority table). It imports nothing but `torpor.schemas`:
  no store, no model, no Kafka, no clock, no I/O.
- `store/`: where a partition's threads live. The key-value stores (`kv`: memory,
  RocksDB, the overlay a checkpoint folds into), the row keys, the row codecs and the
  named reads (`tables`). It knows the fold's types, nothing of Kafka or models.
- `models/`: the model stage. The provider seam and its scripted twin (`provider`), the
  stage that turns committed completion requests into `Completion` inputs (`stage`),
  and the real providers (`providers/`).
- the runtimes, here: `step` (the fold's batch entry point over a store, shared by
  everything below), `processor` (Kafka, exactly once), `local` (in-process), `replay`
  (re-fold the log and check it), `outputs` (a step's records for Kafka), `trust` (the
  key ring and the processor's own key, loaded once), `observing` (what a processor tells
  its observer) and `metrics` (the observer that counts for Prometheus).

Only the runtimes compose the rooms; `tests/test_layering.py` checks the rule.
"""
