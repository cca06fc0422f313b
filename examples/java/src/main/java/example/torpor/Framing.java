package example.torpor;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.avro.Schema;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericDatumWriter;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.io.BinaryEncoder;
import org.apache.avro.io.EncoderFactory;
import org.apache.avro.message.BinaryMessageDecoder;
import org.apache.avro.message.BinaryMessageEncoder;

/**
 * Record values on Torpor's topics without a Schema Registry: Avro single-object encoding,
 * {@code C3 01}, the writer schema's 8-byte CRC-64-AVRO fingerprint <b>little-endian</b>, then
 * the schemaless Avro body. Apache Avro's {@link BinaryMessageEncoder} writes exactly that
 * (including the byte order), so this class only keeps one encoder and decoder per schema.
 *
 * <p>Timestamps stay plain {@code long} milliseconds: {@link GenericData#get()} has no
 * logical-type conversions registered, which is what Torpor's bytes expect.
 */
public final class Framing {
  private static final Map<Schema, BinaryMessageEncoder<GenericRecord>> ENCODERS =
      new ConcurrentHashMap<>();
  private static final Map<Schema, BinaryMessageDecoder<GenericRecord>> DECODERS =
      new ConcurrentHashMap<>();

  private Framing() {}

  /** {@code record} in single-object encoding, written with its own (shipped) schema. */
  public static byte[] encode(GenericRecord record) {
    BinaryMessageEncoder<GenericRecord> encoder =
        ENCODERS.computeIfAbsent(
            record.getSchema(), s -> new BinaryMessageEncoder<>(GenericData.get(), s));
    try {
      ByteBuffer buffer = encoder.encode(record);
      byte[] bytes = new byte[buffer.remaining()];
      buffer.get(bytes);
      return bytes;
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  /**
   * The record in {@code value}, read as {@code schema}. Throws Avro's {@code
   * MissingSchemaException} for a fingerprint this reader does not hold and {@code
   * BadHeaderException} for another framing (a Confluent-framed value starts with {@code 00}).
   */
  public static GenericRecord decode(Schema schema, byte[] value) {
    BinaryMessageDecoder<GenericRecord> decoder =
        DECODERS.computeIfAbsent(schema, s -> new BinaryMessageDecoder<>(GenericData.get(), s));
    try {
      return decoder.decode(value);
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  /** The schemaless Avro binary encoding of {@code record} (what the signing rule covers). */
  public static byte[] body(GenericRecord record) {
    ByteArrayOutputStream out = new ByteArrayOutputStream();
    BinaryEncoder encoder = EncoderFactory.get().directBinaryEncoder(out, null);
    try {
      new GenericDatumWriter<GenericRecord>(record.getSchema(), GenericData.get())
          .write(record, encoder);
      encoder.flush();
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
    return out.toByteArray();
  }
}
