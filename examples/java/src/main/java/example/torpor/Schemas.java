package example.torpor;

import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import org.apache.avro.Schema;

/**
 * Torpor's record schemas, exactly as shipped ({@code torpor/schemas/*.avsc}, copied onto the
 * classpath by the build). Each file is self-contained, so each is parsed on its own.
 *
 * <p>A writer must use these schemas unchanged: without a Schema Registry the processor finds
 * the writer schema by its fingerprint among the ones it ships, and parks a record whose
 * fingerprint it does not know (docs/wire-contract.md, "The writer-schema rule").
 */
public final class Schemas {
  public static final Schema INPUT = load("Input");
  public static final Schema DISPATCH = load("Dispatch");
  public static final Schema THREAD_EVENT = load("ThreadEvent");
  public static final Schema RECEIPT = load("Receipt");
  public static final Schema HISTORY_ENTRY = load("HistoryEntry");

  private Schemas() {}

  /** The schema file {@code torpor/schemas/<name>.avsc} from the classpath. */
  public static Schema load(String name) {
    String path = "/torpor/schemas/" + name + ".avsc";
    try (InputStream in = Schemas.class.getResourceAsStream(path)) {
      if (in == null) {
        throw new IllegalStateException(path + " is not on the classpath (build with mvn package)");
      }
      return new Schema.Parser().parse(in);
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  /** The branch of {@code Input.body} named {@code name} (e.g. "ToolResult"). */
  public static Schema body(String name) {
    return branch(INPUT.getField("body").schema(), name);
  }

  /** The record named {@code name} defined anywhere inside {@code root} (e.g. "TextBlock"). */
  public static Schema named(Schema root, String name) {
    Schema found = find(root, "torpor." + name, new java.util.HashSet<>());
    if (found == null) {
      throw new IllegalArgumentException("no record " + name + " in " + root.getFullName());
    }
    return found;
  }

  /** The branch named {@code name} of a union. */
  public static Schema branch(Schema union, String name) {
    for (Schema branch : union.getTypes()) {
      if (branch.getName().equals(name)) {
        return branch;
      }
    }
    throw new IllegalArgumentException("no branch " + name + " in " + union);
  }

  /** The non-null branch of an optional field's {@code ["null", T]} union. */
  public static Schema optional(Schema union) {
    for (Schema branch : union.getTypes()) {
      if (branch.getType() != Schema.Type.NULL) {
        return branch;
      }
    }
    throw new IllegalArgumentException("no non-null branch in " + union);
  }

  private static Schema find(Schema schema, String fullName, java.util.Set<String> seen) {
    switch (schema.getType()) {
      case RECORD:
        if (schema.getFullName().equals(fullName)) {
          return schema;
        }
        if (!seen.add(schema.getFullName())) {
          return null;
        }
        for (Schema.Field field : schema.getFields()) {
          Schema found = find(field.schema(), fullName, seen);
          if (found != null) {
            return found;
          }
        }
        return null;
      case UNION:
        for (Schema branch : schema.getTypes()) {
          Schema found = find(branch, fullName, seen);
          if (found != null) {
            return found;
          }
        }
        return null;
      case ARRAY:
        return find(schema.getElementType(), fullName, seen);
      case MAP:
        return find(schema.getValueType(), fullName, seen);
      default:
        return null;
    }
  }
}
