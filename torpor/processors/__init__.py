"""The fold (pure), the thread state, the store, the model stage and the processor."""
