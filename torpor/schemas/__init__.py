"""The wire contract: Avro schemas, their codec and framing, signing and message ids."""
