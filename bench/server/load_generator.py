"""Load generator for `megactx serve` (or any OpenAI/SGLang-compatible server).

Streams requests over raw asyncio HTTP/1.1 connections (no third-party
packages) and reports throughput and TTFT / TPOT / end-to-end percentiles.
Traffic goes to 127.0.0.1 only; every run is bounded in requests and time.

  # concurrency sweep on /generate (token-id prompts, fixed output length)
  python3 bench/server/load_generator.py sweep --port 30000 --concurrency 1,4,16,64 \
      --requests 64 --prompt-tokens 128 --output-tokens 32

  # N concurrent streaming connections, all open at once; counts errors
  python3 bench/server/load_generator.py connections --port 30000 --connections 1000 \
      --output-tokens 8
"""
import argparse
import asyncio
import json
import random
import statistics
import sys
import time

HOST = "127.0.0.1"  # loopback only


class Result:
    __slots__ = ("ok", "error", "start", "first", "end", "tokens")

    def __init__(self):
        self.ok = False
        self.error = ""
        self.start = self.first = self.end = 0.0
        self.tokens = 0


def request_bytes(args, index):
    rng = random.Random(args.seed * 1000003 + index)
    prompt = [rng.randrange(100, args.vocab) for _ in range(args.prompt_tokens)]
    if args.api == "generate":
        path = "/generate"
        body = {"input_ids": prompt, "stream": True,
                "sampling_params": {"max_new_tokens": args.output_tokens, "ignore_eos": True,
                                    "temperature": args.temperature}}
    else:
        path = "/v1/completions"
        body = {"model": args.model, "prompt": prompt, "stream": True,
                "max_tokens": args.output_tokens, "ignore_eos": True,
                "temperature": args.temperature}
    payload = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n")
    if args.api_key:
        head += f"Authorization: Bearer {args.api_key}\r\n"
    return (head + "\r\n").encode() + payload


async def read_chunked_events(reader, on_event):
    """Reads a chunked SSE body, calling on_event(data) per 'data: ' line."""
    pending = b""
    while True:
        size_line = await reader.readline()
        if not size_line:
            raise ConnectionError("connection closed mid-stream")
        size = int(size_line.strip() or b"0", 16)
        if size == 0:
            await reader.readline()
            return
        pending += await reader.readexactly(size)
        await reader.readexactly(2)
        while b"\n\n" in pending:
            event, pending = pending.split(b"\n\n", 1)
            if event.startswith(b"data: "):
                on_event(event[6:])


async def one_request(args, index, result, opened=None, go=None):
    result.start = time.perf_counter()
    try:
        reader, writer = await asyncio.open_connection(HOST, args.port, limit=1 << 20)
        if opened is not None:
            opened.append(1)
            await go.wait()
            result.start = time.perf_counter()
        writer.write(request_bytes(args, index))
        await writer.drain()
        status_line = await reader.readline()
        status = int(status_line.split()[1]) if status_line else 0
        headers = {}
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        if status != 200:
            length = int(headers.get("content-length", "0"))
            body = await reader.readexactly(length) if length else b""
            result.error = f"HTTP {status}: {body[:200]!r}"
            writer.close()
            return
        state = {"done": False, "last_ids": 0}

        def on_event(data):
            if data == b"[DONE]":
                state["done"] = True
                return
            event = json.loads(data)
            if "error" in event:
                raise RuntimeError(str(event["error"]))
            if args.api == "generate":
                produced = len(event.get("output_ids", []))
            else:
                produced = state["last_ids"] + (1 if event["choices"] and event["choices"][0].get("text") else 0)
            if produced > state["last_ids"]:
                if not result.first:
                    result.first = time.perf_counter()
                state["last_ids"] = produced

        await asyncio.wait_for(read_chunked_events(reader, on_event), args.timeout)
        result.end = time.perf_counter()
        result.tokens = state["last_ids"]
        result.ok = state["done"] and result.tokens > 0
        if not result.ok:
            result.error = f"stream ended without [DONE] or tokens ({result.tokens})"
        writer.close()
    except Exception as error:  # counted as an error, never fatal to the run
        result.error = f"{type(error).__name__}: {error}"
        result.end = time.perf_counter()


