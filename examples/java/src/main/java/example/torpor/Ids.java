package example.torpor;

import java.io.ByteArrayOutputStream;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.HexFormat;

/**
 * Torpor's id rule, version 1: {@code "tp_" + hex(SHA-256("torpor.id.v1" || str(base) ||
 * str(p1) ...))[:32]} where {@code str(s) = u32be(len(utf8(s))) || utf8(s)}. A connector
 * names its answers with it ({@code deriveId(requestId, "result")}), so an answer sent twice
 * is folded once.
 */
public final class Ids {
  private static final byte[] DOMAIN = "torpor.id.v1".getBytes(StandardCharsets.US_ASCII);

  private Ids() {}

  public static String deriveId(String base, String... parts) {
    ByteArrayOutputStream message = new ByteArrayOutputStream();
    message.writeBytes(DOMAIN);
    lengthPrefixed(message, base);
    for (String part : parts) {
      lengthPrefixed(message, part);
    }
    try {
      byte[] digest = MessageDigest.getInstance("SHA-256").digest(message.toByteArray());
      return "tp_" + HexFormat.of().formatHex(digest).substring(0, 32);
    } catch (NoSuchAlgorithmException e) {
      throw new IllegalStateException("every JDK has SHA-256", e);
    }
  }

  static void lengthPrefixed(ByteArrayOutputStream out, String text) {
    byte[] bytes = text.getBytes(StandardCharsets.UTF_8);
    out.writeBytes(ByteBuffer.allocate(4).putInt(bytes.length).array());
    out.writeBytes(bytes);
  }
}
