"""End-to-end speed of structured outputs in `megactx serve`: output tokens/s
with a constraint (a JSON Schema or a regex in /generate, a strict
response_format json_schema in /v1/chat/completions) beside the unconstrained
peer measured in the same run, at each concurrency.

The peer is exact: after a constrained pass, the same prompts are sent again
without the constraint, each with ignore_eos and max tokens set to the length
its constrained answer had, so both passes generate the same number of tokens
per request in the same order and only the grammar mask differs. Each pass is
a closed loop: `concurrency` workers send requests back to back over kept-alive
connections until all are answered; tokens/s is the total completion tokens
over the wall time of the pass. Grammars are compiled (and cached by the
server) by a warm-up request before any timing. When this script starts the
server it also reports the server's CPU time per output token (user + system
of all its threads, from /proc), which other load on the machine changes far
less than wall time.

  # start a server (port 0) and measure on it
  python3 tools/bench/structured_output_bench.py --megactx build/megactx \\
      --model models/default --concurrency 1,64
  # GPU: the same with the server on the device
  python3 tools/bench/structured_output_bench.py --megactx build/megactx \\
      --model models/default --server-args="--device cuda" --concurrency 1,64
  # a server that already runs
  python3 tools/bench/structured_output_bench.py --url http://127.0.0.1:30000

Standard library only. Traffic goes to the given server (127.0.0.1 when this
script starts it).
"""
import argparse
import http.client
import json
import os
import queue
import re
import shlex
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse

# A product record: enums, a nested object, a bounded array, a date format,
# bounded strings and integers. Every value is bounded, so the answer ends.
PRODUCT_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 24},
        "category": {"type": "string", "enum": ["tool", "toy", "food", "book"]},
        "price": {"type": "integer", "minimum": 0, "maximum": 100000},
        "size": {"type": "object",
                 "properties": {"width": {"type": "integer", "minimum": 1, "maximum": 999},
                                "unit": {"type": "string", "enum": ["cm", "in"]}},
                 "required": ["width", "unit"], "additionalProperties": False},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "minItems": 1,
                 "maxItems": 4},
        "released": {"type": "string", "format": "date"},
        "in_stock": {"type": "boolean"},
    },
    "required": ["name", "category", "price", "size", "tags", "released", "in_stock"],
    "additionalProperties": False,
}
# A sentence of 6 to 40 lower-case words: long answers over a large allowed set.
SENTENCE_REGEX = r"[A-Z][a-z]{0,11}( [a-z]{1,12}){5,39}\."

MODES = ("json_schema", "regex", "chat_json_schema")