def percentile(values, q):
    if not values:
        return float("nan")
    values = sorted(values)
    k = (len(values) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def summarize(results, wall):
    good = [r for r in results if r.ok]
    ttft = [(r.first - r.start) * 1e3 for r in good if r.first]
    tpot = [(r.end - r.first) * 1e3 / (r.tokens - 1) for r in good if r.first and r.tokens > 1]
    e2e = [(r.end - r.start) * 1e3 for r in good]
    tokens = sum(r.tokens for r in good)
    return {
        "requests": len(results), "errors": len(results) - len(good), "wall_s": wall,
        "req_per_s": len(good) / wall if wall else 0.0,
        "output_tok_per_s": tokens / wall if wall else 0.0,
        "ttft_ms_p50": percentile(ttft, 0.5), "ttft_ms_p90": percentile(ttft, 0.9),
        "ttft_ms_p99": percentile(ttft, 0.99),
        "tpot_ms_p50": percentile(tpot, 0.5), "tpot_ms_p90": percentile(tpot, 0.9),
        "tpot_ms_p99": percentile(tpot, 0.99),
        "e2e_ms_p50": percentile(e2e, 0.5), "e2e_ms_p99": percentile(e2e, 0.99),
        "first_errors": [r.error for r in results if not r.ok][:3],
    }


async def run_at_concurrency(args, concurrency):
    results = [Result() for _ in range(args.requests)]
    queue = list(range(args.requests))

    async def worker():
        while queue:
            index = queue.pop()
            await one_request(args, index, results[index])

    start = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(concurrency))),
                           args.run_timeout)
    return summarize(results, time.perf_counter() - start)


async def sweep(args):
    print("| concurrency | requests | errors | req/s | output tok/s | TTFT p50 / p90 / p99 ms "
          "| TPOT p50 / p90 / p99 ms | E2E p50 / p99 ms |")
    print("|---|---|---|---|---|---|---|---|")
    all_rows = []
    for concurrency in [int(c) for c in args.concurrency.split(",")]:
        row = await run_at_concurrency(args, concurrency)
        row["concurrency"] = concurrency
        all_rows.append(row)
        print(f"| {concurrency} | {row['requests']} | {row['errors']} | {row['req_per_s']:.2f} | "
              f"{row['output_tok_per_s']:.1f} | {row['ttft_ms_p50']:.1f} / {row['ttft_ms_p90']:.1f} / "
              f"{row['ttft_ms_p99']:.1f} | {row['tpot_ms_p50']:.2f} / {row['tpot_ms_p90']:.2f} / "
              f"{row['tpot_ms_p99']:.2f} | {row['e2e_ms_p50']:.0f} / {row['e2e_ms_p99']:.0f} |",
              flush=True)
        if row["errors"]:
            print("  errors:", row["first_errors"], file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(all_rows, f, indent=2)
    return 0 if all(r["errors"] == 0 for r in all_rows) else 1


async def connections(args):
    """Opens every connection first, then starts all streams at once."""
    results = [Result() for _ in range(args.connections)]
    opened, go = [], asyncio.Event()
    tasks = [asyncio.create_task(one_request(args, i, results[i], opened, go))
             for i in range(args.connections)]
    deadline = time.perf_counter() + 60
    while len(opened) < args.connections and time.perf_counter() < deadline:
        if all(t.done() for t in tasks):
            break
        await asyncio.sleep(0.01)
    start = time.perf_counter()
    go.set()
    await asyncio.wait_for(asyncio.gather(*tasks), args.run_timeout)
    row = summarize(results, time.perf_counter() - start)
    print(f"{args.connections} concurrent streaming connections ({len(opened)} opened before the "
          f"start): {row['requests'] - row['errors']} completed, {row['errors']} errors, "
          f"{row['wall_s']:.2f} s, {row['output_tok_per_s']:.0f} output tok/s, "
          f"TTFT p50 {row['ttft_ms_p50']:.0f} ms / p99 {row['ttft_ms_p99']:.0f} ms, "
          f"E2E p99 {row['e2e_ms_p99']:.0f} ms")
    if row["errors"]:
        print("  errors:", row["first_errors"], file=sys.stderr)
    return 0 if row["errors"] == 0 else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["sweep", "connections"])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--api", choices=["generate", "completions"], default="generate")
    parser.add_argument("--model", default="default")
    parser.add_argument("--api-key", default="")
    parser.add_argument("--concurrency", default="1,4,16,64")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=600, help="per request, seconds")
    parser.add_argument("--run-timeout", type=float, default=1800, help="per run, seconds")
    parser.add_argument("--json", default="", help="also write the sweep rows here")
    args = parser.parse_args()
    if args.requests > 100000 or args.connections > 20000:
        parser.error("bounded: at most 100000 requests and 20000 connections")
    runner = sweep if args.mode == "sweep" else connections
    sys.exit(asyncio.run(runner(args)))


if __name__ == "__main__":
    main()
