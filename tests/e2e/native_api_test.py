"""End-to-end test of the SGLang-compatible native API of `megactx serve`.

Drives the real server on loopback with a plain HTTP client (Debian's
python3-requests), the way RL frameworks call SGLang: /generate (text, ids,
batch, stream, logprobs, scoring), /abort_request, /flush_cache, prefix-cache
hits, /metrics, error statuses and the API key; structured outputs
(sampling_params json_schema, regex, ebnf; batches mixing constrained and free
prompts; with MTP speculation). Independent references: `megactx generate`
(greedy ids), `megactx logits` (prefill logits, from which the scoring
logprobs are recomputed with numpy), Python's `re.fullmatch` for regexes and
grammars, json_schema_check.py (written from the JSON Schema specification).

    python3 native_api_test.py --megactx build/megactx --model models/default
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import numpy as np
import requests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from megactx_server import MegactxServer, run_megactx  # noqa: E402
import json_schema_check  # noqa: E402

ARGS = None
SERVER = None
# Exact KV (f32) so the server, `generate` and `logits` agree to rounding.
SERVER_ARGS = ("--kv-dtype", "f32", "--max-request-bytes", "1048576")


def prompt_ids(length, seed):
    rng = np.random.default_rng(seed)
    return [int(x) for x in rng.integers(100, 8000, size=length)]


def generate(payload, **kwargs):
    return requests.post(SERVER.url + "/generate", json=payload, timeout=300, **kwargs)


def sse_events(response):
    events = []
    for line in response.iter_lines(decode_unicode=True):
        if not line or not line.startswith("data: "):
            continue
        data = line[len("data: "):]
        if data == "[DONE]":
            events.append("[DONE]")
        else:
            events.append(json.loads(data))
    return events


class NativeApi(unittest.TestCase):
    def test_health_and_info(self):
        self.assertEqual(requests.get(SERVER.url + "/health", timeout=30).status_code, 200)
        self.assertEqual(requests.get(SERVER.url + "/health_generate", timeout=120).status_code, 200)
        info = requests.get(SERVER.url + "/get_model_info", timeout=30).json()
        self.assertEqual(info["model_type"], "glm_moe_dsa")
        self.assertTrue(info["is_generation"])
        server = requests.get(SERVER.url + "/get_server_info", timeout=30).json()
        self.assertGreater(server["context_length"], 0)

    def test_greedy_ids_equal_megactx_generate(self):
        ids = prompt_ids(12, 1)
        response = generate({"input_ids": ids, "sampling_params": {
            "max_new_tokens": 12, "temperature": 0, "ignore_eos": True}})
        self.assertEqual(response.status_code, 200, response.text)
        body = response.json()
        expected = run_megactx(ARGS.megactx, "generate", "--model", ARGS.model, "--input-ids",
                               ",".join(map(str, ids)), "--max-new-tokens", "12",
                               "--temperature", "0", "--ignore-eos", "--format", "ids",
                               "--kv-dtype", "f32")
        expected_ids = [int(x) for x in expected.strip().split(",") if x]
        self.assertEqual(body["output_ids"], expected_ids)
        self.assertEqual(body["meta_info"]["completion_tokens"], 12)
        self.assertEqual(body["meta_info"]["finish_reason"]["type"], "length")
        self.assertEqual(body["meta_info"]["prompt_tokens"], 12)

    def test_text_prompt_and_stream_agree(self):
        payload = {"text": "The quick brown fox", "sampling_params": {
            "max_new_tokens": 10, "temperature": 0, "ignore_eos": True}}
        whole = generate(payload).json()
        with generate(dict(payload, stream=True), stream=True) as response:
            self.assertEqual(response.status_code, 200)
            self.assertTrue(response.headers["Content-Type"].startswith("text/event-stream"))
            events = sse_events(response)
        self.assertEqual(events[-1], "[DONE]")
        chunks = events[:-1]
        self.assertGreaterEqual(len(chunks), 2)
        # SGLang streams cumulative text.
        for a, b in zip(chunks, chunks[1:]):
            self.assertTrue(b["text"].startswith(a["text"]))
        self.assertEqual(chunks[-1]["text"], whole["text"])
        self.assertEqual(chunks[-1]["output_ids"], whole["output_ids"])
        self.assertEqual(chunks[-1]["meta_info"]["finish_reason"]["type"], "length")

    def test_batch_equals_single_requests(self):
        prompts = [prompt_ids(9, 2), prompt_ids(15, 3)]
        params = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
        batch = generate({"input_ids": prompts, "sampling_params": params}).json()
        self.assertEqual(len(batch), 2)
        for prompt, result in zip(prompts, batch):
            single = generate({"input_ids": prompt, "sampling_params": params}).json()
            self.assertEqual(result["output_ids"], single["output_ids"])

    def test_scoring_matches_prefill_logits_and_decode_logprobs(self):
        ids = prompt_ids(10, 4)
        generated = generate({"input_ids": ids, "return_logprob": True, "sampling_params": {
            "max_new_tokens": 6, "temperature": 0, "ignore_eos": True}}).json()
        out_ids = generated["output_ids"]
        decode_logprobs = [entry[0] for entry in generated["meta_info"]["output_token_logprobs"]]
        self.assertEqual([entry[1] for entry in generated["meta_info"]["output_token_logprobs"]],
                         out_ids)
        full = ids + out_ids
        scored = generate({"input_ids": full, "return_logprob": True, "logprob_start_len": 0,
                           "sampling_params": {"max_new_tokens": 0}})
        self.assertEqual(scored.status_code, 200, scored.text)
        meta = scored.json()["meta_info"]
        self.assertEqual(meta["completion_tokens"], 0)
        entries = meta["input_token_logprobs"]
        self.assertEqual(len(entries), len(full))
        self.assertIsNone(entries[0][0])
        self.assertEqual([e[1] for e in entries], full)
        # Reference: log_softmax of `megactx logits` at the previous position.
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "logits.f32")
            run_megactx(ARGS.megactx, "logits", "--model", ARGS.model, "--input-ids",
                        ",".join(map(str, full)), "--out", path)
            logits = np.fromfile(path, dtype=np.float32).reshape(len(full), -1).astype(np.float64)
        shifted = logits - logits.max(axis=1, keepdims=True)
        log_softmax = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        for position in range(1, len(full)):
            reference = log_softmax[position - 1, full[position]]
            self.assertAlmostEqual(entries[position][0], reference, delta=2e-3)
        # Decode-time logprobs of the generated tokens equal the prefill scores.
        for k, value in enumerate(decode_logprobs):
            self.assertAlmostEqual(value, entries[len(ids) + k][0], delta=2e-3)
        # The greedy token is the argmax of the reference logits.
        for k, token in enumerate(out_ids):
            self.assertEqual(int(np.argmax(logits[len(ids) + k - 1])), token)

    def test_top_logprobs(self):
        body = generate({"input_ids": prompt_ids(5, 5), "return_logprob": True,
                         "top_logprobs_num": 3,
                         "sampling_params": {"max_new_tokens": 3, "temperature": 0}}).json()
        tops = body["meta_info"]["output_top_logprobs"]
        chosen = body["meta_info"]["output_token_logprobs"]
        self.assertEqual(len(tops), len(chosen))
        for top, pick in zip(tops, chosen):
            self.assertEqual(len(top), 3)
            self.assertEqual(top[0][1], pick[1])  # greedy picks the most likely token
            values = [entry[0] for entry in top]
            self.assertEqual(values, sorted(values, reverse=True))

    def test_abort_request_returns_partial_output(self):
        rid = "e2e-abort-one"
        payload = {"input_ids": prompt_ids(8, 6), "rid": rid, "stream": True,
                   "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True,
                                       "temperature": 0}}
        with generate(payload, stream=True) as response:
            seen = []
            for line in response.iter_lines(decode_unicode=True):
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                seen.append(json.loads(line[6:]))
                if len(seen) == 2:
                    aborted = requests.post(SERVER.url + "/abort_request", json={"rid": rid},
                                            timeout=30)
                    self.assertEqual(aborted.status_code, 200)
        last = seen[-1]
        self.assertEqual(last["meta_info"]["finish_reason"]["type"], "abort")
        self.assertGreater(last["meta_info"]["completion_tokens"], 0)
        self.assertLess(last["meta_info"]["completion_tokens"], 4000)
        self.assertEqual(len(last["output_ids"]), last["meta_info"]["completion_tokens"])

    def test_abort_all_ends_blocking_requests(self):
        results = []

        def run(seed):
            results.append(generate({"input_ids": prompt_ids(6, seed), "sampling_params": {
                "max_new_tokens": 4000, "ignore_eos": True}}).json())

        threads = [threading.Thread(target=run, args=(s,)) for s in (7, 8)]
        for thread in threads:
            thread.start()
        # Both must be in the engine before abort_all (a loaded CI machine once
        # took over 60 s to get there); say what the server reported if not.
        deadline = time.time() + 180
        metrics = ""
        while time.time() < deadline:
            metrics = requests.get(SERVER.url + "/metrics", timeout=30).text
            if "megactx_num_running_reqs 2" in metrics:
                break
            time.sleep(0.05)
        else:
            self.fail("the two requests were never running together; last /metrics:\n" +
                      "\n".join(line for line in metrics.splitlines() if "num_" in line))
        self.assertEqual(requests.post(SERVER.url + "/abort_request", json={"abort_all": True},
                                       timeout=30).status_code, 200)
        for thread in threads:
            thread.join(300)
        self.assertEqual(len(results), 2)
        for result in results:
            self.assertEqual(result["meta_info"]["finish_reason"]["type"], "abort")

    def test_prefix_cache_hit_gives_identical_output(self):
        self.assertEqual(requests.post(SERVER.url + "/flush_cache", timeout=30).status_code, 200)
        shared = prompt_ids(200, 9)
        params = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
        first = generate({"input_ids": shared + [11, 12], "sampling_params": params}).json()
        second = generate({"input_ids": shared + [13, 14, 15], "sampling_params": params}).json()
        self.assertEqual(first["meta_info"]["cached_tokens"], 0)
        # Pages of 64 tokens: the 192 tokens of the 3 full shared pages are reused.
        self.assertGreaterEqual(second["meta_info"]["cached_tokens"], 128)
        self.assertEqual(requests.post(SERVER.url + "/flush_cache", timeout=30).status_code, 200)
        cold = generate({"input_ids": shared + [13, 14, 15], "sampling_params": params}).json()
        self.assertEqual(cold["meta_info"]["cached_tokens"], 0)
        self.assertEqual(cold["output_ids"], second["output_ids"])
        metrics = requests.get(SERVER.url + "/metrics", timeout=30).text
        hits = [line for line in metrics.splitlines()
                if line.startswith("megactx_prefix_cache_hit_tokens_total ")]
        self.assertEqual(len(hits), 1)
        self.assertGreater(float(hits[0].split()[1]), 0)

    def test_metrics_exposition(self):
        generate({"input_ids": prompt_ids(4, 10), "sampling_params": {"max_new_tokens": 3}})
        response = requests.get(SERVER.url + "/metrics", timeout=30)
        self.assertEqual(response.status_code, 200)
        text = response.text
        for name in ("megactx_time_to_first_token_seconds_bucket",
                     "megactx_time_per_output_token_seconds_count",
                     "megactx_e2e_request_latency_seconds_sum", "megactx_num_running_reqs",
                     "megactx_num_waiting_reqs", "megactx_kv_pages_used",
                     "megactx_kv_pages_total", "megactx_prefix_cache_hit_rate",
                     "megactx_generation_tokens_total", "megactx_spec_accept_length"):
            self.assertIn(name, text)

    def test_error_statuses(self):
        self.assertEqual(generate({"input_ids": [1], "sampling_params": {"top_p": 5}}).status_code, 400)
        bad = generate({"text": 3})
        self.assertEqual(bad.status_code, 400)
        self.assertEqual(bad.json()["error"]["param"], "text")
        self.assertEqual(requests.post(SERVER.url + "/generate", data=b"{not json",
                                       timeout=30).status_code, 400)
        self.assertEqual(requests.get(SERVER.url + "/nope", timeout=30).status_code, 404)
        self.assertEqual(requests.get(SERVER.url + "/generate", timeout=30).status_code, 405)
        big = requests.post(SERVER.url + "/generate", data=b" " * (2 << 20), timeout=30)
        self.assertEqual(big.status_code, 413)
        too_long = generate({"input_ids": [5] * 100000})
        self.assertEqual(too_long.status_code, 400)
        self.assertIn("context", too_long.json()["error"]["message"])
        # The server is still fine.
        self.assertEqual(requests.get(SERVER.url + "/health", timeout=30).status_code, 200)


# Structured outputs. Every schema, regex and grammar below bounds its output
# (bounded strings, arrays and integers; at most 8 whitespace characters per
# JSON gap), and max_new_tokens is above the longest output it allows, so a
# constrained answer must end by itself ("stop"); a wrong token let through
# fails the independent check.
PRODUCT_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 16},
        "kind": {"enum": ["tool", "toy", "food"]},
        "size": {"type": "object",
                 "properties": {"width": {"type": "integer", "minimum": 1, "maximum": 99},
                                "unit": {"enum": ["cm", "in"]}},
                 "required": ["width", "unit"], "additionalProperties": False},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "minItems": 1,
                 "maxItems": 3},
        "released": {"type": "string", "format": "date"},
        "score": {"type": "integer", "minimum": 0, "exclusiveMaximum": 5},
        "spare": {"anyOf": [{"type": "null"}, {"type": "boolean"}]},
    },
    "required": ["name", "kind", "size", "tags", "released", "spare"],
    "additionalProperties": False,
}
PHONE = r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}"
ANSWER = r"(yes|no), [a-z]{2,6}\."
# GBNF and the Python regex of the same (regular) language.
GREETING_EBNF = 'root ::= greeting " " name "!"\ngreeting ::= "hello" | "hi"\nname ::= [a-z]{1,8}'
GREETING_RE = r"(hello|hi) [a-z]{1,8}!"
LIST_EBNF = ('root ::= "[" item ("," ws item){0,3} "]"\n'
             'item ::= [0-9]{1,3} | "\\"" [a-z]{1,5} "\\""\nws ::= " "?')
LIST_RE = r'\[(?:[0-9]{1,3}|"[a-z]{1,5}")(?:, ?(?:[0-9]{1,3}|"[a-z]{1,5}")){0,3}\]'


def check_json(test, text, schema=PRODUCT_SCHEMA):
    try:
        value = json.loads(text)
    except ValueError as error:
        test.fail(f"not JSON ({error}): {text!r}")
    problems = json_schema_check.errors(schema, value)
    test.assertEqual(problems, [], text)
    return value


class StructuredGenerate(unittest.TestCase):
    def constrained(self, prompt, max_new_tokens, **sampling):
        """The /generate answer(s), each checked to have ended by itself."""
        response = generate({"text": prompt, "sampling_params": dict(
            {"max_new_tokens": max_new_tokens, "temperature": 0}, **sampling)})
        self.assertEqual(response.status_code, 200, response.text)
        body = response.json()
        results = body if isinstance(body, list) else [body]
        for result in results:
            self.assertEqual(result["meta_info"]["finish_reason"]["type"], "stop", result)
            self.assertLess(result["meta_info"]["completion_tokens"], max_new_tokens)
        return body

    def test_validator_self_test(self):
        json_schema_check.self_test()

    def test_json_schema(self):
        prompt = "Product record:"
        body = self.constrained(prompt, 800, json_schema=json.dumps(PRODUCT_SCHEMA))
        value = check_json(self, body["text"])
        # Properties in the schema's order, the optional one or not.
        self.assertEqual(list(value), [k for k in PRODUCT_SCHEMA["properties"] if k in value])
        # Left to itself the model writes prose here: the schema made the JSON.
        free = generate({"text": prompt, "sampling_params": {"max_new_tokens": 40,
                                                             "temperature": 0}}).json()
        try:
            self.assertNotEqual(json_schema_check.errors(PRODUCT_SCHEMA, json.loads(free["text"])), [])
        except ValueError:
            pass  # not even JSON

    def test_json_schema_sampled_n(self):
        body = self.constrained("Product record:", 800, json_schema=json.dumps(PRODUCT_SCHEMA),
                                temperature=1.0, n=3, seed=5)
        self.assertEqual(len(body), 3)
        texts = set()
        for result in body:
            check_json(self, result["text"])
            texts.add(result["text"])
        self.assertGreater(len(texts), 1)

    def test_regex(self):
        for prompt, pattern in (("Call me at", PHONE), ("Is the sky green?", ANSWER),
                                ("The code is", r"[A-Z]{3}-[0-9]{2,4}")):
            body = self.constrained(prompt, 40, regex=pattern)
            self.assertIsNotNone(re.fullmatch(pattern, body["text"]), (pattern, body["text"]))
        free = generate({"text": "Call me at", "sampling_params": {"max_new_tokens": 16,
                                                                   "temperature": 0}}).json()
        self.assertIsNone(re.fullmatch(PHONE, free["text"]), free["text"])

    def test_regex_sampled_and_streamed(self):
        body = self.constrained("Is the sky green?", 40, regex=ANSWER, temperature=1.0, n=4,
                                seed=9)
        for result in body:
            self.assertIsNotNone(re.fullmatch(ANSWER, result["text"]), result["text"])
        payload = {"text": "Call me at", "stream": True,
                   "sampling_params": {"max_new_tokens": 40, "temperature": 0, "regex": PHONE}}
        with generate(payload, stream=True) as response:
            self.assertEqual(response.status_code, 200)
            events = sse_events(response)
        self.assertEqual(events[-1], "[DONE]")
        chunks = events[:-1]
        self.assertGreater(len(chunks), 2)
        for chunk in chunks:  # cumulative text, ending in a match
            self.assertTrue(chunks[-1]["text"].startswith(chunk["text"]), chunk)
        self.assertIsNotNone(re.fullmatch(PHONE, chunks[-1]["text"]), chunks[-1]["text"])
        self.assertEqual(chunks[-1]["meta_info"]["finish_reason"]["type"], "stop")

    def test_ebnf(self):
        for prompt, grammar, pattern in (("Say hi:", GREETING_EBNF, GREETING_RE),
                                         ("A list:", LIST_EBNF, LIST_RE)):
            body = self.constrained(prompt, 60, ebnf=grammar)
            self.assertIsNotNone(re.fullmatch(pattern, body["text"]), (grammar, body["text"]))

    def test_batch_mixes_constrained_and_free_prompts(self):
        prompts = ["Call me at", "The quick brown fox", "Product record:", "Say hi:"]
        free = {"max_new_tokens": 10, "temperature": 0, "ignore_eos": True}
        params = [{"max_new_tokens": 40, "temperature": 0, "regex": PHONE}, free,
                  {"max_new_tokens": 800, "temperature": 0,
                   "json_schema": json.dumps(PRODUCT_SCHEMA)},
                  {"max_new_tokens": 60, "temperature": 0, "ebnf": GREETING_EBNF}]
        response = generate({"text": prompts, "sampling_params": params})
        self.assertEqual(response.status_code, 200, response.text)
        batch = response.json()
        self.assertEqual(len(batch), 4)
        self.assertIsNotNone(re.fullmatch(PHONE, batch[0]["text"]), batch[0]["text"])
        self.assertEqual(batch[1]["meta_info"]["completion_tokens"], 10)
        check_json(self, batch[2]["text"])
        self.assertIsNotNone(re.fullmatch(GREETING_RE, batch[3]["text"]), batch[3]["text"])
        # Each row's mask is its own: batched outputs equal the prompts alone.
        for prompt, param, result in zip(prompts, params, batch):
            alone = generate({"text": prompt, "sampling_params": param}).json()
            self.assertEqual(alone["output_ids"], result["output_ids"], prompt)

    def test_bad_grammars_are_400_naming_the_problem(self):
        cases = [({"regex": "(ab"}, "regex", "missing ')'"),
                 ({"regex": "[z-a]"}, "regex", "out of order"),
                 ({"json_schema": "{not json"}, "json_schema", "not valid JSON"),
                 ({"json_schema": json.dumps({"type": "strnig"})}, "json_schema", "'strnig'"),
                 ({"json_schema": json.dumps({"type": "integer", "minimum": 3, "maximum": 1})},
                  "json_schema", "minimum 3, maximum 1"),
                 ({"json_schema": {"type": "object"}}, "json_schema", "must be a string"),
                 ({"ebnf": "root ::= foo"}, "ebnf", "'foo'"),
                 ({"ebnf": 'root ::= "a'}, "ebnf", "unterminated"),
                 ({"regex": "a", "ebnf": 'root ::= "a"'}, "ebnf", "only one"),
                 ({"regex": "[0-9]+", "ignore_eos": True}, "ignore_eos", "structured output")]
        for sampling, param, needle in cases:
            response = generate({"text": "hi", "sampling_params": dict(max_new_tokens=4,
                                                                       **sampling)})
            self.assertEqual(response.status_code, 400, (sampling, response.text))
            error = response.json()["error"]
            self.assertEqual(error["param"], param, error)
            self.assertIn(needle, error["message"])
        # A bad item fails the whole batch, before anything runs.
        response = generate({"text": ["a", "b"], "sampling_params": [
            {"max_new_tokens": 4}, {"max_new_tokens": 4, "regex": "(("}]})
        self.assertEqual(response.status_code, 400, response.text)


class StructuredSpeculative(unittest.TestCase):
    def test_mtp_drafts_keep_greedy_constrained_outputs(self):
        # The MTP drafter proposes tokens the grammar may reject; the
        # verification against the masked target must give the same greedy
        # output as plain decoding.
        requests_ = [{"text": "Product record:", "sampling_params": {
                          "max_new_tokens": 800, "temperature": 0,
                          "json_schema": json.dumps(PRODUCT_SCHEMA)}},
                     {"text": "Call me at", "sampling_params": {
                          "max_new_tokens": 40, "temperature": 0, "regex": PHONE}}]
        plain = [generate(r).json() for r in requests_]
        with MegactxServer(ARGS.megactx, ARGS.model, *SERVER_ARGS, "--speculative-steps",
                           "2") as server:
            for request, expected in zip(requests_, plain):
                response = requests.post(server.url + "/generate", json=request, timeout=300)
                self.assertEqual(response.status_code, 200, response.text)
                body = response.json()
                self.assertEqual(body["output_ids"], expected["output_ids"])
                self.assertGreater(body["meta_info"]["spec_verify_ct"], 0)
        check_json(self, plain[0]["text"])
        self.assertIsNotNone(re.fullmatch(PHONE, plain[1]["text"]))


class ApiKey(unittest.TestCase):
    def test_bearer_key_required(self):
        with MegactxServer(ARGS.megactx, ARGS.model, "--api-key", "e2e-key") as server:
            url = server.url + "/generate"
            payload = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}}
            self.assertEqual(requests.post(url, json=payload, timeout=60).status_code, 401)
            wrong = requests.post(url, json=payload, timeout=60,
                                  headers={"Authorization": "Bearer nope"})
            self.assertEqual(wrong.status_code, 401)
            self.assertEqual(wrong.json()["error"]["type"], "authentication_error")
            right = requests.post(url, json=payload, timeout=60,
                                  headers={"Authorization": "Bearer e2e-key"})
            self.assertEqual(right.status_code, 200)
            self.assertEqual(requests.get(server.url + "/health", timeout=30).status_code, 200)


class SkipTokenizerInit(unittest.TestCase):
    def test_token_ids_only(self):
        with MegactxServer(ARGS.megactx, ARGS.model, "--skip-tokenizer-init") as server:
            ids = prompt_ids(20, 41)
            payload = {"input_ids": ids, "sampling_params": {"max_new_tokens": 4,
                                                             "temperature": 0}}
            plain = generate(payload).json()
            response = requests.post(server.url + "/generate", json=payload, timeout=60)
            self.assertEqual(response.status_code, 200, response.text)
            self.assertEqual(response.json()["output_ids"], plain["output_ids"])
            self.assertEqual(response.json()["text"], "")
            for path, body in (("/generate", {"text": "hello"}),
                               ("/v1/chat/completions",
                                {"model": "default",
                                 "messages": [{"role": "user", "content": "hi"}]})):
                refused = requests.post(server.url + path, json=body, timeout=60)
                self.assertEqual(refused.status_code, 400, refused.text)
                self.assertIn("input_ids", refused.json()["error"]["message"])


class HostKvTier(unittest.TestCase):
    def test_evicted_prefix_comes_back_from_host_memory(self):
        # 10 pages of f32 KV on the device, 64 MiB of host tier behind them.
        with MegactxServer(ARGS.megactx, ARGS.model, "--kv-dtype", "f32", "--host-kv-memory",
                           "64MiB", kv_memory="3840KiB") as server:
            def run(ids):
                response = requests.post(server.url + "/generate", timeout=300, json={
                    "input_ids": ids, "return_logprob": True,
                    "sampling_params": {"max_new_tokens": 8, "temperature": 0}})
                self.assertEqual(response.status_code, 200, response.text)
                return response.json()

            prompt = prompt_ids(150, 31)
            cold = run(prompt)
            for seed in (32, 33, 34, 35):  # push the prompt's pages out of the device pool
                run(prompt_ids(200, seed))
            warm = run(prompt)
            self.assertEqual(cold["meta_info"]["cached_tokens"], 0)
            self.assertEqual(warm["meta_info"]["cached_tokens"], 128)
            self.assertEqual(warm["output_ids"], cold["output_ids"])
            for (got, _, _), (want, _, _) in zip(warm["meta_info"]["output_token_logprobs"],
                                                 cold["meta_info"]["output_token_logprobs"]):
                self.assertAlmostEqual(got, want, delta=1e-4)
            metrics = requests.get(server.url + "/metrics", timeout=30).text
            values = dict(line.split(" ", 1) for line in metrics.splitlines()
                          if line and not line.startswith("#"))
            self.assertGreaterEqual(float(values["megactx_prefix_cache_host_hit_tokens_total"]),
                                    128)
            self.assertGreater(float(values["megactx_host_kv_saved_pages_total"]), 0)
            self.assertGreater(float(values["megactx_host_kv_pages_total"]), 0)
            info = requests.get(server.url + "/get_server_info", timeout=30).json()
            self.assertEqual(info["host_kv_memory"], "64MiB")


class LiveHostTier(unittest.TestCase):
    def test_decoding_requests_move_their_pages_to_host_memory(self):
        # --host-latent-memory: three requests decode from their offloaded pages with exactly
        # the tokens and logprobs of a server without the tier; /metrics counts the moved pages,
        # /get_server_info names the memory; a size below one page, or a threshold without a
        # tier, is a start-up error.
        prompts = [prompt_ids(150 + 40 * i, 51 + i) for i in range(3)]

        def run(*extra):
            with MegactxServer(ARGS.megactx, ARGS.model, "--kv-dtype", "f32", *extra,
                               kv_memory="16MiB", name="latent") as server:
                bodies = []
                for ids in prompts:
                    response = requests.post(server.url + "/generate", timeout=300, json={
                        "input_ids": ids, "return_logprob": True,
                        "sampling_params": {"max_new_tokens": 70, "temperature": 0,
                                            "ignore_eos": True}})
                    self.assertEqual(response.status_code, 200, response.text)
                    bodies.append(response.json())
                metrics = requests.get(server.url + "/metrics", timeout=30).text
                values = dict(line.split(" ", 1) for line in metrics.splitlines()
                              if line and not line.startswith("#"))
                info = requests.get(server.url + "/get_server_info", timeout=30).json()
                return bodies, values, info

        plain, _, _ = run()
        tiered, values, info = run("--host-latent-memory", "32MiB")
        for got, want in zip(tiered, plain):
            self.assertEqual(got["output_ids"], want["output_ids"])
            self.assertEqual([entry[0] for entry in got["meta_info"]["output_token_logprobs"]],
                             [entry[0] for entry in want["meta_info"]["output_token_logprobs"]])
        self.assertGreater(float(values["megactx_host_latent_moved_pages_total"]), 0)
        self.assertGreater(float(values["megactx_host_latent_pages_total"]), 0)
        self.assertEqual(float(values["megactx_host_latent_pages_used"]), 0)
        # What reading the tier cost: the CPU model reads offload pages in place
        # (no hot cache, nothing copied); CUDA fills these (cuda_live_host_tier_test).
        for name in ("selected_entries", "hot_hits", "copied_bytes", "read_steps"):
            self.assertEqual(float(values[f"megactx_host_latent_{name}_total"]), 0, name)
        self.assertEqual(info["host_latent_memory"], "32MiB")
        result = subprocess.run([ARGS.megactx, "serve", "--model", ARGS.model,
                                 "--host-latent-memory", "1KiB"],
                                capture_output=True, text=True, timeout=60)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("host latent memory", result.stderr)
        result = subprocess.run([ARGS.megactx, "serve", "--model", ARGS.model,
                                 "--host-latent-min-tokens", "100"],
                                capture_output=True, text=True, timeout=60)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("--host-latent-memory", result.stderr)


class IndexTopk(unittest.TestCase):
    def test_the_keys_each_query_attends_to_are_the_servers_choice(self):
        # The default model attends to its indexer's top 128 keys: --index-topk 128 changes
        # nothing, --index-topk 2 (two keys per query) changes the continuation of a
        # 600-token prompt, and a negative value is a start-up error.
        prompt = prompt_ids(600, 41)

        def continuation(*extra):
            with MegactxServer(ARGS.megactx, ARGS.model, *SERVER_ARGS, *extra,
                               name="topk") as server:
                response = requests.post(server.url + "/generate", timeout=300, json={
                    "input_ids": prompt,
                    "sampling_params": {"max_new_tokens": 12, "temperature": 0,
                                        "ignore_eos": True}})
                self.assertEqual(response.status_code, 200, response.text)
                return response.json()["output_ids"]

        plain = continuation()
        self.assertEqual(continuation("--index-topk", "128"), plain)
        self.assertNotEqual(continuation("--index-topk", "2"), plain)
        result = subprocess.run([ARGS.megactx, "serve", "--model", ARGS.model, "--index-topk",
                                 "-1"], capture_output=True, text=True, timeout=60)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("--index-topk", result.stderr)


def main():
    global ARGS, SERVER
    parser = argparse.ArgumentParser()
    parser.add_argument("--megactx", required=True)
    parser.add_argument("--model", required=True)
    ARGS, rest = parser.parse_known_args()
    with MegactxServer(ARGS.megactx, ARGS.model, *SERVER_ARGS) as server:
        SERVER = server
        program = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2)
    sys.exit(0 if program.result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
