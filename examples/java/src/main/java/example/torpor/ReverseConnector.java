package example.torpor;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.security.PrivateKey;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import org.apache.avro.generic.GenericRecord;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.Producer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.errors.WakeupException;

/**
 * A tool connector: reads {@code Dispatch} records from the outbox (read_committed, in a
 * consumer group of its own), performs {@value #TOOL} and writes the signed {@code ToolResult}
 * back to {@code inputs}, keyed by the thread id.
 *
 * <p>The answer's message id is {@code deriveId(request_id, "result")}, so a dispatch
 * redelivered after a crash is answered with the same id and folded once. Offsets are
 * committed only after the answers are acknowledged by the broker.
 */
public final class ReverseConnector implements Runnable {
  public static final String TOOL = "reverse_text";
  public static final String PARAMETERS =
      "{\"type\":\"object\",\"properties\":{\"text\":{\"type\":\"string\"}},\"required\":[\"text\"]}";
  private static final ObjectMapper JSON = new ObjectMapper();

  private final Topics topics;
  private final Producer<String, byte[]> producer;
  private final String source;
  private final String keyId;
  private final PrivateKey key;
  private final KafkaConsumer<String, byte[]> consumer;
  /** Message id of each answer sent, to its request id: what the follower looks for. */
  private final Map<String, String> answered = new ConcurrentHashMap<>();

  /** {@code keyId} and {@code key} null: answers go unsigned (a processor without a key ring). */
  public ReverseConnector(
      Topics topics, Producer<String, byte[]> producer, String name, String keyId, PrivateKey key) {
    this.topics = topics;
    this.producer = producer;
    this.source = "connector:" + name;
    this.keyId = keyId;
    this.key = key;
    this.consumer = new KafkaConsumer<>(topics.consumer(topics.prefix() + "java-connector-" + name));
  }

  public Map<String, String> answered() {
    return answered;
  }

  @Override
  public void run() {
    try {
      consumer.subscribe(List.of(topics.outbox()));
      while (true) {
        for (ConsumerRecord<String, byte[]> record : consumer.poll(Duration.ofMillis(200))) {
          handle(record);
        }
        consumer.commitSync();
      }
    } catch (WakeupException stopping) {
      // stop() was called
    } finally {
      consumer.close(Duration.ofSeconds(5));
    }
  }

  /** Ends {@link #run()} from another thread. */
  public void stop() {
    consumer.wakeup();
  }

  private void handle(ConsumerRecord<String, byte[]> record) {
    GenericRecord dispatch;
    try {
      dispatch = Framing.decode(Schemas.DISPATCH, record.value());
    } catch (RuntimeException e) {
      System.out.printf("connector: skipped outbox %d@%d: %s%n", record.partition(), record.offset(), e);
      return;
    }
    // Other connectors serve other tools; a cancel finds nothing running here.
    if (!TOOL.equals(dispatch.get("tool").toString()) || !"invoke".equals(dispatch.get("kind").toString())) {
      return;
    }
    String requestId = dispatch.get("request_id").toString();
    String threadId = dispatch.get("thread_id").toString();
    GenericRecord result = perform(dispatch);
    GenericRecord answer =
        Inputs.envelope(Ids.deriveId(requestId, "result"), threadId, source, result);
    if (key != null) {
      answer = Signing.sign(answer, keyId, key);
    }
    try {
      producer.send(new ProducerRecord<>(topics.inputs(), threadId, Framing.encode(answer))).get();
    } catch (InterruptedException | ExecutionException e) {
      throw new IllegalStateException("could not send the answer to " + requestId, e);
    }
    answered.put(answer.get("message_id").toString(), requestId);
    System.out.printf(
        "connector: answered %s of %s (%s)%n", dispatch.get("call_id"), threadId, answer.get("message_id"));
  }

  /** The tool itself, within the dispatch's capability; a refusal is an error result. */
  private static GenericRecord perform(GenericRecord dispatch) {
    String callId = dispatch.get("call_id").toString();
    String requestId = dispatch.get("request_id").toString();
    GenericRecord capability = (GenericRecord) dispatch.get("capability");
    List<?> tools = (List<?>) capability.get("tools");
    if (tools.stream().noneMatch(t -> TOOL.equals(t.toString()))) {
      return Inputs.toolResult(callId, requestId, false, "this thread may not call " + TOOL);
    }
    try {
      JsonNode arguments = JSON.readTree(dispatch.get("arguments").toString());
      String text = arguments.path("text").asText();
      return Inputs.toolResult(callId, requestId, true, new StringBuilder(text).reverse().toString());
    } catch (Exception e) {
      return Inputs.toolResult(callId, requestId, false, "bad arguments: " + e.getMessage());
    }
  }
}
