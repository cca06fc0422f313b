"""Where a partition's threads live: `kv` (the stores and the overlay a checkpoint folds
into), `keys` (row keys), `statecodec` (rows as bytes), `tables` (named reads: a thread's
state, its history, what awaits the model). Nothing here knows Kafka or a model."""
