package org.harmonymobile.core.util;

import java.util.ArrayList;
import java.util.Collection;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.stream.Collectors;
import java.util.stream.Stream;

/**
 * Unmodifiable copies with Java 8 APIs only. {@code List.copyOf}, {@code Map.copyOf} and
 * {@code Stream.toList()} are newer than some Android releases this library supports (Stream.toList
 * is API 34), so the library does not call them.
 */
public final class Immutable {
    private Immutable() {}

    public static <T> List<T> list(Collection<? extends T> items) {
        return Collections.unmodifiableList(new ArrayList<>(items));
    }

    public static <T> List<T> list(Stream<? extends T> items) {
        return Collections.unmodifiableList(items.collect(Collectors.toList()));
    }

    public static <K, V> Map<K, V> map(Map<? extends K, ? extends V> entries) {
        return Collections.unmodifiableMap(new LinkedHashMap<>(entries));
    }
}
