"""End-to-end speed of structured outputs in `megactx serve`: output tokens/s
with a constraint (a JSON Schema or a regex in /generate, a strict
response_format json_schema in /v1/chat/completions) beside the unconstrained
peer measured in the same run, at each concurrency.

The peer: after a constrained pass, the same prompts are sent again without
the constraint, each with ignore_eos and max tokens set to the length its
constrained answer had, so both passes generate the same number of tokens per
request, in the same order, at the same concurrency. Each pass is
a closed loop: `concurrency` workers send requests back to back over kept-alive
connections until all are answered; tokens/s is the total completion tokens
over the wall time of the pass. Grammars are compiled (and cached by the
server) by a warm-up request before any timing.

When this script starts the server, it starts one per table row with
MEGACTX_ENGINE_TIMES=1 and reads the engine's phase times when it stops: the
time spent filling grammar masks per constrained output token, beside the
engine's whole step time per output token over the row (constrained and peer
passes). Mask filling runs on the engine thread before each forward, so that
share is what the masks add to a step; it depends far less on other load of
the machine than the wall-clock rates do. (The peer generates other tokens
than the constrained pass, and a MoE model's cost depends a little on which
tokens: the wall-clock ratio also carries that.)

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
        print("server: MEGACTX_ENGINE_TIMES=1 " + " ".join(shlex.quote(c) for c in command),
              file=sys.stderr)
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True,
                                        env=dict(os.environ, MEGACTX_ENGINE_TIMES="1"))
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

    def stop(self):
        """Stops the server; returns {phase: total ms} from its engine phase times."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        time.sleep(0.2)  # the stderr reader finishes the last lines
        steps = None
        phases = {}
        for line in self.log:
            match = re.match(r"engine phase times over (\d+) steps", line)
            if match:
                steps = int(match.group(1))
                continue
            match = re.match(r"\s+(\S.*?)\s+([0-9.]+)\s+\(\s*[0-9.]+%\)", line)
            if match and steps is not None:
                phases[match.group(1)] = float(match.group(2)) * steps
        return phases


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


ENGINE_COUNTERS = ("megactx_engine_steps_total", "megactx_engine_step_tokens_total",
                   "megactx_engine_step_seconds_total")


def engine_counters(url, api_key):
    """The engine's step counters from /metrics: (steps, tokens, seconds), or None."""
    parts = urllib.parse.urlparse(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=60)
    headers = {"Authorization": "Bearer " + api_key} if api_key else {}
    try:
        connection.request("GET", "/metrics", headers=headers)
        text = connection.getresponse().read().decode()
    finally:
        connection.close()
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in ENGINE_COUNTERS:
            values[name] = float(value)
    if len(values) != len(ENGINE_COUNTERS):
        return None
    return tuple(values[name] for name in ENGINE_COUNTERS)


def counted_pass(url, api_key, requests, concurrency, mode):
    """run_pass, and the engine's (steps, tokens, seconds) during it (None when
    the server does not report them)."""
    before = engine_counters(url, api_key)
    wall, results = run_pass(url, api_key, requests, concurrency, mode)
    after = engine_counters(url, api_key)
    steps = tuple(a - b for a, b in zip(after, before)) if before and after else None
    return wall, results, steps


def run_pass(url, api_key, requests, concurrency, mode):
    """Sends `requests` [(path, body)] with `concurrency` workers; returns
    (wall seconds, [(tokens, stopped, latency)] in request order)."""
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
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"{mode}: {errors[0]}")
    return wall, results


