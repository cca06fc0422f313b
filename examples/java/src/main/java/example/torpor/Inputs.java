package example.torpor;

import java.util.List;
import org.apache.avro.Schema;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.generic.GenericRecordBuilder;

/**
 * Builds {@code Input} envelopes and the bodies this client sends, as generic records of the
 * shipped schema. Optional fields left unset take their schema default (null).
 */
public final class Inputs {
  private static final Schema TEXT_BLOCK = Schemas.named(Schemas.INPUT, "TextBlock");
  private static final Schema CREATE_THREAD = Schemas.body("CreateThread");
  private static final Schema THREAD_CONFIG = Schemas.named(Schemas.INPUT, "ThreadConfig");
  private static final Schema TOOL_SPEC = Schemas.named(Schemas.INPUT, "ToolSpec");
  private static final Schema CAPABILITY = Schemas.named(Schemas.INPUT, "Capability");
  private static final Schema BUDGETS = Schemas.named(Schemas.INPUT, "Budgets");

  private Inputs() {}

  /** An unsigned envelope made now: sign it with {@link Signing#sign} where the ring asks. */
  public static GenericRecord envelope(
      String messageId, String threadId, String source, GenericRecord body) {
    return new GenericRecordBuilder(Schemas.INPUT)
        .set("message_id", messageId)
        .set("thread_id", threadId)
        .set("created_at", System.currentTimeMillis())
        .set("source", source)
        .set("body", body)
        .build();
  }

  public static GenericRecord text(String text) {
    return new GenericRecordBuilder(TEXT_BLOCK).set("text", text).build();
  }

  /** A tool the thread may call, with the JSON Schema of its arguments. */
  public static GenericRecord tool(String name, String description, String parametersJson, String toolset) {
    return new GenericRecordBuilder(TOOL_SPEC)
        .set("name", name)
        .set("description", description)
        .set("parameters", parametersJson)
        .set("passive", false)
        .set("toolset", toolset)
        .build();
  }

  /** A root thread with one tool, acting for {@code tenant}. */
  public static GenericRecord createThread(
      String model, String systemPrompt, GenericRecord tool, String tenant) {
    GenericRecord capability =
        new GenericRecordBuilder(CAPABILITY)
            .set("tenant", tenant)
            .set("tools", List.of(tool.get("name")))
            .set("scopes", List.of())
            .build();
    GenericRecord budgets =
        new GenericRecordBuilder(BUDGETS)
            .set("max_tool_retries", 2L)
            .set("max_invalid_calls", 3L)
            .build();
    GenericRecord config =
        new GenericRecordBuilder(THREAD_CONFIG)
            .set("model", model)
            .set("system_prompt", systemPrompt)
            .set("tools", List.of(tool))
            .set("capability", capability)
            .set("budgets", budgets)
            .set("context_window", 200_000L)
            .set("compaction_threshold", 0.8)
            .set("allow_implicit_create", false)
            .build();
    return new GenericRecordBuilder(CREATE_THREAD)
        .set("config", config)
        .set("inherited", List.of())
        .set("initial", List.of())
        .build();
  }

  public static GenericRecord userMessage(String text) {
    return new GenericRecordBuilder(Schemas.body("UserMessage"))
        .set("content", List.of(text(text)))
        .build();
  }

  /** The answer to one dispatch: {@code ok} false for a failure the model should read. */
  public static GenericRecord toolResult(String callId, String requestId, boolean ok, String text) {
    return new GenericRecordBuilder(Schemas.body("ToolResult"))
        .set("call_id", callId)
        .set("request_id", requestId)
        .set("ok", ok)
        .set("content", List.of(text(text)))
        .set("subscription", false)
        .build();
  }
}
