package example.torpor;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;


import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.InputStream;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.security.KeyFactory;
import java.security.PrivateKey;
import java.security.PublicKey;
import java.security.Signature;
import java.security.spec.X509EncodedKeySpec;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import org.apache.avro.Schema;
import org.apache.avro.SchemaNormalization;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.generic.GenericRecordBuilder;
import org.apache.avro.message.MissingSchemaException;
import org.apache.kafka.common.utils.Utils;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.function.Executable;

/**
 * The test vectors of docs/wire-contract.md (docs/wire-contract-vectors.json), computed with
 * Apache Avro, the Kafka Java client, the JDK's Ed25519 and this example's code. Torpor's
 * Python tests assert the same file, so both sides agree byte for byte.
 */
class WireContractTest {
  private static final HexFormat HEX = HexFormat.of();
  private static JsonNode vectors;

  @BeforeAll
  static void load() throws Exception {
    try (InputStream in = WireContractTest.class.getResourceAsStream("/wire-contract-vectors.json")) {
      vectors = new ObjectMapper().readTree(in);
    }
  }

  @Test
  void fingerprintIsCrc64AvroWrittenLittleEndian() {
    JsonNode v = vectors.get("fingerprint");
    Schema schema = new Schema.Parser().parse(v.get("schema").asText());
    long fingerprint = SchemaNormalization.parsingFingerprint64(schema);
    assertEquals(v.get("value").asText(), String.format("%016x", fingerprint));
    byte[] header = ByteBuffer.allocate(8).order(ByteOrder.LITTLE_ENDIAN).putLong(fingerprint).array();
    assertEquals(v.get("header").asText(), HEX.formatHex(header));
    // The mistake the guide warns about: Java's default (big-endian) order gives other bytes.
    byte[] wrong = ByteBuffer.allocate(8).putLong(fingerprint).array();
    assertEquals(v.get("value").asText(), HEX.formatHex(wrong));
  }

  @Test
  void shippedSchemasHaveThePublishedFingerprints() {
    for (String name : List.of("Input", "Dispatch", "ThreadEvent", "Receipt", "HistoryEntry")) {
      long fingerprint = SchemaNormalization.parsingFingerprint64(Schemas.load(name));
      byte[] header = ByteBuffer.allocate(8).order(ByteOrder.LITTLE_ENDIAN).putLong(fingerprint).array();
      assertEquals(vectors.get("shipped_fingerprints").get(name).asText(), HEX.formatHex(header), name);
    }
  }

  @Test
  void idsFollowTheIdRule() {
    for (JsonNode v : vectors.get("ids")) {
      List<String> args = new ArrayList<>();
      v.get("args").forEach(a -> args.add(a.asText()));
      String[] parts = args.subList(1, args.size()).toArray(String[]::new);
      assertEquals(v.get("id").asText(), Ids.deriveId(args.get(0), parts), args.toString());
    }
  }

  @Test
  void threadsLandOnTheMurmur2Partition() {
    for (JsonNode v : vectors.get("partitions")) {
      byte[] key = v.get("key").asText().getBytes(StandardCharsets.UTF_8);
      assertEquals(v.get("murmur2").asInt(), Utils.murmur2(key), v.get("key").asText());
      assertEquals(v.get("of_6").asInt(), Topics.partitionOf(v.get("key").asText(), 6));
      assertEquals(v.get("of_7").asInt(), Topics.partitionOf(v.get("key").asText(), 7));
    }
  }

