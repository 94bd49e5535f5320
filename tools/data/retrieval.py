"""Dense retrieval tasks for run 3: many supervised answers per document, so a short training run
sees far more "look the fact up and copy it" targets than one passkey answer per 8K tokens.

- passkey(): the evaluation's task (synth.passkey), needle at a uniformly random depth.
- multikey_turns(): several facts ("The secret number of X is N.", "The code of locker 17 is N.",
  ...) hidden in filler, then 2-6 question/answer turns, each answer supervised.
- kv_list(): a short list "key: value" lines (no filler) and 1-4 lookups: induction-head training in
  a few hundred tokens.

Every generator returns a chat request {"messages", "kwargs"} rendered by the caller through the
model's chat template; randomness comes only from the passed random.Random."""
import math
import random

import synth

FACT_KINDS = [
    # (fact sentence, question, answer); {s} subject, {k} number
    ("The secret number of {s} is {k}.", "What is the secret number of {s}?", "The secret number of {s} is {k}."),
    ("{s}'s secret number is {k}.", "Which secret number belongs to {s}?", "The secret number of {s} is {k}."),
    ("The code of locker {s} is {k}.", "What is the code of locker {s}?", "The code of locker {s} is {k}."),
    ("Remember: room {s} has the access number {k}.", "What is the access number of room {s}?",
     "The access number of room {s} is {k}."),
]
EXTRA_NAMES = ["Amara", "Bjorn", "Carmen", "Dmitri", "Elif", "Felix", "Greta", "Hiro", "Ines", "Jonas", "Kira",
               "Luca", "Maya", "Nils", "Olga", "Pablo", "Rina", "Sami", "Tomas", "Vera", "Wanda", "Yara"]
PEOPLE = synth.NAMES + EXTRA_NAMES


def log_uniform_chars(rng: random.Random, lo: int, hi: int) -> int:
    hi = max(hi, lo + 1)
    return int(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def passkey(rng, paragraphs, chars):
    request, _ = synth.passkey(rng, paragraphs, chars)
    return request


def _subjects(rng, kind_index, count):
    if kind_index < 2:
        return rng.sample(PEOPLE, count)
    return [str(x) for x in rng.sample(range(1, 1000), count)]


def multikey_turns(rng, paragraphs, chars):
    """Facts spread at random depths of `chars` characters of filler, then several lookups.
    Messages: user(filler + question 1), assistant(answer 1), user(question 2), ..."""
    kind_index = rng.randrange(len(FACT_KINDS))
    fact, question, answer = FACT_KINDS[kind_index]
    count = max(2, min(16, chars // 700 + rng.randint(1, 4)))
    subjects = _subjects(rng, kind_index, count)
    keys = [synth._key(rng) for _ in subjects]
    body = synth._filler(rng, paragraphs, chars)
    for s, k in zip(subjects, keys):
        body.insert(rng.randint(0, len(body)), fact.format(s=s, k=k))
    asked = rng.sample(range(count), min(count, rng.randint(2, 6)))
    messages = []
    for turn, i in enumerate(asked):
        q = question.format(s=subjects[i])
        if turn == 0:
            intro = rng.choice(["", "Read the text below carefully; I will ask about the numbers in it.\n\n"])
            q = intro + "\n".join(body) + "\n\n" + q
        messages.append({"role": "user", "content": q})
        messages.append({"role": "assistant", "content": answer.format(s=subjects[i], k=keys[i])})
    return {"messages": messages, "kwargs": {"enable_thinking": False} if rng.random() < 0.5 else {}}


def _word(rng, words):
    return rng.choice(words) if words else "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(5))


def kv_list(rng, words):
    """A list of 8-60 "key: value" lines and 1-4 lookups (short: induction in a few hundred tokens)."""
    count = rng.randint(8, 60)
    if words:
        count = min(count, len(words))  # keys are distinct (callers pass distinct words)
    keys = []
    seen = set()
    while len(keys) < count:
        w = _word(rng, words)
        if w not in seen:
            seen.add(w)
            keys.append(w)
    values = [synth._key(rng) for _ in keys]
    lines = "\n".join("{}: {}".format(k, v) for k, v in zip(keys, values))
    messages = []
    for turn, i in enumerate(rng.sample(range(count), rng.randint(1, 4))):
        q = "What is the value of {}?".format(keys[i])
        if turn == 0:
            q = rng.choice(["Here is a list of keys and values.\n", "Look at this table.\n", ""]) + lines + "\n\n" + q
        messages.append({"role": "user", "content": q})
        messages.append({"role": "assistant", "content": "The value of {} is {}.".format(keys[i], values[i])})
    return {"messages": messages, "kwargs": {"enable_thinking": False} if rng.random() < 0.5 else {}}
