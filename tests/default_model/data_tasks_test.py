"""The JSON-answer and unneeded-tools training tasks (tools/data/synth.py json_answer, tool_not_needed) and make_r3.py's filter of
held-out names, on made-up sources: every answer is one JSON object that Python's json module
parses, rendered through the shipped chat template it ends the assistant turn, no prompt hands
the model an object to echo (the structured-output e2e test's "Return {...} as JSON." must stay
out of the data), and packages and words the validation set names never reach the task. Also the
manuals' prose extraction (sources.rst_paragraphs, pod_paragraphs; make_r3.group) on made-up
pages: prose kept and unwrapped, markup reduced to its text, headings, directives, code and
verbatim blocks left out; the kernel documentation's pages (sources._rst_pages, make_r3.kernel_documents)
on a made-up tree. < 1 s."""
import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools", "data"))

import make_r3  # noqa: E402
import sources  # noqa: E402
import synth  # noqa: E402
from render import ChatRenderer  # noqa: E402

WORDNET = [
    ("khanate", "noun", "the position of a khan", ["the khanate of Kazan"], ["khanat"]),
    ("parlay", "noun", "a series of wagers", [], ["parley"]),
    ("brown rat", "noun", "common domestic rat", [], ["Norway rat", "Rattus norvegicus"]),
    ("quote", "verb", "repeat a passage from", [], []),
    ("say \"hi\"", "verb", "greet with a \\ backslash", [], ["greet"]),
]
PACKAGES = [
    ("git", "fast, scalable, distributed revision control system", ["Git is popular."]),
    ("lbzip2", "parallel bzip2 utility", ["lbzip2 is an independent implementation."]),
    ("fcitx5-keyman", "Fcitx5 wrapper for Keyman", ["A wrapper."]),
]


def check_answers():
    rng = random.Random(5)
    renderer = ChatRenderer.from_file(os.path.join(ROOT, "models", "default", "chat_template.jinja"))
    kinds = set()
    for i in range(600):
        request = synth.json_answer(rng, WORDNET, PACKAGES)
        user, assistant = request["messages"]
        assert user["role"] == "user" and assistant["role"] == "assistant", request
        value = json.loads(assistant["content"])
        assert isinstance(value, dict) and value, assistant["content"]
        assert "\n" not in assistant["content"], assistant["content"]
        assert "{" not in user["content"], "a prompt hands the model an object: " + user["content"]
        kinds.add(tuple(sorted(value)))
        text = renderer.render(request["messages"], **request.get("kwargs", {}))
        assert text.endswith(assistant["content"]), (text[-200:], assistant["content"])
    # word, package, arithmetic, synonyms and record answers all occur.
    assert {("meaning", "part_of_speech", "word"), ("name", "summary"), ("expression", "result"),
            ("synonyms", "word"), ("age", "city", "name")} <= kinds, kinds
    print("json_answer: 600 answers parse as JSON objects and end their rendered turns")


def check_held_out_filter():
    val = [{"kind": "packages", "text": "git: fast revision control\n\nGit is popular."},
           {"kind": "dictionary", "text": "parlay (noun): a series of wagers.\nbrown rat (noun): a rat."},
           {"kind": "chat", "text": "<|user|>\nWhat does 'Khanate' mean?<|assistant|>"}]
    tokens, words = make_r3.held_out_names(val)
    assert "git" in tokens and "lbzip2" not in tokens, tokens
    assert {"parlay", "brown rat", "khanate"} <= words and "quote" not in words, words
    print("held_out_names: validation packages and words found")


FORTUNES = ["A clean desk is a sign of a full drawer.", "Today is the tomorrow you worried about."]


def check_tool_not_needed():
    """Chats with tools offered that no question needs: one to three of the unneeded tools, no call
    in any assistant turn, and no call markup past the template's tool instructions."""
    rng = random.Random(9)
    renderer = ChatRenderer.from_file(os.path.join(ROOT, "models", "default", "chat_template.jinja"))
    offered = set()
    for _ in range(300):
        request = synth.tool_not_needed(rng, WORDNET, FORTUNES, PACKAGES)
        names = [t["function"]["name"] for t in request["tools"]]
        assert 1 <= len(names) <= 3 and set(names) <= set(synth.UNNEEDED_TOOLS), names
        offered.update(names)
        assistants = [m for m in request["messages"] if m["role"] == "assistant"]
        assert assistants and all(not m.get("tool_calls") and m["content"] for m in assistants), request
        text = renderer.render(request["messages"], tools=request["tools"], **request.get("kwargs", {}))
        conversation = text[text.index("<|user|>"):]
        assert "<tools>" in text and "<tool_call>" not in conversation, conversation[:300]
    assert offered == set(synth.UNNEEDED_TOOLS), offered
    print("tool_not_needed: 300 chats with tools offered, answered in text")


