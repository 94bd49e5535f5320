#!/usr/bin/env python3
"""The evaluation tools' own logic (tools/eval), without a server: the passkey prompt builder
reaches the asked length from a filler pool shorter than it (and places the one key sentence at
the asked depth), and in multi-key mode places one asked fact at the depth among distinct others, and the behaviour judge counts a tool call only for a tool the prompt declares
and an answer as ended only when it stopped."""
import os
import random
import sys
import unittest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "tools", "eval"))

import behaviour_serve_eval  # noqa: E402
import passkey_serve_eval  # noqa: E402


class Filler(unittest.TestCase):
    def test_a_dpkg_status_file_gives_its_descriptions(self):
        import tempfile

        status = ("Package: a\nStatus: install ok installed\nDescription: first short line of a package\n"
                  " Its long description, wrapped over\n two lines of the stanza.\n .\n A second paragraph.\n"
                  "Version: 1\n\nPackage: b\nDescription: b's summary line, long enough to be kept here\n")
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "status")
            with open(path, "w") as f:
                f.write(status)
            self.assertEqual(passkey_serve_eval.file_paragraphs(path), passkey_serve_eval.dpkg_paragraphs(path))
            self.assertEqual(passkey_serve_eval.file_paragraphs(path), [
                "first short line of a package Its long description, wrapped over two lines of the stanza. "
                "A second paragraph.", "b's summary line, long enough to be kept here"])
            with open(path, "w") as f:
                f.write("One paragraph\nover two lines.\n\nAnother.\n")
            self.assertEqual(passkey_serve_eval.file_paragraphs(path), ["One paragraph\nover two lines.", "Another."])


class PasskeyPrompt(unittest.TestCase):
    def build(self, pool_paragraphs, length, depth):
        paragraphs = ["paragraph {} ".format(i) * 20 for i in range(pool_paragraphs)]
        counts = [90 + i % 21 for i in range(pool_paragraphs)]  # tokens of each paragraph
        prompt, actual, others = passkey_serve_eval.build_prompt(paragraphs, counts, length, depth, 12345,
                                                                 random.Random(3))
        self.assertEqual(others, [])
        body = prompt[:-len(passkey_serve_eval.QUESTION)].split("\n")
        keyed = [i for i, part in enumerate(body) if part == "The pass key is 12345."]
        self.assertEqual(len(keyed), 1)
        tokens = sum(counts[paragraphs.index(part)] for part in body if part in paragraphs)
        return tokens, actual

    def test_a_pool_longer_than_the_prompt(self):
        tokens, actual = self.build(400, 8000, 0.5)  # ~40K tokens of filler
        self.assertGreater(tokens, 0.98 * 8000)
        self.assertLessEqual(tokens, 8000)
        self.assertAlmostEqual(actual, 0.5, delta=0.03)

    def test_a_pool_shorter_than_the_prompt_is_walked_again(self):
        # 40 paragraphs are ~4K tokens: a 20K prompt repeats them about five times.
        tokens, actual = self.build(40, 20000, 0.9)
        self.assertGreater(tokens, 0.98 * 20000)
        self.assertLessEqual(tokens, 20000)
        self.assertAlmostEqual(actual, 0.9, delta=0.03)

    def test_multi_key(self):
        paragraphs = ["paragraph {} ".format(i) * 20 for i in range(400)]
        counts = [90 + i % 21 for i in range(400)]
        prompt, actual, others = passkey_serve_eval.build_prompt(paragraphs, counts, 8000, 0.3, 12345,
                                                                 random.Random(5), others=4)
        body, question = prompt.rsplit("\n\n", 1)
        facts = [part for part in body.split("\n") if part.startswith("The secret number of ")]
        self.assertEqual(len(facts), 5)
        self.assertEqual(len(set(others)), 4)
        self.assertNotIn(12345, others)
        asked = [f for f in facts if f.endswith(" is 12345.")]
        self.assertEqual(len(asked), 1)
        name = asked[0][len("The secret number of "):-len(" is 12345.")]
        self.assertEqual(question, "What is the secret number of {}?".format(name))
        for fact in facts:
            if fact not in asked:
                self.assertNotIn(" {} ".format(name), fact)  # the other facts are about others
        self.assertEqual(sorted(int(f.rsplit(" ", 1)[1][:-1]) for f in facts if f not in asked), sorted(others))
        # The asked fact sits after the filler that ends at the asked depth.
        parts = body.split("\n")
        before = sum(counts[paragraphs.index(p)] for p in parts[:parts.index(asked[0])] if p in paragraphs)
        total = sum(counts[paragraphs.index(p)] for p in parts if p in paragraphs)
        self.assertAlmostEqual(before / total, 0.3, delta=0.03)
        self.assertAlmostEqual(actual, 0.3, delta=0.03)


TOOLS_PROMPT = ('<tools>\n{"type": "function", "function": {"name": "get_weather", "parameters": {}}}\n'
                '{"type": "function", "function": {"name": "set_timer", "parameters": {}}}\n</tools>'
                '<|user|>\nWhat is the weather in Oslo?<|assistant|>')


class BehaviourJudge(unittest.TestCase):
    def test_tool_calls(self):
        row = {"kind": "tools", "prompt": TOOLS_PROMPT}
        called = behaviour_serve_eval.judge(
            row, "\n<think></think>\n<tool_call>get_weather\n<arg_key>city</arg_key>", "stop")
        self.assertTrue(called["tool_call"])
        self.assertTrue(called["stopped"])
        invented = behaviour_serve_eval.judge(row, "<tool_call>calculator\n", "stop")
        self.assertFalse(invented["tool_call"])
        prose = behaviour_serve_eval.judge(row, "It is sunny in Oslo.", "length")
        self.assertFalse(prose["tool_call"])
        self.assertFalse(prose["stopped"])

    def test_summary_and_other_kinds(self):
        rows = [behaviour_serve_eval.judge({"kind": "chat", "prompt": "x"}, "Hi!", "stop"),
                behaviour_serve_eval.judge({"kind": "chat", "prompt": "x"}, "Hi hi hi", "length"),
                behaviour_serve_eval.judge({"kind": "tools", "prompt": TOOLS_PROMPT},
                                           "<tool_call>set_timer\n", "stop")]
        self.assertNotIn("tool_call", rows[0])
        kinds = behaviour_serve_eval.summarise(rows)
        self.assertEqual(kinds["chat"], {"prompts": 2, "stopped": 1})
        self.assertEqual(kinds["tools"], {"prompts": 1, "stopped": 1, "tool_calls": 1})


if __name__ == "__main__":
    unittest.main()
