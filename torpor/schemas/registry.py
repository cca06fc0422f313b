"""A Confluent-compatible Schema Registry, as the codec needs it: register and look up.

`SchemaRegistry` wraps `confluent_kafka.schema_registry.SchemaRegistryClient` (or its
in-process twin for ``mock://`` URLs) and caches what it learns, so a producer talks to
the registry once per (subject, schema) and a consumer once per schema id:

- `register(subject, schema_text) -> int`: the id of the Avro schema under `subject`
  (``<topic>-value``), registering it if it is new. With ``auto_register=False`` (for
  registries where only CI registers schemas) it only looks the schema up. Raises
  `ContractError` if the registry refuses the schema (for instance as incompatible
  with the subject's earlier versions) or, without auto-registration, lacks it; and
  `RetriableError` if the registry cannot be reached or fails.
- `schema_text(schema_id) -> str | None`: the schema registered under `schema_id`, or
  None if the registry does not know the id. Raises `RetriableError` as above.

Any registry with the Confluent API works: Confluent Schema Registry, Apicurio Registry
(at ``/apis/ccompat/v7``), Karapace, Redpanda.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from typing import Final

from confluent_kafka.schema_registry import Schema, SchemaRegistryClient, SchemaRegistryError

from torpor.schemas.errors import ConfigError, ContractError, RetriableError

AVRO: Final = "AVRO"
_NOT_FOUND: Final = 404
_CLIENT_ERRORS: Final = range(400, 500)


def redact(url: str) -> str:
    """`url` with any ``user:password@`` userinfo replaced by ``***@``, for logs and errors."""
    return re.sub(r"//[^/@]*@", "//***@", url)


class SchemaRegistry:
    """Register and look up the Avro schemas of Torpor's topics, with caches.

    Thread-safe: the caches are guarded by a lock; the client is safe to share.
    """

    __slots__ = ("_client", "_ids", "_lock", "_texts", "auto_register", "url")

    def __init__(self, client: SchemaRegistryClient, url: str = "?", *, auto_register: bool = True) -> None:
        self._client = client
        self.url = redact(url)
        self.auto_register = auto_register
        self._ids: dict[tuple[str, str], int] = {}
        self._texts: dict[int, str] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_url(
        cls, url: str, conf: Mapping[str, str | int] | None = None, *, auto_register: bool = True
    ) -> SchemaRegistry:
        """A registry client for `url`; ``mock://<name>`` gives confluent-kafka's in-process twin.

        `conf` holds further client settings (``basic.auth.user.info``, TLS paths). Raises
        `ConfigError` if the client rejects the URL or a setting.
        """
        try:
            client = SchemaRegistryClient.new_client({**(conf or {}), "url": url})
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"schema registry {redact(url)!r}: {exc}") from exc
        return cls(client, url, auto_register=auto_register)

    def __repr__(self) -> str:
        # The client config may hold credentials; only the redacted URL is shown.
        return f"SchemaRegistry(url={self.url!r})"

    def register(self, subject: str, schema_text: str) -> int:
        """The id of Avro schema `schema_text` under `subject`, registering it if new."""
        key = (subject, schema_text)
        with self._lock:
            cached = self._ids.get(key)
        if cached is not None:
            return cached
        try:
            found: int | None
            if self.auto_register:
                found = self._client.register_schema(subject, Schema(schema_text, AVRO))
            else:
                found = self._client.lookup_schema(subject, Schema(schema_text, AVRO)).schema_id
        except SchemaRegistryError as exc:
            if exc.http_status_code == _NOT_FOUND and not self.auto_register:
                raise ContractError(
                    f"schema registry {self.url} has no such schema under subject {subject!r} and "
                    "auto-registration is off: register this build's schema first"
                ) from exc
            if exc.http_status_code in _CLIENT_ERRORS:
                raise ContractError(
                    f"schema registry {self.url} refused the schema for subject {subject!r}: "
                    f"{exc.error_message} (code {exc.error_code}); check the subject's "
                    "compatibility setting and earlier versions"
                ) from exc
            raise RetriableError(f"schema registry {self.url} failed to register {subject!r}: {exc}") from exc
        except Exception as exc:  # the HTTP client raises its own transport errors
            raise RetriableError(f"schema registry {self.url} unreachable: {exc}") from exc
        if found is None:
            raise RetriableError(f"schema registry {self.url} returned no schema id for {subject!r}")
        schema_id = int(found)
        with self._lock:
            self._ids[key] = schema_id
            self._texts.setdefault(schema_id, schema_text)
        return schema_id

    def schema_text(self, schema_id: int) -> str | None:
        """The Avro schema registered as `schema_id`, or None if the registry lacks it."""
        with self._lock:
            cached = self._texts.get(schema_id)
        if cached is not None:
            return cached
        try:
            schema = self._client.get_schema(schema_id)
        except SchemaRegistryError as exc:
            if exc.http_status_code == _NOT_FOUND:
                return None
            raise RetriableError(
                f"schema registry {self.url} failed to look up id {schema_id}: {exc}"
            ) from exc
        except Exception as exc:  # the HTTP client raises its own transport errors
            raise RetriableError(f"schema registry {self.url} unreachable: {exc}") from exc
        if schema.schema_type not in (None, AVRO):
            return None
        text = str(schema.schema_str)
        with self._lock:
            self._texts[schema_id] = text
        return text
