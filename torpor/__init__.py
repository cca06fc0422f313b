"""Torpor: a durable runtime for long-waiting LLM agents, built on Kafka."""

from __future__ import annotations

from torpor import native

__version__ = "0.1.0"

# Before any module of the compiled core can be imported: its build, or its sources.
native.choose()
