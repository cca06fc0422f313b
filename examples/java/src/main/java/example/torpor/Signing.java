package example.torpor;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.GeneralSecurityException;
import java.security.KeyFactory;
import java.security.PrivateKey;
import java.security.Signature;
import java.security.spec.EdECPrivateKeySpec;
import java.security.spec.NamedParameterSpec;
import java.security.spec.PKCS8EncodedKeySpec;
import java.util.Base64;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericRecord;

/**
 * Torpor's signing rule, version 1: Ed25519 (pure, RFC 8032) over
 *
 * <pre>
 * "torpor-input-v1\0" || str(message_id) || str(thread_id) || str(source)
 *   || i64be(created_at) || (0x00 | 0x01 || i64be(expires_at)) || str(key_id)
 *   || str(body record's full name) || blob(schemaless Avro bytes of the body)
 * </pre>
 *
 * with {@code str(s) = u32be(len(utf8(s))) || utf8(s)} and {@code blob(b) = u32be(len(b)) ||
 * b}. The signature goes in the envelope's {@code signature} field, the one field not covered.
 * The JDK (17 and later) has Ed25519: no extra library.
 */
public final class Signing {
  private static final byte[] DOMAIN = "torpor-input-v1\0".getBytes(StandardCharsets.US_ASCII);

  private Signing() {}

  /** The bytes the signature of {@code input} covers; its {@code key_id} must be set. */
  public static byte[] signingBytes(GenericRecord input) {
    Object keyId = input.get("key_id");
    if (keyId == null) {
      throw new IllegalArgumentException("set key_id before signing");
    }
    ByteArrayOutputStream out = new ByteArrayOutputStream();
    out.writeBytes(DOMAIN);
    Ids.lengthPrefixed(out, input.get("message_id").toString());
    Ids.lengthPrefixed(out, input.get("thread_id").toString());
    Ids.lengthPrefixed(out, input.get("source").toString());
    out.writeBytes(i64(((Number) input.get("created_at")).longValue()));
    Object expiresAt = input.get("expires_at");
    if (expiresAt == null) {
      out.write(0);
    } else {
      out.write(1);
      out.writeBytes(i64(((Number) expiresAt).longValue()));
    }
    Ids.lengthPrefixed(out, keyId.toString());
    GenericRecord body = (GenericRecord) input.get("body");
    Ids.lengthPrefixed(out, body.getSchema().getFullName());
    byte[] bodyBytes = Framing.body(body);
    out.writeBytes(ByteBuffer.allocate(4).putInt(bodyBytes.length).array());
    out.writeBytes(bodyBytes);
    return out.toByteArray();
  }

  /** A copy of {@code input} with {@code key_id} set and signed with {@code key}. */
  public static GenericRecord sign(GenericRecord input, String keyId, PrivateKey key) {
    GenericData.Record signed = new GenericData.Record((GenericData.Record) input, true);
    signed.put("key_id", keyId);
    signed.put("signature", null);
    try {
      Signature ed25519 = Signature.getInstance("Ed25519");
      ed25519.initSign(key);
      ed25519.update(signingBytes(signed));
      signed.put("signature", ByteBuffer.wrap(ed25519.sign()));
    } catch (GeneralSecurityException e) {
      throw new IllegalStateException("Ed25519 signing failed", e);
    }
    return signed;
  }

  /** The Ed25519 private key of a PKCS#8 PEM file, as {@code torpor keys new} writes it. */
  public static PrivateKey loadPrivateKey(Path pem) throws IOException {
    String text = Files.readString(pem, StandardCharsets.US_ASCII);
    String base64 =
        text.replace("-----BEGIN PRIVATE KEY-----", "")
            .replace("-----END PRIVATE KEY-----", "")
            .replaceAll("\\s", "");
    try {
      return KeyFactory.getInstance("Ed25519")
          .generatePrivate(new PKCS8EncodedKeySpec(Base64.getDecoder().decode(base64)));
    } catch (GeneralSecurityException | IllegalArgumentException e) {
      throw new IOException(pem + ": not an unencrypted PKCS#8 Ed25519 private key", e);
    }
  }

  /** The Ed25519 private key with this 32-byte seed (RFC 8032's private key). */
  public static PrivateKey privateKeyFromSeed(byte[] seed) {
    try {
      return KeyFactory.getInstance("Ed25519")
          .generatePrivate(new EdECPrivateKeySpec(NamedParameterSpec.ED25519, seed));
    } catch (GeneralSecurityException e) {
      throw new IllegalArgumentException("not an Ed25519 seed", e);
    }
  }

  private static byte[] i64(long value) {
    return ByteBuffer.allocate(8).putLong(value).array();
  }
}
