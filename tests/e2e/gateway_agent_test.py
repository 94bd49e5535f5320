"""End-to-end test of the agent gateway: a real agent loop against `megactx serve`.

The agent speaks only the OpenAI chat API over HTTP (Debian's python3-requests),
with an X-Session-Id header per session, and executes the tools the embedded
default model calls in a scratch directory. It runs

  * a main session: a calculator call, its result, a follow-up user turn;
    then a compaction (the history replaced by a summary) and another call;
  * a sub-agent (X-Parent-Session-Id) asked to set a timer, which a rules
    file flags ("judge": false), so in intercept mode the call never reaches
    the agent: the gateway answers it with a virtual tool result and returns
    the model's next turn instead (the timer file is never written);

and then checks what the gateway recorded against the engine itself: every
sample's tokens rescored by /generate (max_new_tokens 0, return_logprob,
logprob_start_len 0, top-1) give back the rollout logprobs on the model
tokens, each of which is the greedy choice (so they are the tokens the engine
generated); loss masks are 1 exactly on model tokens; the compaction's
sub-trace starts from the fresh tokenization of its request (/tokenize); the
sub-agent is its own sample of the same rollout; the JSONL export, the judge
(this engine, schema-constrained) and /metrics.

    python3 gateway_agent_test.py --megactx build/megactx --model models/default
"""
import argparse
import json
import os
import sys
import tempfile
import unittest

import requests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from megactx_server import MegactxServer  # noqa: E402

ARGS = None
ROLLOUT = "e2e-rollout"
# The virtual tool result the intercepted call gets.
REFUSAL = "Error: permission denied. Timers are not allowed in this sandbox."
# Logprobs of the same tokens sampled and scored, with exact (f32) KV.
LOGPROB_TOLERANCE = 2e-3

TOOLS = [
    {"type": "function", "function": {
        "name": "calculator", "description": "Evaluates an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                       "required": ["expression"]}}},
    {"type": "function", "function": {
        "name": "set_timer", "description": "Starts a timer.",
        "parameters": {"type": "object", "properties": {"minutes": {"type": "integer"},
                                                        "label": {"type": "string"}},
                       "required": ["minutes"]}}},
    {"type": "function", "function": {
        "name": "define_word", "description": "Looks a word up in the dictionary.",
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}},
                       "required": ["word"]}}},
]


class Sandbox:
    """The agent's tools, run for real in a scratch directory."""

    def __init__(self, root):
        self.root = root
        self.calls = []

    def run(self, name, arguments):
        self.calls.append((name, arguments))
        if name == "calculator":
            expression = str(arguments.get("expression", ""))
            allowed = set("0123456789+-*/(). ")
            if not expression or not set(expression) <= allowed:
                return json.dumps({"error": "not an arithmetic expression"})
            value = eval(expression, {"__builtins__": {}})  # only digits and operators
            with open(os.path.join(self.root, "calculator.log"), "a") as log:
                log.write(f"{expression} = {value}\n")
            return json.dumps({"result": value})
        if name == "set_timer":
            path = os.path.join(self.root, "timer-%s.json" % arguments.get("label", "timer"))
            with open(path, "w") as timer:
                json.dump(arguments, timer)
            return json.dumps({"status": "started", **arguments})
        if name == "define_word":
            return json.dumps({"word": arguments.get("word"), "definition": "unknown"})
        return json.dumps({"error": f"no tool {name}"})


class Agent:
    """One session: sends its history, runs the tool calls, repeats."""

    def __init__(self, url, session, sandbox, parent=None):
        self.url = url
        self.headers = {"X-Session-Id": session, "X-Rollout-Id": ROLLOUT}
        if parent:
            self.headers["X-Parent-Session-Id"] = parent
        self.sandbox = sandbox
        self.messages = []
        self.replies = []  # every chat completion response

    def complete(self):
        response = requests.post(self.url + "/v1/chat/completions", headers=self.headers, timeout=600,
                                 json={"messages": self.messages, "tools": TOOLS,
                                       "max_tokens": 96, "temperature": 0})
        if response.status_code != 200:
            raise AssertionError(f"chat turn failed: {response.status_code} {response.text}")
        body = response.json()
        self.replies.append(body)
        message = body["choices"][0]["message"]
        self.messages.append(message)
        return message

    def ask(self, text, max_steps=3):
        """A user turn, then tool rounds until the model answers without calls."""
        self.messages.append({"role": "user", "content": text})
        for _ in range(max_steps):
            message = self.complete()
            calls = message.get("tool_calls") or []
            if not calls:
                return message
            for call in calls:
                arguments = json.loads(call["function"]["arguments"])
                self.messages.append({"role": "tool", "tool_call_id": call["id"],
                                      "content": self.sandbox.run(call["function"]["name"],
                                                                  arguments)})
        return self.messages[-1]


