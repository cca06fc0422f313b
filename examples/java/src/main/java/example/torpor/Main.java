package example.torpor;

import java.nio.file.Path;
import java.security.PrivateKey;
import java.time.Duration;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.apache.avro.generic.GenericRecord;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.Producer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;

/**
 * A Torpor client in Java: starts a thread with one tool, sends it a message, serves the tool
 * as a connector (signed answers), and follows the thread's events and receipts until the tool
 * round trip is done: the tool's result applied and the model's answer after it committed.
 *
 * <pre>
 * java -jar target/torpor-java-example.jar --bootstrap 127.0.0.1:9092 --thread java-1 \
 *     --text "please reverse hello" \
 *     --connector-key-id java-1 --connector-key keys/java-1.pem \
 *     [--user-key-id gw-1 --user-key keys/gw-1.pem] [--prefix torpor.] [--timeout 120]
 * </pre>
 *
 * Exit status: 0 when the round trip completed (and, with a connector key, the result's
 * receipt says {@code verified}); 1 when an input of this client was refused or nothing
 * completed in time; 2 for bad arguments.
 */
public final class Main {
  private Main() {}

  public static void main(String[] args) throws Exception {
    Map<String, String> options = parse(args);
    if (options == null) {
      System.exit(2);
    }
    Topics topics = new Topics(options.get("bootstrap"), options.getOrDefault("prefix", "torpor."));
    String thread = options.get("thread");
    Duration timeout = Duration.ofSeconds(Long.parseLong(options.getOrDefault("timeout", "120")));
    PrivateKey connectorKey = key(options, "connector-key");
    PrivateKey userKey = key(options, "user-key");

    int status;
    try (Producer<String, byte[]> producer = new KafkaProducer<>(topics.producer());
        KafkaConsumer<String, byte[]> follower = new KafkaConsumer<>(topics.consumer(null))) {
      ReverseConnector connector =
          new ReverseConnector(
              topics,
              producer,
              options.getOrDefault("connector-name", "java"),
              options.get("connector-key-id"),
              connectorKey);
      Thread connectorThread = new Thread(connector, "connector");
      connectorThread.start();
      try {
        // Follow from the end as it is now, before anything is sent: nothing is missed.
        List<TopicPartition> partitions =
            List.of(partitionOf(follower, topics.events(), thread), partitionOf(follower, topics.receipts(), thread));
        follower.assign(partitions);
        follower.seekToEnd(partitions);
        partitions.forEach(follower::position);

        String user = "user:" + options.getOrDefault("user", "java-example");
        GenericRecord tool =
            Inputs.tool(ReverseConnector.TOOL, "Reverse a text.", ReverseConnector.PARAMETERS, "java");
        GenericRecord create =
            Inputs.createThread(
                options.getOrDefault("model", "scripted"),
                "You reverse texts with the reverse_text tool.",
                tool,
                options.getOrDefault("tenant", "default"));
        List<GenericRecord> inputs =
            List.of(
                Inputs.envelope(thread + "-create", thread, user, create),
                Inputs.envelope(thread + "-message-1", thread, user, Inputs.userMessage(options.get("text"))));
        for (GenericRecord input : inputs) {
          GenericRecord sent = userKey == null ? input : Signing.sign(input, options.get("user-key-id"), userKey);
          producer.send(new ProducerRecord<>(topics.inputs(), thread, Framing.encode(sent))).get();
          System.out.printf("sent %s%n", sent.get("message_id"));
        }
        status = follow(follower, topics, thread, inputs, connector, connectorKey != null, timeout);
      } finally {
        connector.stop();
        connectorThread.join(10_000);
      }
    }
    System.exit(status);
  }

