package org.harmonymobile.core.net;

import java.io.IOException;

/** Sends one request and returns the response, whatever its status; IOException for network failures. */
public interface HttpTransport {
    HttpResponse execute(HttpRequest request) throws IOException;
}
