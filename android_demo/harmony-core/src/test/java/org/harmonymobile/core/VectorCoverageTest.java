package org.harmonymobile.core;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Set;
import java.util.TreeSet;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Stream;
import org.junit.jupiter.api.Test;

/**
 * Every golden vector file of tests/vectors is read by some test here: a vector that no JUnit test
 * loads checks nothing on Android, and nothing else notices (tests/test_ios_contract.py does the
 * same for the XCTests).
 */
class VectorCoverageTest {
    private static final Pattern LOAD = Pattern.compile("Vectors\\.load\\(\"([^\"]+)\"");

    @Test
    void everyVectorFileIsReadByATest() throws IOException {
        Set<String> read = new TreeSet<>();
        try (Stream<Path> files = Files.walk(Path.of("src/test/java"))) {
            for (Path file : (Iterable<Path>) files.filter(p -> p.toString().endsWith(".java"))::iterator) {
                Matcher match = LOAD.matcher(new String(Files.readAllBytes(file), StandardCharsets.UTF_8));
                while (match.find()) {
                    read.add(match.group(1));
                }
            }
        }
        Set<String> vectors = new TreeSet<>();
        try (DirectoryStream<Path> files = Files.newDirectoryStream(Vectors.directory(), "*.json")) {
            for (Path file : files) {
                vectors.add(file.getFileName().toString());
            }
        }
        assertFalse(read.isEmpty(), "no test reads a golden vector");
        assertEquals(vectors, read);
    }
}