  /** Prints the thread's events and receipts until the round trip completes, fails or times out. */
  private static int follow(
      KafkaConsumer<String, byte[]> follower,
      Topics topics,
      String thread,
      List<GenericRecord> sent,
      ReverseConnector connector,
      boolean signed,
      Duration timeout) {
    List<String> ours = sent.stream().map(i -> i.get("message_id").toString()).toList();
    long deadline = System.nanoTime() + timeout.toNanos();
    GenericRecord resultReceipt = null;
    Long resultSeq = null;
    boolean answered = false;
    while (System.nanoTime() < deadline) {
      for (ConsumerRecord<String, byte[]> record : follower.poll(Duration.ofMillis(200))) {
        if (!thread.equals(record.key())) {
          continue; // another thread on the same partition
        }
        if (record.topic().equals(topics.receipts())) {
          GenericRecord receipt = Framing.decode(Schemas.RECEIPT, record.value());
          String input = receipt.get("input_id").toString();
          String disposition = receipt.get("disposition").toString();
          System.out.printf(
              "receipt %-12s %-10s %s%s%n",
              disposition,
              receipt.get("provenance"),
              input,
              receipt.get("reason") == null ? "" : " (" + receipt.get("reason") + ")");
          boolean mine = ours.contains(input) || connector.answered().containsKey(input);
          if (mine && !disposition.equals("applied") && !disposition.equals("duplicate")) {
            System.out.printf("FAILED: input %s was %s%n", input, disposition);
            return 1;
          }
          if (connector.answered().containsKey(input)) {
            resultReceipt = receipt;
          }
        } else {
          GenericRecord event = Framing.decode(Schemas.THREAD_EVENT, record.value());
          GenericRecord entry = (GenericRecord) event.get("entry");
          System.out.printf("event   %-20s %s%n", event.get("kind"), describe(event, entry));
          if (entry == null) {
            continue;
          }
          GenericRecord body = (GenericRecord) entry.get("body");
          long seq = (Long) entry.get("seq");
          String type = body.getSchema().getName();
          if (type.equals("ToolResultEntry") && ReverseConnector.TOOL.equals(body.get("name").toString())) {
            resultSeq = seq;
          } else if (type.equals("AssistantEntry")
              && resultSeq != null
              && seq > resultSeq
              && ((List<?>) body.get("tool_calls")).isEmpty()) {
            answered = true;
          }
        }
      }
      if (resultReceipt != null && answered) {
        String provenance = resultReceipt.get("provenance").toString();
        if (signed && !provenance.equals("verified")) {
          System.out.printf("FAILED: the signed result was judged %s%n", provenance);
          return 1;
        }
        System.out.printf("round trip complete: result %s applied, %s%n", resultReceipt.get("input_id"), provenance);
        return 0;
      }
    }
    System.out.printf("FAILED: no round trip within %d s%n", timeout.toSeconds());
    return 1;
  }

  private static String describe(GenericRecord event, GenericRecord entry) {
    if (entry == null) {
      Object text = event.get("text");
      Object data = event.get("data");
      return (text == null ? "" : text + " ") + (data == null ? "" : data);
    }
    GenericRecord body = (GenericRecord) entry.get("body");
    StringBuilder out = new StringBuilder("#" + entry.get("seq") + " " + body.getSchema().getName() + ":");
    Object content = body.getSchema().getField("content") == null ? null : body.get("content");
    if (content instanceof List<?> blocks) {
      for (Object block : blocks) {
        GenericRecord b = (GenericRecord) block;
        if (b.getSchema().getField("text") != null && b.getSchema().getName().equals("TextBlock")) {
          out.append(' ').append(b.get("text"));
        }
      }
    }
    if (body.getSchema().getField("tool_calls") != null) {
      for (Object call : (List<?>) body.get("tool_calls")) {
        GenericRecord c = (GenericRecord) call;
        out.append(" | calls ").append(c.get("name")).append(c.get("arguments"));
      }
    }
    return out.toString();
  }

  private static TopicPartition partitionOf(KafkaConsumer<String, byte[]> consumer, String topic, String thread) {
    int partitions = consumer.partitionsFor(topic, Duration.ofSeconds(30)).size();
    if (partitions == 0) {
      throw new IllegalStateException("topic " + topic + " does not exist: create Torpor's topics first");
    }
    return new TopicPartition(topic, Topics.partitionOf(thread, partitions));
  }

  private static PrivateKey key(Map<String, String> options, String name) throws Exception {
    String path = options.get(name);
    if ((path == null) != (options.get(name + "-id") == null)) {
      throw new IllegalArgumentException("give both --" + name + "-id and --" + name);
    }
    return path == null ? null : Signing.loadPrivateKey(Path.of(path));
  }

  private static Map<String, String> parse(String[] args) {
    Map<String, String> options = new HashMap<>();
    for (int i = 0; i + 1 < args.length; i += 2) {
      if (!args[i].startsWith("--")) {
        break;
      }
      options.put(args[i].substring(2), args[i + 1]);
    }
    if (args.length % 2 != 0 || !options.containsKey("bootstrap") || !options.containsKey("thread")
        || !options.containsKey("text")) {
      System.err.println(
          "usage: --bootstrap HOST:PORT --thread ID --text TEXT [--prefix torpor.] [--timeout S]\n"
              + "       [--connector-key-id ID --connector-key PEM] [--user-key-id ID --user-key PEM]\n"
              + "       [--connector-name java] [--user java-example] [--tenant default] [--model scripted]");
      return null;
    }
    return options;
  }
}
