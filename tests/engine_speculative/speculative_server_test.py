"""`megactx serve --speculative-steps 3` on loopback: /generate reports the MTP
counters in meta_info (spec_verify_ct > 0, accepted <= drafted <= 3 x verify),
greedy output equals `megactx generate` without speculation (an independent
path: SequenceRunner, no engine), and /metrics counts the verifications.

    python3 speculative_server_test.py --megactx build/megactx --model models/default
"""
import argparse
import os
import re
import sys
import time
import unittest

import requests

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
from megactx_server import MegactxServer, run_megactx  # noqa: E402

ARGS = None
SERVER = None
PROMPT = [101, 2024, 311, 877, 45, 1290, 77, 3051, 640, 18, 912, 2211, 530, 61, 4090, 7]


class SpeculativeServer(unittest.TestCase):
    def test_generate_reports_spec_counters_and_equals_plain(self):
        response = requests.post(SERVER.url + "/generate", timeout=300, json={
            "input_ids": PROMPT,
            "sampling_params": {"temperature": 0, "max_new_tokens": 32, "ignore_eos": True}})
        self.assertEqual(response.status_code, 200, response.text)
        body = response.json()
        meta = body["meta_info"]
        self.assertGreater(meta["spec_verify_ct"], 0)
        self.assertLessEqual(meta["spec_accept_token_num"], meta["spec_draft_token_num"])
        self.assertLessEqual(meta["spec_draft_token_num"], 3 * meta["spec_verify_ct"])
        self.assertEqual(meta["completion_tokens"], 32)
        plain = run_megactx(ARGS.megactx, "generate", "--model", ARGS.model, "--input-ids",
                            ",".join(map(str, PROMPT)), "--max-new-tokens", "32",
                            "--temperature", "0", "--ignore-eos", "--kv-dtype", "f32")
        self.assertEqual(body["output_ids"], [int(x) for x in plain.strip().split(",")])

        # The engine publishes its stats right after delivering the step's
        # updates: poll briefly.
        verified = 0.0
        for _ in range(50):
            metrics = requests.get(SERVER.url + "/metrics", timeout=60).text
            match = re.search(r"^megactx_spec_verify_steps_total\S*\s+(\S+)$", metrics, re.M)
            self.assertIsNotNone(match, metrics)
            verified = float(match.group(1))
            if verified >= meta["spec_verify_ct"]:
                break
            time.sleep(0.1)
        self.assertGreaterEqual(verified, meta["spec_verify_ct"])

    def test_batch_equals_single_requests(self):
        # Six prompts of different lengths verified together (different accept
        # counts per step) give what each gives alone.
        prompts = [PROMPT[: 3 + 2 * i] + [500 + i] for i in range(6)]
        params = {"temperature": 0, "max_new_tokens": 20, "ignore_eos": True}
        batch = requests.post(SERVER.url + "/generate", timeout=300, json={
            "input_ids": prompts, "sampling_params": params}).json()
        self.assertEqual(len(batch), len(prompts))
        for prompt, result in zip(prompts, batch):
            single = requests.post(SERVER.url + "/generate", timeout=300, json={
                "input_ids": prompt, "sampling_params": params}).json()
            self.assertEqual(result["output_ids"], single["output_ids"])
            self.assertGreater(result["meta_info"]["spec_verify_ct"], 0)

    def test_sampled_request_reports_spec_counters(self):
        response = requests.post(SERVER.url + "/generate", timeout=300, json={
            "input_ids": PROMPT,
            "sampling_params": {"temperature": 1.0, "top_p": 0.9, "max_new_tokens": 24,
                                "ignore_eos": True, "seed": 7}})
        self.assertEqual(response.status_code, 200, response.text)
        meta = response.json()["meta_info"]
        self.assertGreater(meta["spec_verify_ct"], 0)
        self.assertLessEqual(meta["spec_accept_token_num"], meta["spec_draft_token_num"])


def main():
    global ARGS, SERVER
    parser = argparse.ArgumentParser()
    parser.add_argument("--megactx", required=True)
    parser.add_argument("--model", required=True)
    ARGS, rest = parser.parse_known_args()
    with MegactxServer(ARGS.megactx, ARGS.model, "--kv-dtype", "f32",
                       "--speculative-steps", "3") as server:
        SERVER = server
        result = unittest.main(argv=[sys.argv[0], *rest], exit=False).result
    sys.exit(0 if result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