class Server:
    """`megactx serve` on 127.0.0.1, port 0, until stopped."""

    def __init__(self, megactx, model, extra, timeout=600):
        command = [megactx, "serve", "--model", model, "--host", "127.0.0.1", "--port", "0",
                   "--served-model-name", "default", *extra]
        print("server: " + " ".join(shlex.quote(c) for c in command), file=sys.stderr)
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True)
        self.log = []
        threading.Thread(target=self._drain, daemon=True).start()
        found = {}

        def wait():
            for line in self.process.stdout:
                match = re.search(r"at (http://\S+)", line)
                if match:
                    found["url"] = match.group(1)
                    return

        waiter = threading.Thread(target=wait, daemon=True)
        waiter.start()
        waiter.join(timeout)
        if "url" not in found:
            self.stop()
            raise RuntimeError("megactx serve did not start:\n" + "".join(self.log[-40:]))
        self.url = found["url"]

    def _drain(self):
        for line in self.process.stderr:
            self.log.append(line)

    def cpu_seconds(self):
        """User + system CPU time of the server process (all threads) so far."""
        with open(f"/proc/{self.process.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class Client:
    """One kept-alive HTTP/1.1 connection (one per worker)."""

    def __init__(self, url, api_key):
        parts = urllib.parse.urlparse(url)
        self.host, self.port = parts.hostname, parts.port or 80
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = "Bearer " + api_key
        self.connection = None

    def post(self, path, body):
        payload = json.dumps(body).encode()
        for attempt in range(2):  # one reconnect if the server closed an idle connection
            if self.connection is None:
                self.connection = http.client.HTTPConnection(self.host, self.port, timeout=3600)
            try:
                self.connection.request("POST", path, payload, self.headers)
                response = self.connection.getresponse()
                data = response.read()
            except (http.client.HTTPException, ConnectionError):
                self.connection.close()
                self.connection = None
                if attempt:
                    raise
                continue
            if response.status != 200:
                raise RuntimeError(f"{path}: HTTP {response.status}: {data[:500]!r}")
            return json.loads(data)
        raise RuntimeError("unreachable")


def request_for(mode, index, max_tokens, constrained, length=None):
    """(path, body) of request `index`; the peer (constrained False) runs
    `length` tokens with ignore_eos."""
    tokens = length if length is not None else max_tokens
    if mode == "chat_json_schema":
        body = {"model": "default", "temperature": 0, "max_tokens": tokens,
                "messages": [{"role": "user",
                              "content": f"Describe product number {index} as JSON."}]}
        if constrained:
            body["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "product", "schema": PRODUCT_SCHEMA, "strict": True}}
        else:
            body["ignore_eos"] = True
        return "/v1/chat/completions", body
    prompt = (f"Product record {index}:" if mode == "json_schema"
              else f"Sentence {index}: the weather")
    sampling = {"max_new_tokens": tokens, "temperature": 0}
    if constrained:
        sampling["json_schema" if mode == "json_schema" else "regex"] = (
            json.dumps(PRODUCT_SCHEMA) if mode == "json_schema" else SENTENCE_REGEX)
    else:
        sampling["ignore_eos"] = True
    return "/generate", {"text": prompt, "sampling_params": sampling}


def completion(mode, answer):
    """(completion tokens, ended by itself) of an answer."""
    if mode == "chat_json_schema":
        choice = answer["choices"][0]
        return answer["usage"]["completion_tokens"], choice["finish_reason"] == "stop"
    meta = answer["meta_info"]
    return meta["completion_tokens"], meta["finish_reason"]["type"] == "stop"


def run_pass(url, api_key, requests, concurrency, mode, cpu_seconds):
    """Sends `requests` [(path, body)] with `concurrency` workers; returns
    (wall seconds, server CPU seconds or None, [(tokens, stopped, latency)]
    in request order)."""
    work = queue.Queue()
    for i, item in enumerate(requests):
        work.put((i, item))
    results = [None] * len(requests)
    errors = []

    def worker():
        client = Client(url, api_key)
        while not errors:
            try:
                i, (path, body) = work.get_nowait()
            except queue.Empty:
                return
            start = time.perf_counter()
            try:
                answer = client.post(path, body)
            except Exception as error:  # reported after the pass
                errors.append(error)
                return
            tokens, stopped = completion(mode, answer)
            results[i] = (tokens, stopped, time.perf_counter() - start)

    threads = [threading.Thread(target=worker) for _ in range(min(concurrency, len(requests)))]
    cpu_start = cpu_seconds() if cpu_seconds else None
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    cpu = cpu_seconds() - cpu_start if cpu_seconds else None
    if errors:
        raise RuntimeError(f"{mode}: {errors[0]}")
    return wall, cpu, results


def measure(url, api_key, mode, concurrency, count, max_tokens, repeat, cpu_seconds):
    indices = list(range(count))
    # Warm-up: the grammar compiles once (then it is cached by its text).
    client = Client(url, api_key)
    client.post(*request_for(mode, 10_000, max_tokens, True))
    client.post(*request_for(mode, 10_000, max_tokens, False, length=4))
    rows = []
    for _ in range(repeat):
        constrained = [request_for(mode, i, max_tokens, True) for i in indices]
        wall_c, cpu_c, got = run_pass(url, api_key, constrained, concurrency, mode, cpu_seconds)
        # The peer: the same prompts, each for exactly the tokens its constrained answer took.
        peer = [request_for(mode, i, max_tokens, False, length=got[i][0]) for i in indices]
        wall_p, cpu_p, peer_got = run_pass(url, api_key, peer, concurrency, mode, cpu_seconds)
        tokens = sum(t for t, _, _ in got)
        peer_tokens = sum(t for t, _, _ in peer_got)
        if peer_tokens != tokens:
            raise RuntimeError(f"{mode}: the peer generated {peer_tokens} tokens, not {tokens}")
        rows.append({"wall_c": wall_c, "wall_p": wall_p, "tokens": tokens,
                     "cpu_c": cpu_c, "cpu_p": cpu_p,
                     "stopped": sum(1 for _, s, _ in got if s),
                     "latency_c": statistics.median(l for _, _, l in got),
                     "latency_p": statistics.median(l for _, _, l in peer_got)})
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running server (otherwise --megactx and --model)")
    parser.add_argument("--megactx", help="the megactx binary to start")
    parser.add_argument("--model", help="model directory for the started server")
    parser.add_argument("--server-args", default="",
                        help='extra `megactx serve` flags, e.g. "--device cuda"')
    parser.add_argument("--api-key", default=os.environ.get("MEGACTX_API_KEY", ""))
    parser.add_argument("--concurrency", default="1,64")
    parser.add_argument("--requests-per-worker", type=int, default=2,
                        help="requests per pass = max(concurrency x this, --min-requests)")
    parser.add_argument("--min-requests", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=1024,
                        help="cap of a constrained answer (the schema and regex end sooner)")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--repeat", type=int, default=1,
                        help="constrained/peer pass pairs per cell (the table shows medians)")
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    for mode in modes:
        if mode not in MODES:
            parser.error(f"unknown mode {mode} (one of {', '.join(MODES)})")
    concurrencies = [int(c) for c in args.concurrency.split(",")]

    server = None
    url = args.url
    if url is None:
        if not (args.megactx and args.model):
            parser.error("give --url, or --megactx and --model")
        server = Server(args.megactx, args.model, shlex.split(args.server_args))
        url = server.url
    try:
        table = []
        for mode in modes:
            for concurrency in concurrencies:
                count = max(concurrency * args.requests_per_worker, args.min_requests)
                rows = measure(url, args.api_key, mode, concurrency, count, args.max_tokens,
                               args.repeat, server.cpu_seconds if server else None)
                median = lambda key: statistics.median(r[key] for r in rows)  # noqa: E731
                tokens = rows[0]["tokens"]
                c_rate = statistics.median(r["tokens"] / r["wall_c"] for r in rows)
                p_rate = statistics.median(r["tokens"] / r["wall_p"] for r in rows)
                cpu = None
                if server:  # server CPU milliseconds per output token
                    cpu = (statistics.median(1000 * r["cpu_c"] / r["tokens"] for r in rows),
                           statistics.median(1000 * r["cpu_p"] / r["tokens"] for r in rows))
                table.append((mode, concurrency, count, tokens, rows[0]["stopped"], c_rate, p_rate,
                              median("latency_c"), median("latency_p"),
                              [r["tokens"] / r["wall_c"] for r in rows],
                              [r["tokens"] / r["wall_p"] for r in rows], cpu))
                print(f"{mode} c={concurrency}: {c_rate:.1f} tok/s constrained, "
                      f"{p_rate:.1f} unconstrained", file=sys.stderr)
    finally:
        if server:
            server.stop()

    print("| constraint | concurrency | requests | output tokens | ended by the grammar "
          "| constrained tok/s | unconstrained tok/s (same run) | ratio "
          "| median latency s, constrained / unconstrained "
          "| server CPU ms per token, constrained / unconstrained |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    def rate(median_rate, rates):  # the median, and the range when repeated
        return f"{median_rate:.1f}" + (f" ({min(rates):.1f}-{max(rates):.1f})"
                                       if len(rates) > 1 else "")

    for (mode, concurrency, count, tokens, stopped, c_rate, p_rate, lat_c, lat_p, c_all,
         p_all, cpu) in table:
        cpu_text = f"{cpu[0]:.2f} / {cpu[1]:.2f}" if cpu else "(not measured)"
        print(f"| {mode} | {concurrency} | {count} | {tokens} | {stopped}/{count} "
              f"| {rate(c_rate, c_all)} | {rate(p_rate, p_all)} | {c_rate / p_rate:.3f} "
              f"| {lat_c:.2f} / {lat_p:.2f} | {cpu_text} |")


if __name__ == "__main__":
    main()