  @Test
  void signingBytesSignatureAndEncodingMatchTheVector() throws Exception {
    JsonNode v = vectors.get("signing");
    GenericRecord input = vectorInput(v.get("input"));
    PrivateKey key = Signing.privateKeyFromSeed(HEX.parseHex(v.get("seed").asText()));

    assertEquals(v.get("body_bytes").asText(), HEX.formatHex(Framing.body((GenericRecord) input.get("body"))));
    GenericData.Record withKeyId = new GenericData.Record((GenericData.Record) input, true);
    withKeyId.put("key_id", v.get("key_id").asText());
    assertEquals(v.get("signing_bytes").asText(), HEX.formatHex(Signing.signingBytes(withKeyId)));

    GenericRecord signed = Signing.sign(input, v.get("key_id").asText(), key);
    ByteBuffer signature = (ByteBuffer) signed.get("signature");
    assertEquals(v.get("signature").asText(), HEX.formatHex(signature.array()));
    assertEquals(v.get("single_object").asText(), HEX.formatHex(Framing.encode(signed)));

    // The published public key verifies it (what the processor does with its key ring).
    Signature verifier = Signature.getInstance("Ed25519");
    verifier.initVerify(publicKey(HEX.parseHex(v.get("public_key").asText())));
    verifier.update(HEX.parseHex(v.get("signing_bytes").asText()));
    assertTrue(verifier.verify(HEX.parseHex(v.get("signature").asText())));

    // And Torpor's bytes read back into the same record.
    GenericRecord decoded = Framing.decode(Schemas.INPUT, HEX.parseHex(v.get("single_object").asText()));
    assertEquals(signed.toString(), decoded.toString());
  }

  @Test
  void aSchemaWithOneMoreOptionalFieldHasAnotherFingerprint() {
    // The writer-schema rule: change the shipped schema by one optional field and no Torpor
    // reader knows the fingerprint; here Avro's own decoder, holding only the shipped schema,
    // refuses it the same way the processor does (it parks the record).
    String text = Schemas.INPUT.toString();
    String changed =
        text.replaceFirst(
            "\\{\"name\":\"message_id\"",
            "{\"name\":\"priority\",\"type\":[\"null\",\"long\"],\"default\":null},{\"name\":\"message_id\"");
    Schema evolved = new Schema.Parser().parse(changed);
    GenericRecord record =
        new GenericRecordBuilder(evolved)
            .set("message_id", "m1")
            .set("thread_id", "t1")
            .set("created_at", 1L)
            .set("source", "user:a")
            .set("body", userMessage(evolved))
            .build();
    byte[] bytes = Framing.encode(record);
    Executable decode = () -> Framing.decode(Schemas.INPUT, bytes);
    assertThrows(MissingSchemaException.class, decode);
  }

  private static GenericRecord userMessage(Schema input) {
    Schema body = Schemas.branch(input.getField("body").schema(), "UserMessage");
    Schema text = Schemas.named(input, "TextBlock");
    return new GenericRecordBuilder(body)
        .set("content", List.of(new GenericRecordBuilder(text).set("text", "hi").build()))
        .build();
  }

  private static GenericRecord vectorInput(JsonNode v) {
    JsonNode result = v.get("body").get("ToolResult");
    GenericRecord body =
        Inputs.toolResult(
            result.get("call_id").asText(),
            result.get("request_id").asText(),
            result.get("ok").asBoolean(),
            result.get("content").get(0).get("TextBlock").get("text").asText());
    return new GenericRecordBuilder(Schemas.INPUT)
        .set("message_id", v.get("message_id").asText())
        .set("thread_id", v.get("thread_id").asText())
        .set("created_at", v.get("created_at").asLong())
        .set("source", v.get("source").asText())
        .set("body", body)
        .build();
  }

  private static PublicKey publicKey(byte[] raw) throws Exception {
    // X.509 SubjectPublicKeyInfo for Ed25519: a fixed 12-byte prefix, then the raw key.
    byte[] prefix = HEX.parseHex("302a300506032b6570032100");
    byte[] der = new byte[prefix.length + raw.length];
    System.arraycopy(prefix, 0, der, 0, prefix.length);
    System.arraycopy(raw, 0, der, prefix.length, raw.length);
    return KeyFactory.getInstance("Ed25519").generatePublic(new X509EncodedKeySpec(der));
  }
}