RST = """:mod:`json` --- JSON encoder and decoder
========================================

.. module:: json
   :synopsis: Encode and decode the JSON format.

The :mod:`json` module exposes an API familiar to users of the standard library
:mod:`marshal` module, see `the RFC <https://json.org>`_ and ``dumps`` for **details**.

Encoding basic objects::

    >>> import json
    >>> json.dumps(['foo', {'bar': ('baz', None)}])

Back at the margin, this paragraph follows the literal block and reads as ordinary prose here.

.. function:: dumps(obj)

   Serialize *obj* to a string in JSON format using this conversion table, returning the result.

=====  ======
JSON   Python
=====  ======
"""

POD = """=head1 NAME

perlintro - a brief introduction

=head1 DESCRIPTION

You are I<strongly> advised to read L<the manual|perltoc> and use the C<perldoc> command, since
C<< $x->method >> calls are explained in L<perlobj/"Methods"> as well.

    my $x = 1;   # verbatim code
    print $x;

=begin html

<p>This HTML block is for another formatter and is not prose for us at all.</p>

=end html

=item * an item line

Comparisons with E<lt> and E<gt> are written as words in this paragraph of the manual page.
"""


def check_manuals():
    rst = sources.rst_paragraphs(RST)
    assert rst == [
        "The json module exposes an API familiar to users of the standard library marshal module, see the "
        "RFC and dumps for details.",
        "Back at the margin, this paragraph follows the literal block and reads as ordinary prose here.",
        "Serialize obj to a string in JSON format using this conversion table, returning the result.",
    ], rst
    pod = sources.pod_paragraphs(POD)
    assert pod == [
        "You are strongly advised to read the manual and use the perldoc command, since $x->method calls are "
        "explained in perlobj as well.",
        "Comparisons with < and > are written as words in this paragraph of the manual page.",
    ], pod
    assert not sources.prose("x = foo(bar); y = {1: 2}; print(x[0], y) # code, not prose.")
    assert make_r3.group(["a" * 10, "b" * 10, "c" * 30, "d" * 5], 25) == ["a" * 10 + "\n\n" + "b" * 10, "c" * 30,
                                                                        "d" * 5]
    print("manuals: rst and pod prose extracted, markup and code left out")


def check_kernel_docs():
    """The kernel documentation's pages: Sphinx sources of the newest tree, its translations left
    out; make_r3.kernel_documents takes whole pages in a seeded order up to its cap."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        for version in ("6.0", "6.1"):
            root = os.path.join(tmp, "linux-doc-" + version, "html", "_sources")
            for name in ("PCI/pci.rst.txt", "translations/it_IT/intro.rst.txt", "admin.rst.txt"):
                os.makedirs(os.path.dirname(os.path.join(root, name)), exist_ok=True)
                with open(os.path.join(root, name), "w", encoding="utf-8") as f:
                    f.write(RST if version == "6.1" else "Old tree: this paragraph must never be read here.\n")
        pages = sources._rst_pages(os.path.join(tmp, "linux-doc-*", "html", "_sources"), "linux:",
                                   skip=("translations",))
    assert [name for name, _ in pages] == ["linux:PCI/pci.rst.txt", "linux:admin.rst.txt"], pages
    assert all(paragraphs == sources.rst_paragraphs(RST) for _, paragraphs in pages)
    made_up = [("p{}".format(i), ["x" * 40 + str(i), "y" * 50]) for i in range(10)]
    docs = make_r3.kernel_documents(made_up, 250, 100, random.Random(3))
    assert all(d["kind"] == "manuals" for d in docs)
    total = sum(len(d["text"]) for d in docs)
    # Whole pages until the cap is reached: 3 pages of 93 characters pass 250.
    assert len(docs) == 3 and 250 <= total < 250 + 93, (len(docs), total)
    again = make_r3.kernel_documents(made_up, 250, 100, random.Random(3))
    assert again == docs
    assert make_r3.kernel_documents(made_up, 0, 100, random.Random(3)) == []
    print("kernel documentation: newest tree, translations left out, whole pages up to the cap")


if __name__ == "__main__":
    check_kernel_docs()
    check_manuals()
    check_answers()
    check_held_out_filter()
    check_tool_not_needed()
