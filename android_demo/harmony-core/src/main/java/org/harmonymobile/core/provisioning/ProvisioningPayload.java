package org.harmonymobile.core.provisioning;

import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Base64;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.regex.Pattern;
import org.harmonymobile.core.FederationKey;
import org.harmonymobile.core.json.Json;
import org.harmonymobile.core.json.JsonException;
import org.harmonymobile.core.json.JsonObject;
import org.harmonymobile.core.server.DeviceCredentials;
import org.harmonymobile.core.util.Immutable;

/**
 * What a phone is provisioned with at run time, never bundled in the app: the federation secret
 * and, optionally, the fallback server's URL and an enrolment the operator made for this phone
 * (export/provisioning.py writes it; docs/PROVISIONING.md). Read from a deep link / QR code
 * ({@value #URI_PREFIX}base64url of the JSON) or from managed configuration (the bare JSON under
 * {@value #MANAGED_CONFIG_KEY}). Unknown keys, another kind or format, a secret outside
 * 16..1024 bytes, the public placeholder secret and malformed own classes are refused.
 *
 * @param serverUrl null when the payload names none
 * @param device null when the phone enrols itself
 * @param ownClasses tier name to the classes the phone holds when it runs that tier's front-end (what a
 *     slot_margin tier gates by, {@code SlotGatePolicy.ownSlots}); empty when the payload names none
 */
