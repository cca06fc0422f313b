"""streams/config.py: precedence, validation messages, secrets kept out of reprs, librdkafka dicts."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from torpor.processors.models.stage import StageConfig
from torpor.processors.store import kv
from torpor.schemas.errors import ConfigError
from torpor.streams.config import (
    MANAGED_KEYS,
    TRANSACTION_TIMEOUT_MS,
    KafkaSettings,
    MemorySettings,
    SaslMechanism,
    SchemaRegistrySettings,
    Secret,
    SecurityProtocol,
    Settings,
    TopicSettings,
    admin_config,
    consumer_config,
    load_settings,
    producer_config,
)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "torpor.toml"
    path.write_text(text, encoding="utf-8")
    return path


def sasl_settings() -> Settings:
    return Settings(
        kafka=KafkaSettings(
            bootstrap_servers="broker-1:9093,broker-2:9093",
            security_protocol=SecurityProtocol.SASL_SSL,
            sasl_mechanism=SaslMechanism.SCRAM_SHA_512,
            sasl_username="torpor",
            sasl_password=Secret("hunter2-very-secret"),
        )
    )


# --- precedence -------------------------------------------------------------------------


def test_no_file_and_no_variables_gives_the_documented_defaults() -> None:
    settings = load_settings({}, None)

    assert settings == Settings()
    assert settings.kafka.bootstrap_servers == "localhost:9092"
    # No replication factor: new topics follow the cluster's size (topics.replication_for).
    assert settings.topics == TopicSettings(prefix="torpor.", partitions=6, replication_factor=None)
    assert settings.schema_registry.url is None


def test_the_file_overrides_defaults_and_variables_override_the_file(tmp_path: Path) -> None:
    file = write(
        tmp_path,
        """
        [kafka]
        bootstrap_servers = "file-broker:9092"
        client_id_prefix = "from-file"

        [topics]
        prefix = "file."
        partitions = 12

        [schema_registry]
        url = "http://file-registry:8081"
        """,
    )
    env = {"TORPOR_BOOTSTRAP": "env-broker:19092", "TORPOR_PARTITIONS": "3", "UNRELATED": "x"}

    from_file = load_settings({}, file)
    both = load_settings(env, file)

    assert from_file.kafka.bootstrap_servers == "file-broker:9092"
    assert from_file.topics.partitions == 12
    assert both.kafka.bootstrap_servers == "env-broker:19092"
    assert both.topics.partitions == 3
    # What the environment does not set still comes from the file, then the defaults.
    assert both.kafka.client_id_prefix == "from-file"
    assert both.topics.prefix == "file."
    assert both.topics.replication_factor is None
    assert both.schema_registry.url == "http://file-registry:8081"


def test_every_documented_variable_is_read() -> None:
    env = {
        "TORPOR_BOOTSTRAP": "a:1,b:2",
        "TORPOR_CLIENT_ID_PREFIX": "svc",
        "TORPOR_SECURITY_PROTOCOL": "sasl_ssl",
        "TORPOR_SASL_MECHANISM": "SCRAM-SHA-256",
        "TORPOR_SASL_USERNAME": "user",
        "TORPOR_SASL_PASSWORD": "pw",
        "TORPOR_TOPIC_PREFIX": "prod.",
        "TORPOR_PARTITIONS": "24",
        "TORPOR_REPLICATION_FACTOR": "3",
        "TORPOR_SCHEMA_REGISTRY_URL": "https://registry:8081",
    }

    settings = load_settings(env, None)

    assert settings.kafka == KafkaSettings(
        bootstrap_servers="a:1,b:2",
        client_id_prefix="svc",
        security_protocol=SecurityProtocol.SASL_SSL,
        sasl_mechanism=SaslMechanism.SCRAM_SHA_256,
        sasl_username="user",
        sasl_password=Secret("pw"),
    )
    assert settings.topics == TopicSettings(prefix="prod.", partitions=24, replication_factor=3)
    assert settings.schema_registry.url == "https://registry:8081"


def test_an_empty_optional_variable_clears_what_the_file_set(tmp_path: Path) -> None:
    file = write(tmp_path, '[schema_registry]\nurl = "http://registry:8081"\n')

    settings = load_settings({"TORPOR_SCHEMA_REGISTRY_URL": ""}, file)

    assert settings.schema_registry.url is None


def test_librdkafka_overrides_come_from_the_file_as_strings(tmp_path: Path) -> None:
    file = write(
        tmp_path,
        """
        [kafka.librdkafka]
        "socket.keepalive.enable" = true
        "transaction.timeout.ms" = 30000
        "debug" = "broker,topic"
        """,
    )

    settings = load_settings({}, file)

    assert settings.kafka.librdkafka_overrides == (
        ("debug", "broker,topic"),
        ("socket.keepalive.enable", "true"),
        ("transaction.timeout.ms", "30000"),
    )
    # Overrides go last, so an operator can tune what Torpor does not manage.
    assert producer_config(settings, transactional_id="t")["transaction.timeout.ms"] == "30000"
    assert admin_config(settings)["debug"] == "broker,topic"


def test_sections_of_other_packages_in_the_file_are_left_alone(tmp_path: Path) -> None:
    file = write(tmp_path, '[model]\nprovider = "scripted"\n[topics]\npartitions = 2\n')

    assert load_settings({}, file).topics.partitions == 2


# --- validation: every message says what to fix ----------------------------------------


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"TORPOR_BOOTSTRAP": "localhost"}, "TORPOR_BOOTSTRAP"),
        ({"TORPOR_BOOTSTRAP": "localhost:99999"}, "port from 1 to 65535"),
        ({"TORPOR_BOOTSTRAP": "a:1,,b:2"}, "comma-separated list of host:port"),
        ({"TORPOR_BOOTSTRAP": ""}, "TORPOR_BOOTSTRAP is set but empty"),
        ({"TORPOR_PARTITIONS": "six"}, "TORPOR_PARTITIONS='six' is not a whole number"),
        ({"TORPOR_PARTITIONS": "0"}, "set TORPOR_PARTITIONS"),
        ({"TORPOR_REPLICATION_FACTOR": "-1"}, "set TORPOR_REPLICATION_FACTOR"),
        ({"TORPOR_TOPIC_PREFIX": "bad prefix/"}, "set TORPOR_TOPIC_PREFIX"),
        ({"TORPOR_TOPIC_PREFIX": "p" * 250}, "under 250 characters"),
        ({"TORPOR_SECURITY_PROTOCOL": "TLS"}, "PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL"),
        ({"TORPOR_SASL_MECHANISM": "GSSAPI"}, "PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"),
        ({"TORPOR_SECURITY_PROTOCOL": "SASL_SSL"}, "set TORPOR_SASL_USERNAME and TORPOR_SASL_PASSWORD"),
        ({"TORPOR_SASL_USERNAME": "u", "TORPOR_SASL_PASSWORD": "p"}, "set TORPOR_SECURITY_PROTOCOL"),
        ({"TORPOR_SCHEMA_REGISTRY_URL": "registry:8081"}, "set TORPOR_SCHEMA_REGISTRY_URL"),
        ({"TORPOR_CLIENT_ID_PREFIX": "has space"}, "set TORPOR_CLIENT_ID_PREFIX"),
        ({"TORPOR_BLOCK_CACHE_MIB": "0"}, "set TORPOR_BLOCK_CACHE_MIB"),
        ({"TORPOR_WRITE_BUFFER_MIB": "-8"}, "set TORPOR_WRITE_BUFFER_MIB"),
        ({"TORPOR_ROW_CACHE_MIB": str(1 << 40)}, "set TORPOR_ROW_CACHE_MIB"),
        ({"TORPOR_HISTORY_CACHE_ENTRIES": "many"}, "is not a whole number"),
        ({"TORPOR_CONSUMER_PREFETCH_MIB": "4096"}, "set TORPOR_CONSUMER_PREFETCH_MIB"),
    ],
)
def test_a_bad_variable_is_refused_with_what_to_fix(env: dict[str, str], expected: str) -> None:
    with pytest.raises(ConfigError, match=expected.replace("[", r"\[").replace("(", r"\(")):
        load_settings(env, None)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[topics]\npartitons = 3\n", "unknown key 'partitons' in \\[topics\\]"),
        ('[topics]\npartitions = "3"\n', "\\[topics\\] partitions must be a int"),
        ("[topics]\npartitions = true\n", "\\[topics\\] partitions must be a int"),
        ("[kafka]\nbootstrap_servers = 9092\n", "bootstrap_servers must be a str"),
        ("[kafka\n", "is not valid TOML"),
        ('topics = "flat"\n', "\\[topics\\] must be a table"),
        ('[kafka.librdkafka]\n"isolation.level" = "read_uncommitted"\n', "managed by Torpor"),
        ('[kafka.librdkafka]\n"partitioner" = "consistent"\n', "murmur2_random"),
        ('[kafka.librdkafka]\n"x" = [1, 2]\n', "must be a string, integer or boolean"),
    ],
)
def test_a_bad_file_is_refused_with_what_to_fix(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        load_settings({}, write(tmp_path, text))


def test_a_missing_file_is_refused_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"

    with pytest.raises(ConfigError, match=f"cannot read config file {missing}"):
        load_settings({}, missing)


def test_every_managed_key_is_refused_as_an_override() -> None:
    for key in MANAGED_KEYS:
        with pytest.raises(ConfigError, match=f"'{key}' is managed by Torpor"):
            KafkaSettings(librdkafka_overrides=((key, "x"),))


def test_settings_are_frozen() -> None:
    settings = Settings()

    with pytest.raises(AttributeError):
        settings.topics.partitions = 3  # type: ignore[misc]


# --- secrets ----------------------------------------------------------------------------


def test_the_sasl_password_never_appears_in_a_repr_or_str() -> None:
    settings = sasl_settings()

    for text in (repr(settings), str(settings), repr(settings.kafka), str(settings.kafka.sasl_password)):
        assert "hunter2" not in text
    assert "sasl_username='torpor'" in repr(settings.kafka)
    assert settings.kafka.sasl_password is not None
    assert settings.kafka.sasl_password.reveal() == "hunter2-very-secret"


def test_override_values_and_registry_credentials_stay_out_of_reprs() -> None:
    settings = Settings(
        kafka=KafkaSettings(librdkafka_overrides=(("ssl.key.password", "keypass-secret"),)),
        schema_registry=SchemaRegistrySettings(url="https://reg-user:reg-secret@registry:8081"),
    )

    text = repr(settings)

    assert "keypass-secret" not in text
    assert "reg-secret" not in text
    assert "https://reg-user:********@registry:8081" in text


def test_the_password_loaded_from_a_variable_is_a_secret() -> None:
    env = {
        "TORPOR_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "TORPOR_SASL_USERNAME": "u",
        "TORPOR_SASL_PASSWORD": "s3cr3t",
    }

    settings = load_settings(env, None)

    assert "s3cr3t" not in repr(settings)


# --- librdkafka dicts -------------------------------------------------------------------


def test_every_producer_partitions_like_java_and_is_idempotent() -> None:
    conf = producer_config(Settings())

    assert conf["partitioner"] == "murmur2_random"
    assert conf["enable.idempotence"] is True
    assert conf["acks"] == "all"
    assert "transactional.id" not in conf
    assert conf["bootstrap.servers"] == "localhost:9092"
    assert conf["client.id"] == "torpor-producer"


def test_a_transactional_producer_gets_its_id_and_a_bounded_transaction_timeout() -> None:
    conf = producer_config(Settings(), transactional_id="torpor-processor-0")

    assert conf["transactional.id"] == "torpor-processor-0"
    assert conf["transaction.timeout.ms"] == TRANSACTION_TIMEOUT_MS
    assert conf["partitioner"] == "murmur2_random"
    assert conf["enable.idempotence"] is True
    assert conf["client.id"] == "torpor-producer-torpor-processor-0"


def test_an_empty_transactional_id_is_refused() -> None:
    with pytest.raises(ConfigError, match="non-empty transactional id"):
        producer_config(Settings(), transactional_id=" ")


def test_a_consumer_reads_committed_and_commits_only_by_hand() -> None:
    conf = consumer_config(Settings(), "torpor-processor", instance_id="node-1")

    assert conf["group.id"] == "torpor-processor"
    assert conf["group.instance.id"] == "node-1"
    assert conf["isolation.level"] == "read_committed"
    assert conf["enable.auto.commit"] is False
    assert conf["enable.auto.offset.store"] is False
    assert conf["partition.assignment.strategy"] == "cooperative-sticky"
    assert conf["auto.offset.reset"] == "earliest"


def test_a_consumer_without_an_instance_id_is_a_dynamic_member() -> None:
    conf = consumer_config(Settings(), "observers")

    assert "group.instance.id" not in conf
    with pytest.raises(ConfigError, match="non-empty group id"):
        consumer_config(Settings(), "")


def test_sasl_credentials_reach_every_client_config() -> None:
    settings = sasl_settings()

    for conf in (producer_config(settings), consumer_config(settings, "g"), admin_config(settings)):
        assert conf["security.protocol"] == "SASL_SSL"
        assert conf["sasl.mechanism"] == "SCRAM-SHA-512"
        assert conf["sasl.username"] == "torpor"
        assert conf["sasl.password"] == "hunter2-very-secret"


def test_the_admin_config_carries_connection_settings_only() -> None:
    conf = admin_config(Settings())

    assert conf == {
        "bootstrap.servers": "localhost:9092",
        "security.protocol": "PLAINTEXT",
        "metadata.recovery.strategy": "none",
        "allow.auto.create.topics": False,
        "client.id": "torpor-admin",
    }


def test_no_client_makes_the_broker_create_a_topic_and_no_override_can_let_it(tmp_path: Path) -> None:
    for conf in (producer_config(Settings(), transactional_id="t"), consumer_config(Settings(), "g"),
                 admin_config(Settings())):
        assert conf["allow.auto.create.topics"] is False
    with pytest.raises(ConfigError, match="topics are created on purpose"):
        load_settings({}, write(tmp_path, '[kafka.librdkafka]\n"allow.auto.create.topics" = true\n'))


def test_no_client_re_bootstraps_unless_told_to() -> None:
    # librdkafka#5511: a re-bootstrap leaves a transactional producer waiting for a dropped
    # group coordinator (what the fault soak's broker restart ran into).
    for conf in (producer_config(Settings(), transactional_id="t"), consumer_config(Settings(), "g"),
                 admin_config(Settings())):
        assert conf["metadata.recovery.strategy"] == "none"
    override = (("metadata.recovery.strategy", "rebootstrap"),)
    told = Settings(kafka=KafkaSettings(librdkafka_overrides=override))
    assert producer_config(told)["metadata.recovery.strategy"] == "rebootstrap"


def test_every_consumer_prefetches_within_the_memory_section_and_an_override_still_wins() -> None:
    assert consumer_config(Settings(), "g")["queued.max.messages.kbytes"] == 16 * 1024
    small = Settings(memory=MemorySettings(consumer_prefetch_mib=2))
    assert consumer_config(small, "g", instance_id="i")["queued.max.messages.kbytes"] == 2048
    assert "queued.max.messages.kbytes" not in producer_config(small, transactional_id="t")
    override = Settings(kafka=KafkaSettings(librdkafka_overrides=(("queued.max.messages.kbytes", "1024"),)))
    assert consumer_config(override, "g")["queued.max.messages.kbytes"] == "1024"
    for bad in (0, 2048):
        with pytest.raises(ConfigError, match="consumer_prefetch_mib must be between 1 and 2047"):
            MemorySettings(consumer_prefetch_mib=bad)
    # librdkafka takes the largest allowed (and the smallest) when a client is built.
    for mib in (1, 2047):
        Consumer(consumer_config(Settings(memory=MemorySettings(consumer_prefetch_mib=mib)), "g")).close()


def test_librdkafka_accepts_every_dict_it_is_given() -> None:
    # librdkafka validates a configuration when a client is built, before it connects,
    # so this needs no broker: a misspelt property or value fails here.
    settings = Settings(kafka=KafkaSettings(librdkafka_overrides=(("log_level", "0"),)))

    Producer(producer_config(settings))
    Producer(producer_config(settings, transactional_id="t"))
    Consumer(consumer_config(settings, "g", instance_id="i")).close()
    AdminClient(admin_config(settings))


def test_the_caches_are_bounded_by_the_memory_section_and_its_variables(tmp_path: Path) -> None:
    defaults = load_settings({}, None).memory
    assert defaults == MemorySettings(64, 16, 32, 49_152, 16)
    # The same defaults where no settings are read (local mode, the stores' own).
    in_mib = (defaults.block_cache_mib, defaults.row_cache_mib, defaults.write_buffer_mib)
    in_bytes = (kv.BLOCK_CACHE_BYTES, kv.ROW_CACHE_BYTES, kv.WRITE_BUFFER_BYTES)
    assert tuple(mib << 20 for mib in in_mib) == in_bytes
    assert defaults.history_cache_entries == StageConfig().history_cache_entries
    file = tmp_path / "torpor.toml"
    file.write_text("[memory]\nblock_cache_mib = 16\nrow_cache_mib = 0\nhistory_cache_entries = 1000\n")
    both = load_settings({"TORPOR_WRITE_BUFFER_MIB": "2", "TORPOR_BLOCK_CACHE_MIB": "32",
                          "TORPOR_CONSUMER_PREFETCH_MIB": "4"}, file)
    assert both.memory == MemorySettings(block_cache_mib=32, row_cache_mib=0, write_buffer_mib=2,
                                         history_cache_entries=1000, consumer_prefetch_mib=4)


def test_workers_share_the_memory_budgets_and_their_variables_say_exactly_the_share(tmp_path: Path) -> None:
    file = tmp_path / "torpor.toml"
    file.write_text("[memory]\nblock_cache_mib = 100\nrow_cache_mib = 1\nhistory_cache_entries = 7\n")
    whole = load_settings({"TORPOR_WRITE_BUFFER_MIB": "33"}, file).memory
    half = whole.share(2)
    # Split evenly, rounded down, never below a budget's least (1 MiB of write buffer and
    # block cache) and never 0 where the budget is not (0 turns a cache off); the prefetch
    # bound is per consumer, so each worker keeps it.
    assert half == MemorySettings(block_cache_mib=50, row_cache_mib=1, write_buffer_mib=16,
                                  history_cache_entries=3, consumer_prefetch_mib=16)
    assert whole.share(64) == MemorySettings(1, 1, 1, 1, 16)
    assert whole.share(1) == whole
    off = MemorySettings(row_cache_mib=0, history_cache_entries=0)
    assert (off.share(3).row_cache_mib, off.share(3).history_cache_entries) == (0, 0)
    # A worker reads the file too: the variables it is given must win and give the share.
    assert load_settings(half.environment(), file).memory == half
    with pytest.raises(ValueError, match="among 0 workers"):
        whole.share(0)
