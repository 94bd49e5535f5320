"""A small HTTP/1.1 client over a raw socket, for tests that need what client
libraries hide: pipelined requests, bodies sent slowly or in pieces, reading
slowly, closing mid-response, and telling a complete response from a
connection that ended early (a dropped request)."""
import socket
import time


class Dropped(Exception):
    """The connection ended (EOF, reset, timeout) before a complete response."""


class Malformed(Exception):
    """Bytes arrived that are not an HTTP/1.1 response."""


class Response:
    def __init__(self, status, headers, body, chunks):
        self.status = status
        self.headers = headers  # lower-cased names
        self.body = body        # bytes, de-chunked
        self.chunks = chunks    # number of chunks of a chunked body (0 otherwise)

    def sse_events(self):
        """The `data: ...` payloads of an event stream, [DONE] included."""
        return [line[6:] for line in self.body.decode("utf-8", "replace").split("\n")
                if line.startswith("data: ")]


class Connection:
    def __init__(self, host, port, timeout=60.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""
        self.timeout = timeout

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def send(self, data, piece=None, pause=0.0):
        """Sends `data`; in pieces of `piece` bytes with `pause` s between them."""
        if not piece:
            self.sock.sendall(data)
            return
        for start in range(0, len(data), piece):
            self.sock.sendall(data[start:start + piece])
            if pause:
                time.sleep(pause)

    def _fill(self, read_size=65536, pause=0.0):
        if pause:
            time.sleep(pause)
        try:
            data = self.sock.recv(read_size)
        except (ConnectionResetError, socket.timeout, OSError) as error:
            raise Dropped(f"{type(error).__name__}: {error}") from None
        if not data:
            raise Dropped("connection closed")
        self.buffer += data

    def _line(self, **read):
        while b"\r\n" not in self.buffer:
            self._fill(**read)
        line, self.buffer = self.buffer.split(b"\r\n", 1)
        return line

    def _take(self, count, **read):
        while len(self.buffer) < count:
            self._fill(**read)
        data, self.buffer = self.buffer[:count], self.buffer[count:]
        return data

    def read_response(self, read_size=65536, pause=0.0, head=False, stop_after_chunks=None):
        """One complete response. `stop_after_chunks`: return after that many
        body chunks (the caller then closes: a client going away)."""
        read = {"read_size": read_size, "pause": pause}
        while True:
            status_line = self._line(**read)
            parts = status_line.split(b" ", 2)
            if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
                raise Malformed(f"bad status line {status_line[:80]!r}")
            status = int(parts[1])
            headers = {}
            while True:
                line = self._line(**read)
                if not line:
                    break
                if b":" not in line:
                    raise Malformed(f"bad header line {line[:80]!r}")
                name, value = line.split(b":", 1)
                headers[name.decode().strip().lower()] = value.decode().strip()
            if status != 100:
                break
        if head or status in (204, 304):
            return Response(status, headers, b"", 0)
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body, chunks = b"", 0
            while True:
                size_line = self._line(**read)
                try:
                    size = int(size_line.split(b";")[0], 16)
                except ValueError:
                    raise Malformed(f"bad chunk size {size_line[:40]!r}") from None
                if size == 0:
                    if self._line(**read) != b"":
                        raise Malformed("no blank line after the last chunk")
                    return Response(status, headers, body, chunks)
                body += self._take(size, **read)
                if self._take(2, **read) != b"\r\n":
                    raise Malformed("chunk not followed by CRLF")
                chunks += 1
                if stop_after_chunks is not None and chunks >= stop_after_chunks:
                    return Response(status, headers, body, chunks)
        if "content-length" not in headers:
            raise Malformed("response with neither Content-Length nor chunked encoding")
        body = self._take(int(headers["content-length"]), **read)
        return Response(status, headers, body, 0)


def request_bytes(method, path, body=b"", headers=None, keep_alive=True):
    if isinstance(body, str):
        body = body.encode()
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    if body or method in ("POST", "PUT"):
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    if not keep_alive:
        lines.append("Connection: close")
    for name, value in (headers or {}).items():
        lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body
