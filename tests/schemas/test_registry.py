"""`SchemaRegistry`: caching, and errors classified by what the caller must do."""

from __future__ import annotations

import pytest

from torpor.schemas.errors import ConfigError, ContractError, RetriableError
from torpor.schemas.registry import SchemaRegistry, redact

LONG = '"long"'


def test_register_returns_a_stable_id_and_the_text_reads_back() -> None:
    registry = SchemaRegistry.from_url("mock://test-registry")
    first = registry.register("torpor.inputs-value", LONG)
    assert registry.register("torpor.inputs-value", LONG) == first
    assert registry.schema_text(first) == LONG


def test_an_unknown_id_is_none_not_an_error() -> None:
    assert SchemaRegistry.from_url("mock://test-registry-unknown").schema_text(4242) is None


def test_an_unreachable_registry_is_retriable() -> None:
    registry = SchemaRegistry.from_url("http://127.0.0.1:9", {"max.retries": 0})
    with pytest.raises(RetriableError, match="unreachable"):
        registry.register("s-value", LONG)
    with pytest.raises(RetriableError, match="unreachable"):
        registry.schema_text(1)


def test_a_bad_url_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="Invalid url"):
        SchemaRegistry.from_url("ftp://registry")


def test_credentials_in_the_url_never_reach_a_repr_or_an_error() -> None:
    assert redact("https://user:s3cret@registry:8081/apis") == "https://***@registry:8081/apis"
    registry = SchemaRegistry.from_url("http://user:s3cret@127.0.0.1:9", {"max.retries": 0})
    assert "s3cret" not in repr(registry)
    with pytest.raises(RetriableError) as caught:
        registry.schema_text(1)
    assert "s3cret" not in str(caught.value)


def test_without_auto_registration_an_unregistered_schema_is_a_contract_error() -> None:
    registry = SchemaRegistry.from_url("mock://test-registry-locked", auto_register=False)
    with pytest.raises(ContractError, match="auto-registration is off"):
        registry.register("torpor.inputs-value", LONG)


def test_without_auto_registration_a_registered_schema_is_looked_up() -> None:
    writer = SchemaRegistry.from_url("mock://test-registry-ci")
    schema_id = writer.register("torpor.inputs-value", LONG)
    # A second client on the same registry (here: the same in-process mock client).
    reader = SchemaRegistry(writer._client, "mock://test-registry-ci", auto_register=False)
    assert reader.register("torpor.inputs-value", LONG) == schema_id
