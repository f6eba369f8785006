package org.harmonymobile.core;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.regex.Pattern;
import java.util.stream.Stream;
import org.junit.jupiter.api.Test;

/**
 * The library runs on Android (minSdk 33), whose java.* is not the JDK's: this test fails when main
 * sources call JDK APIs that Android 13 lacks or that only exist on the JVM, since no Android build
 * runs here to catch it.
 */
class AndroidApiGuardTest {
    /** Regular expression -> why it is forbidden. */
    private static final Map<String, String> FORBIDDEN = Map.of(
            "(?<!Collectors)\\.toList\\(\\)", "Stream.toList is Android API 34; use Immutable.list(stream)",
            "List\\.copyOf\\(", "use Immutable.list",
            "Map\\.copyOf\\(", "use Immutable.map",
            "HexFormat", "java.util.HexFormat is Android API 34; use util.Hex",
            "java\\.net\\.http", "java.net.http does not exist on Android; use HttpURLConnection",
            "Files\\.readString", "Java 11 file API; use Files.readAllBytes",
            "Files\\.writeString", "Java 11 file API; use Files.write",
            "\\.isBlank\\(\\)", "Java 11 String API; use trim().isEmpty()",
            "orElseThrow\\(\\)", "Java 10 Optional API; use get() after a check or orElseThrow(supplier)",
            "com\\.sun\\.", "JDK-internal API");

    @Test
    void mainSourcesUseOnlyApisAndroid13Has() throws IOException {
        List<String> problems = new ArrayList<>();
        try (Stream<Path> files = Files.walk(Path.of("src/main/java"))) {
            for (Path file : (Iterable<Path>) files.filter(p -> p.toString().endsWith(".java"))::iterator) {
                List<String> lines = Files.readAllLines(file, StandardCharsets.UTF_8);
                for (int i = 0; i < lines.size(); i++) {
                    String line = lines.get(i).trim();
                    if (line.startsWith("*") || line.startsWith("//") || line.startsWith("/*")) {
                        continue;
                    }
                    for (Map.Entry<String, String> rule : FORBIDDEN.entrySet()) {
                        if (Pattern.compile(rule.getKey()).matcher(line).find()) {
                            problems.add(file + ":" + (i + 1) + " uses " + rule.getKey() + " (" + rule.getValue() + ")");
                        }
                    }
                }
            }
        }
        assertEquals(List.of(), problems);
    }
}
