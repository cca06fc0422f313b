"""Kafka plumbing: configuration, topics, admin, serde, and the transactional loop."""