def measure(url, api_key, mode, concurrency, count, max_tokens, repeat):
    """Returns (pass pairs, constrained tokens, all tokens) of one table row."""
    indices = list(range(count))
    # Warm-up: the grammar compiles once (then it is cached by its text).
    client = Client(url, api_key)
    warm, _ = completion(mode, client.post(*request_for(mode, 10_000, max_tokens, True)))
    cold, _ = completion(mode, client.post(*request_for(mode, 10_000, max_tokens, False,
                                                        length=4)))
    constrained_tokens, all_tokens = warm, warm + cold
    rows = []
    for _ in range(repeat):
        constrained = [request_for(mode, i, max_tokens, True) for i in indices]
        wall_c, got, steps_c = counted_pass(url, api_key, constrained, concurrency, mode)
        # The peer: the same prompts, each for exactly the tokens its constrained answer took.
        peer = [request_for(mode, i, max_tokens, False, length=got[i][0]) for i in indices]
        wall_p, peer_got, steps_p = counted_pass(url, api_key, peer, concurrency, mode)
        tokens = sum(t for t, _, _ in got)
        peer_tokens = sum(t for t, _, _ in peer_got)
        if peer_tokens != tokens:
            raise RuntimeError(f"{mode}: the peer generated {peer_tokens} tokens, not {tokens}")
        constrained_tokens += tokens
        all_tokens += 2 * tokens
        rows.append({"wall_c": wall_c, "wall_p": wall_p, "tokens": tokens,
                     "steps_c": steps_c, "steps_p": steps_p,
                     "stopped": sum(1 for _, s, _ in got if s),
                     "latency_c": statistics.median(l for _, _, l in got),
                     "latency_p": statistics.median(l for _, _, l in peer_got)})
    return rows, constrained_tokens, all_tokens


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

    if args.url is None and not (args.megactx and args.model):
        parser.error("give --url, or --megactx and --model")
    table = []
    for mode in modes:
        for concurrency in concurrencies:
            count = max(concurrency * args.requests_per_worker, args.min_requests)
            server = None
            url = args.url
            if url is None:  # a server per row: its phase times are the row's
                server = Server(args.megactx, args.model, shlex.split(args.server_args))
                url = server.url
            try:
                rows, constrained_tokens, all_tokens = measure(
                    url, args.api_key, mode, concurrency, count, args.max_tokens, args.repeat)
            finally:
                phases = server.stop() if server else {}
            c_rates = [r["tokens"] / r["wall_c"] for r in rows]
            p_rates = [r["tokens"] / r["wall_p"] for r in rows]
            masks = None
            if "grammar masks" in phases:  # us per token: masks, the whole engine step
                masks = (1000 * phases["grammar masks"] / constrained_tokens,
                         1000 * sum(phases.values()) / all_tokens)
            table.append({
                "mode": mode, "concurrency": concurrency, "count": count,
                "tokens": rows[0]["tokens"], "stopped": rows[0]["stopped"],
                "c_rate": statistics.median(c_rates), "p_rate": statistics.median(p_rates),
                "c_rates": c_rates, "p_rates": p_rates,
                "latency_c": statistics.median(r["latency_c"] for r in rows),
                "latency_p": statistics.median(r["latency_p"] for r in rows), "masks": masks,
                "steps": [(r["steps_c"], r["steps_p"]) for r in rows
                          if r["steps_c"] and r["steps_p"]]})
            print(f"{mode} c={concurrency}: {table[-1]['c_rate']:.1f} tok/s constrained, "
                  f"{table[-1]['p_rate']:.1f} unconstrained", file=sys.stderr)

    def rate(median_rate, rates):  # the median, and the range when repeated
        return f"{median_rate:.1f}" + (f" ({min(rates):.1f}-{max(rates):.1f})"
                                       if len(rates) > 1 else "")

    print("| constraint | concurrency | requests | output tokens | ended by the grammar "
          "| constrained tok/s | unconstrained tok/s (same run) | ratio "
          "| median latency s, constrained / unconstrained "
          "| grammar masks, us per constrained token | engine step, us per output token "
          "| mask share |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row in table:
        masks = row["masks"]
        mask_text = (f"{masks[0]:.2f} | {masks[1]:.1f} | {100 * masks[0] / masks[1]:.2f}%"
                     if masks else "(not measured) | | ")
        print(f"| {row['mode']} | {row['concurrency']} | {row['count']} | {row['tokens']} "
              f"| {row['stopped']}/{row['count']} | {rate(row['c_rate'], row['c_rates'])} "
              f"| {rate(row['p_rate'], row['p_rates'])} | {row['c_rate'] / row['p_rate']:.3f} "
              f"| {row['latency_c']:.2f} / {row['latency_p']:.2f} | {mask_text} |")

    # Where a gap comes from: more steps (fewer rows per step) or slower steps.
    if any(row["steps"] for row in table):
        print("\nEngine steps per pass (medians over the repeats; /metrics counters read around "
              "each pass):\n")
        print("| constraint | concurrency | steps, constrained / unconstrained "
              "| tokens per step | ms per step (engine wall) | engine busy share of the pass |")
        print("|---|---|---|---|---|---|")
        for row in table:
            if not row["steps"]:
                continue
            def median_of(k, i):
                return statistics.median(pair[k][i] for pair in row["steps"])
            steps = (median_of(0, 0), median_of(1, 0))
            tokens = (median_of(0, 1) / steps[0], median_of(1, 1) / steps[1])
            ms = (1000 * median_of(0, 2) / steps[0], 1000 * median_of(1, 2) / steps[1])
            busy = (median_of(0, 2) * row["c_rate"] / row["tokens"],
                    median_of(1, 2) * row["p_rate"] / row["tokens"])
            print(f"| {row['mode']} | {row['concurrency']} | {steps[0]:.0f} / {steps[1]:.0f} "
                  f"| {tokens[0]:.1f} / {tokens[1]:.1f} | {ms[0]:.3f} / {ms[1]:.3f} "
                  f"| {100 * busy[0]:.0f}% / {100 * busy[1]:.0f}% |")


if __name__ == "__main__":
    main()
