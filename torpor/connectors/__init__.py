"""The connector runtime, keys and the signer, and the built-in connectors."""
