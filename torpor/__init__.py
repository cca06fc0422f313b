"""Torpor: a durable runtime for long-waiting LLM agents, built on Kafka."""

from __future__ import annotations

__version__ = "0.1.0"
