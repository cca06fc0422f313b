package example.torpor;

import java.util.Properties;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;
import org.apache.kafka.common.utils.Utils;

/**
 * Topic names ({@code <prefix>inputs}, ...) and client settings. Every record is keyed by its
 * thread id (UTF-8); the Java producer's default partitioner puts a keyed record on {@code
 * toPositive(murmur2(key)) % partitions}, the partition Torpor expects, so nothing is set.
 */
public record Topics(String bootstrap, String prefix) {
  public String inputs() {
    return prefix + "inputs";
  }

  public String outbox() {
    return prefix + "outbox";
  }

  public String events() {
    return prefix + "events";
  }

  public String receipts() {
    return prefix + "receipts";
  }

  /** The partition of a thread's records on a topic of {@code partitions} partitions. */
  public static int partitionOf(String threadId, int partitions) {
    byte[] key = threadId.getBytes(java.nio.charset.StandardCharsets.UTF_8);
    return Utils.toPositive(Utils.murmur2(key)) % partitions;
  }

  public Properties producer() {
    Properties p = new Properties();
    p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
    p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
    p.put(ProducerConfig.ACKS_CONFIG, "all");
    p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, true);
    return p;
  }

  /** A consumer that sees committed records only (the processor writes in transactions). */
  public Properties consumer(String group) {
    Properties p = new Properties();
    p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
    p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
    p.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
    p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, false);
    p.put(ConsumerConfig.ALLOW_AUTO_CREATE_TOPICS_CONFIG, false);
    if (group != null) {
      p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
      p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
    }
    return p;
  }
}