def get(url, path, **params):
    response = requests.get(url + path, params=params, timeout=120)
    response.raise_for_status()
    return response


class GatewayAgentLoop(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        rules = os.path.join(cls.tmp.name, "rules.json")
        with open(rules, "w") as f:
            json.dump({"rules": [{"id": "e2e.no_timers", "category": "custom",
                                  "description": "timers are not allowed in this sandbox",
                                  "tools": ["set_timer"], "judge": False}]}, f)
        cls.scratch = os.path.join(cls.tmp.name, "scratch")
        os.makedirs(cls.scratch)
        cls.server = MegactxServer(ARGS.megactx, ARGS.model, "--kv-dtype", "f32",
                                   "--gateway-guard", "intercept", "--gateway-rules", rules,
                                   "--gateway-intercept-text", REFUSAL)
        cls.server.__enter__()
        url = cls.server.url
        cls.sandbox = Sandbox(cls.scratch)
        try:
            # The main agent: a tool round, then a follow-up user turn.
            cls.main = Agent(url, "main", cls.sandbox)
            cls.main.ask("Please calculate (12 + 34) * 5 using the calculator.")
            cls.main.ask("Thanks. What was the result?", max_steps=1)
            # A sub-agent whose timer call is intercepted.
            cls.sub = Agent(url, "timer-agent", cls.sandbox, parent="main")
            cls.sub.ask("Set a timer for 10 minutes for the tea.")
            # The main agent compacts its context: a summary replaces the history.
            summary = ("Summary of the work so far: the calculator gave (12 + 34) * 5 = 230, and "
                       "a sub-agent was asked for a tea timer.")
            cls.main.messages = [{"role": "system", "content": summary}]
            cls.main.ask("Please calculate (7 + 8) * 3 using the calculator.")
            cls.trajectories = {name: get(url, "/gateway/session", session_id=name,
                                          prompt_ids=1).json()
                                for name in ("main", "timer-agent")}
            export = get(url, "/gateway/samples", rollout_id=ROLLOUT, text=1)
            cls.export_type = export.headers.get("Content-Type", "")
            cls.samples = [json.loads(line) for line in export.text.splitlines() if line]
        except Exception:
            cls.server.__exit__(None, None, None)
            raise

    @classmethod
    def tearDownClass(cls):
        cls.server.__exit__(None, None, None)
        cls.tmp.cleanup()

    def url(self):
        return self.server.url

    def samples_of(self, session):
        return [s for s in self.samples if s["session_id"] == session]

    def test_turn_kinds_and_sub_traces(self):
        main = self.trajectories["main"]
        kinds = [turn["kind"] for turn in main["turns"]]
        self.assertEqual(kinds[0], "start")
        self.assertEqual(kinds[1], "append")      # the tool result after the call
        self.assertEqual(kinds[2], "realign")     # a new user turn re-renders the reasoning
        self.assertEqual(kinds[3], "compaction")  # the summary
        self.assertTrue(all(kind == "append" for kind in kinds[4:]), kinds)
        traces = [turn["trace"] for turn in main["turns"]]
        self.assertEqual(traces[:3], [0, 0, 0])
        self.assertTrue(all(trace == 1 for trace in traces[3:]), traces)
        self.assertEqual(len(self.samples_of("main")), 2)
        first, compacted = self.samples_of("main")
        self.assertEqual(first["metadata"]["trace_start"], "start")
        self.assertEqual(compacted["metadata"]["trace_start"], "compaction")
        # The main agent really ran its calculator calls.
        calls = [name for name, _ in self.sandbox.calls]
        self.assertEqual(calls.count("calculator"), 2, self.sandbox.calls)
        with open(os.path.join(self.scratch, "calculator.log")) as log:
            self.assertIn("(12 + 34) * 5 = 230", log.read())

    def test_compaction_starts_from_a_fresh_prompt(self):
        _, compacted = self.samples_of("main")
        turn = self.trajectories["main"]["turns"][3]
        messages = [{"role": "system", "content": self.main.messages[0]["content"]},
                    {"role": "user", "content": "Please calculate (7 + 8) * 3 using the calculator."}]
        tokenized = requests.post(self.url() + "/tokenize", timeout=60, json={
            "messages": messages, "tools": TOOLS, "add_generation_prompt": True}).json()
        prompt_length = compacted["metadata"]["prompt_length"]
        self.assertEqual(compacted["tokens"][:prompt_length], tokenized["tokens"])
        self.assertEqual(turn["generations"][0]["prompt_ids"], tokenized["tokens"])

    def test_append_reuses_the_generated_ids_and_the_prefix_cache(self):
        turns = self.trajectories["main"]["turns"]
        first, second = turns[0]["generations"][0], turns[1]["generations"][0]
        generated = first["prompt_ids"] + first["output_ids"]
        self.assertEqual(second["prompt_ids"][:len(generated)], generated)
        # The shared history came from the prefix cache (whole pages of it).
        self.assertGreater(second["cached_tokens"], 0)

    def test_sub_agent_is_its_own_sample_of_the_rollout(self):
        samples = self.samples_of("timer-agent")
        self.assertEqual(len(samples), 1)
        metadata = samples[0]["metadata"]
        self.assertEqual(metadata["parent_session_id"], "main")
        self.assertEqual(metadata["rollout_id"], ROLLOUT)
        self.assertTrue(self.export_type.startswith("application/x-ndjson"))
        self.assertEqual({s["metadata"]["rollout_id"] for s in self.samples}, {ROLLOUT})

    def test_intercepted_call_never_reached_the_agent(self):
        self.assertNotIn("set_timer", [name for name, _ in self.sandbox.calls])
        self.assertFalse([f for f in os.listdir(self.scratch) if f.startswith("timer-")])
        first = self.sub.replies[0]
        self.assertGreaterEqual(first["gateway"]["interceptions"], 1)
        self.assertFalse(first["choices"][0]["message"].get("tool_calls"), first)
        sample = self.samples_of("timer-agent")[0]
        interception = sample["metadata"]["interceptions"][0]
        self.assertEqual(interception["rules"], ["e2e.no_timers"])
        self.assertEqual(interception["tool_calls"][0]["function"]["name"], "set_timer")
        # The blocked call and the virtual result are in the trajectory, in order.
        response = sample["response"]
        self.assertIn("<tool_call>set_timer", response)
        self.assertLess(response.index("<tool_call>set_timer"), response.index(REFUSAL))
        prompt = sample["metadata"]["prompt_length"]
        mask = sample["loss_mask"]
        for position in range(interception["virtual_begin"], interception["virtual_end"]):
            self.assertEqual(mask[position - prompt], 0)
        for position in range(interception["begin"], interception["end"]):
            self.assertEqual(mask[position - prompt], 1)  # the model's own tokens
        event = self.trajectories["timer-agent"]["turns"][0]["guard"][0]
        self.assertEqual(event["action"], "intercepted")
        self.assertEqual(event["rules"], ["e2e.no_timers"])

    def test_loss_masks_follow_the_spans(self):
        for sample in self.samples:
            prompt = sample["metadata"]["prompt_length"]
            self.assertEqual(sample["response_length"], len(sample["tokens"]) - prompt)
            self.assertEqual(len(sample["loss_mask"]), sample["response_length"])
            self.assertEqual(len(sample["rollout_log_probs"]), sample["response_length"])
            expected = [0] * sample["response_length"]
            spans = sample["metadata"]["spans"]
            self.assertEqual(spans[0], {"kind": "prompt", "begin": 0, "end": prompt, "turn": spans[0]["turn"]})
            for previous, span in zip(spans, spans[1:]):
                self.assertEqual(previous["end"], span["begin"])  # contiguous
            self.assertEqual(spans[-1]["end"], len(sample["tokens"]))
            for span in spans:
                if span["kind"] == "model":
                    for position in range(span["begin"], span["end"]):
                        expected[position - prompt] = 1
            self.assertEqual(sample["loss_mask"], expected)
            for mask, logprob in zip(sample["loss_mask"], sample["rollout_log_probs"]):
                if not mask:
                    self.assertEqual(logprob, 0.0)
            self.assertIn(sample["status"], ("completed", "truncated"))
            self.assertTrue(sample["weight_versions"])

    def test_rescoring_reproduces_the_rollout_logprobs(self):
        checked, worst = 0, 0.0
        for sample in self.samples:
            tokens = sample["tokens"]
            scored = requests.post(self.url() + "/generate", timeout=600, json={
                "input_ids": tokens, "return_logprob": True, "logprob_start_len": 0,
                "top_logprobs_num": 1, "sampling_params": {"max_new_tokens": 0}})
            self.assertEqual(scored.status_code, 200, scored.text)
            meta = scored.json()["meta_info"]
            entries = meta["input_token_logprobs"]
            tops = meta["input_top_logprobs"]
            self.assertEqual([entry[1] for entry in entries], tokens)
            prompt = sample["metadata"]["prompt_length"]
            for offset, (mask, logprob) in enumerate(zip(sample["loss_mask"],
                                                         sample["rollout_log_probs"])):
                if not mask:
                    continue
                position = prompt + offset
                worst = max(worst, abs(entries[position][0] - logprob))
                self.assertAlmostEqual(entries[position][0], logprob, delta=LOGPROB_TOLERANCE,
                                       msg=f"{sample['session_id']} position {position}")
                # Greedy: the recorded token is the engine's top choice there.
                self.assertEqual(tops[position][0][1], tokens[position],
                                 f"{sample['session_id']} position {position}")
                checked += 1
        print(f"\nrescored {checked} model tokens of {len(self.samples)} samples: largest "
              f"|scored - rollout| logprob difference {worst:.3g}", file=sys.stderr)
        self.assertGreater(checked, 100)

    def test_replies_match_the_recorded_tokens(self):
        # What the agent read is what the recorded model tokens say.
        sample = self.samples_of("main")[0]
        for reply in self.main.replies[:3]:
            message = reply["choices"][0]["message"]
            if message.get("content"):
                self.assertIn(message["content"].strip(), sample["response"])
            for call in message.get("tool_calls") or []:
                self.assertIn("<tool_call>" + call["function"]["name"], sample["response"])

    def test_judge_answers_in_its_schema(self):
        response = requests.post(self.url() + "/gateway/screen", timeout=600, json={
            "tool": "bash", "arguments": {"command": "git log --all --oneline"}, "judge": True,
            "messages": [{"role": "user", "content": "Fix the failing test."}]})
        self.assertEqual(response.status_code, 200, response.text)
        body = response.json()
        self.assertTrue(body["flagged"])
        self.assertEqual(body["rules"][0]["rule"], "vcs_leakage.git_history")
        self.assertIn(body["verdict"], ("hack", "legitimate"))  # the grammar allows nothing else
        self.assertIsInstance(body["reason"], str)

    def test_metrics(self):
        text = get(self.url(), "/metrics").text
        values = {}
        for line in text.splitlines():
            if line.startswith("megactx_gateway_") and " " in line:
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        self.assertGreaterEqual(values["megactx_gateway_tool_calls_screened_total"], 3)
        self.assertGreaterEqual(values["megactx_gateway_tool_calls_flagged_total"], 1)
        self.assertGreaterEqual(values["megactx_gateway_tool_calls_intercepted_total"], 1)
        self.assertGreaterEqual(values['megactx_gateway_turns_total{kind="compaction"}'], 1)
        self.assertEqual(values["megactx_gateway_sessions"], 2)


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--megactx", required=True)
    parser.add_argument("--model", required=True)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0], *rest], verbosity=2)


if __name__ == "__main__":
    main()