public record ProvisioningPayload(
        byte[] federationSecret, String serverUrl, DeviceCredentials device, Map<String, List<String>> ownClasses) {
    public static final String URI_PREFIX = "harmony-mobile://provision/v1#";
    public static final String MANAGED_CONFIG_KEY = "provisioning_payload";
    public static final String KIND = "harmony-mobile/provisioning";
    public static final int FORMAT = 1;
    public static final int MIN_SECRET_BYTES = 16;
    public static final int MAX_SECRET_BYTES = 1024;
    public static final int MAX_DEVICE_ID_CHARS = 128;
    public static final int MAX_TOKEN_CHARS = 512;
    public static final int SERVER_KEY_BYTES = 32;
    public static final int MAX_OWN_CLASS_TIERS = 64;
    public static final int MAX_TIER_NAME_CHARS = 64;
    public static final int MAX_OWN_CLASSES = 1000;
    public static final int MAX_CLASS_NAME_CHARS = 128;
    /** The placeholder the demo apps once bundled: public, so never a federation's secret. */
    static final byte[] PLACEHOLDER_SECRET = "harmony demo federation secret!!!".getBytes(StandardCharsets.US_ASCII);

    private static final Set<String> KEYS =
            Set.of("kind", "format", "federation_secret", "server_url", "device", "own_classes");
    private static final Set<String> DEVICE_KEYS = Set.of("device_id", "token", "server_public_key");
    private static final Pattern URL = Pattern.compile("https?://[^\\s\"'\\\\<>]+");

    public ProvisioningPayload {
        federationSecret = federationSecret.clone();
        ownClasses = ownClasses == null ? Map.of() : Immutable.map(ownClasses);
    }

    /** A payload that names no own classes. */
    public ProvisioningPayload(byte[] federationSecret, String serverUrl, DeviceCredentials device) {
        this(federationSecret, serverUrl, device, Map.of());
    }

    /** The classes this phone holds when it runs {@code tier}'s front-end, if the payload names them. */
    public Optional<List<String>> ownClassesFor(String tier) {
        return Optional.ofNullable(ownClasses.get(tier));
    }

    /** The label-token key this payload provisions. */
    public FederationKey federationKey() {
        return new FederationKey(federationSecret);
    }

    @Override
    public byte[] federationSecret() {
        return federationSecret.clone();
    }

    @Override
    public String toString() {
        return "ProvisioningPayload[secret hidden, server " + serverUrl + ", device " + device + "]";
    }

    /** A deep link / QR code text or a bare JSON document (managed configuration), validated. */
    public static ProvisioningPayload parse(String text) throws ProvisioningException {
        String trimmed = text == null ? "" : text.trim();
        String json;
        if (trimmed.startsWith(URI_PREFIX)) {
            json = decodeLink(trimmed.substring(URI_PREFIX.length()));
        } else if (trimmed.startsWith("{")) {
            json = trimmed;
        } else {
            throw new ProvisioningException("a provisioning payload starts with " + URI_PREFIX + " or is a JSON object");
        }
        JsonObject document;
        try {
            document = Json.parseObject(json);
        } catch (JsonException e) {
            throw new ProvisioningException("the payload is not a JSON object: " + e.getMessage());
        }
        return fromDocument(document);
    }

    private static String decodeLink(String encoded) throws ProvisioningException {
        try {
            byte[] bytes = Base64.getUrlDecoder().decode(encoded);
            return StandardCharsets.UTF_8.newDecoder()
                    .onMalformedInput(CodingErrorAction.REPORT)
                    .decode(ByteBuffer.wrap(bytes))
                    .toString();
        } catch (IllegalArgumentException | CharacterCodingException e) {
            throw new ProvisioningException("the link's payload is not base64url of UTF-8 JSON: " + e.getMessage());
        }
    }

    private static ProvisioningPayload fromDocument(JsonObject document) throws ProvisioningException {
        Map<String, Object> map = document.asMap();
        for (String key : map.keySet()) {
            if (!KEYS.contains(key)) {
                throw new ProvisioningException("unknown payload key \"" + key + "\"");
            }
        }
        if (!KIND.equals(map.get("kind"))) {
            throw new ProvisioningException("kind must be \"" + KIND + "\"");
        }
        if (!(map.get("format") instanceof Long format) || format != FORMAT) {
            throw new ProvisioningException("payload format " + map.get("format") + " is not supported (" + FORMAT + " is)");
        }
        byte[] secret = checkSecret(base64(map.get("federation_secret"), "federation_secret"));
        String serverUrl = null;
        if (map.get("server_url") != null) {
            serverUrl = string(map.get("server_url"), "server_url");
            if (!URL.matcher(serverUrl).matches()) {
                throw new ProvisioningException("server_url must be an http(s) URL, got " + serverUrl);
            }
        }
        DeviceCredentials device = map.get("device") == null ? null : device(map.get("device"));
        Map<String, List<String>> own = map.get("own_classes") == null ? Map.of() : ownClasses(map.get("own_classes"));
        return new ProvisioningPayload(secret, serverUrl, device, own);
    }

    private static Map<String, List<String>> ownClasses(Object value) throws ProvisioningException {
        if (!(value instanceof Map<?, ?> raw) || raw.isEmpty() || raw.size() > MAX_OWN_CLASS_TIERS) {
            throw new ProvisioningException(
                    "own_classes must map 1.." + MAX_OWN_CLASS_TIERS + " tier names to class names");
        }
        Map<String, List<String>> own = new LinkedHashMap<>();
        for (Map.Entry<?, ?> entry : raw.entrySet()) {
            String tier = (String) entry.getKey(); // JSON object keys are strings
            if (tier.isEmpty() || tier.length() > MAX_TIER_NAME_CHARS) {
                throw new ProvisioningException("own_classes: a tier name has 1.." + MAX_TIER_NAME_CHARS + " characters");
            }
            own.put(tier, classNames(entry.getValue(), tier));
        }
        return own;
    }

    private static List<String> classNames(Object value, String tier) throws ProvisioningException {
        String where = "own_classes[\"" + tier + "\"]";
        if (!(value instanceof List<?> list) || list.isEmpty() || list.size() > MAX_OWN_CLASSES) {
            throw new ProvisioningException(where + " must list 1.." + MAX_OWN_CLASSES + " class names");
        }
        List<String> names = new ArrayList<>();
        for (Object item : list) {
            if (!(item instanceof String name) || name.isEmpty() || name.length() > MAX_CLASS_NAME_CHARS) {
                throw new ProvisioningException(
                        where + ": a class name is a string of 1.." + MAX_CLASS_NAME_CHARS + " characters");
            }
            if (names.contains(name)) {
                throw new ProvisioningException(where + " names class \"" + name + "\" twice");
            }
            names.add(name);
        }
        return Immutable.list(names);
    }

    /** A secret of the allowed size that is not the public placeholder. */
    public static byte[] checkSecret(byte[] secret) throws ProvisioningException {
        if (secret.length < MIN_SECRET_BYTES || secret.length > MAX_SECRET_BYTES) {
            throw new ProvisioningException("a federation secret has " + MIN_SECRET_BYTES + ".." + MAX_SECRET_BYTES
                    + " bytes, this one " + secret.length);
        }
        if (Arrays.equals(secret, PLACEHOLDER_SECRET)) {
            throw new ProvisioningException("this is the public placeholder secret, not a federation's secret");
        }
        return secret;
    }

    private static DeviceCredentials device(Object value) throws ProvisioningException {
        if (!(value instanceof Map<?, ?> raw) || !raw.keySet().equals(DEVICE_KEYS)) {
            throw new ProvisioningException("device must hold exactly device_id, token and server_public_key");
        }
        String deviceId = string(raw.get("device_id"), "device.device_id");
        String token = string(raw.get("token"), "device.token");
        byte[] serverKey = base64(raw.get("server_public_key"), "device.server_public_key");
        if (deviceId.isEmpty() || deviceId.length() > MAX_DEVICE_ID_CHARS) {
            throw new ProvisioningException("device.device_id must have 1.." + MAX_DEVICE_ID_CHARS + " characters");
        }
        if (token.isEmpty() || token.length() > MAX_TOKEN_CHARS) {
            throw new ProvisioningException("device.token must have 1.." + MAX_TOKEN_CHARS + " characters");
        }
        if (serverKey.length != SERVER_KEY_BYTES) {
            throw new ProvisioningException("device.server_public_key must hold " + SERVER_KEY_BYTES + " bytes");
        }
        return new DeviceCredentials(deviceId, token, serverKey);
    }

    private static String string(Object value, String name) throws ProvisioningException {
        if (!(value instanceof String text)) {
            throw new ProvisioningException(name + " must be a string");
        }
        return text;
    }

    private static byte[] base64(Object value, String name) throws ProvisioningException {
        try {
            return Base64.getDecoder().decode(string(value, name));
        } catch (IllegalArgumentException e) {
            throw new ProvisioningException(name + " is not base64: " + e.getMessage());
        }
    }
}
