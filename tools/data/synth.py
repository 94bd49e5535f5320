"""Synthetic chat tasks that show what megactx is for: retrieval in long contexts, copying,
arithmetic with reasoning, multi-turn chat, tool calls with tool responses, answers as JSON objects.

Every generator returns a chat request dict {"messages", "tools"?, "kwargs"?} that the
caller renders through the model's chat template. Randomness comes only from the passed
random.Random, so a seed reproduces the data set."""
import json
import random

SYSTEM_PROMPTS = [
    "You are a helpful assistant.",
    "You are the default model of megactx, a small assistant. Answer briefly.",
    "You are a careful assistant. Read the whole context before answering.",
    "Answer the user's questions accurately and concisely.",
]

IDENTITY = (
    "I am the default model that ships with megactx: a small GLM-architecture model with "
    "sparse attention and multi-token prediction, trained by the project as a demonstration."
)

NAMES = [
    "Alice", "Bruno", "Chen", "Dara", "Emil", "Fatima", "Goran", "Hana", "Ivan", "Jun", "Kofi", "Lena",
    "Mateo", "Nadia", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tariq", "Uma", "Viktor", "Wei", "Ximena",
    "Yusuf", "Zoe",
]
CITIES = [
    "Paris", "Berlin", "Tokyo", "Lagos", "Lima", "Oslo", "Cairo", "Sydney", "Toronto", "Mumbai", "Madrid",
    "Seoul", "Nairobi", "Dublin", "Prague", "Hanoi", "Quito", "Vienna", "Lisbon", "Denver",
]
CONDITIONS = ["sunny", "cloudy", "rainy", "snowy", "windy", "foggy", "clear", "stormy"]


def _key(rng: random.Random) -> str:
    digits = rng.choice([4, 5, 5, 6, 7])
    return str(rng.randint(10 ** (digits - 1), 10**digits - 1))


def _filler(rng: random.Random, paragraphs, chars: int):
    out, total = [], 0
    while total < chars:
        p = paragraphs[rng.randrange(len(paragraphs))]
        out.append(p)
        total += len(p) + 1
    return out


# ---------------------------------------------------------------- long context


def passkey(rng, paragraphs, chars: int, key=None):
    key = key or _key(rng)
    needle = rng.choice([
        "The pass key is {k}. Remember it. {k} is the pass key.",
        "Important: the pass key is {k}. Keep it in mind, the pass key is {k}.",
        "The pass key is {k}.",
    ]).format(k=key)
    body = _filler(rng, paragraphs, chars)
    body.insert(rng.randint(0, len(body)), needle)
    intro = rng.choice([
        "There is a pass key hidden inside a lot of irrelevant text. Find it and remember it.",
        "Read the following text. Somewhere in it is a pass key.",
        "",
    ])
    question = rng.choice([
        "What is the pass key?",
        "What is the pass key mentioned in the text above?",
        "Which pass key was hidden in the text?",
    ])
    user = (intro + "\n\n" if intro else "") + "\n".join(body) + "\n\n" + question
    answer = "The pass key is {}.".format(key)
    return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}],
            "kwargs": _thinking_kwargs(rng, 0.5)}, key


def multikey(rng, paragraphs, chars: int):
    count = rng.randint(2, 6)
    names = rng.sample(NAMES, count)
    keys = [_key(rng) for _ in names]
    body = _filler(rng, paragraphs, chars)
    for name, key in zip(names, keys):
        body.insert(rng.randint(0, len(body)), "The secret number of {} is {}.".format(name, key))
    pick = rng.randrange(count)
    question = rng.choice(["What is the secret number of {}?", "Which secret number belongs to {}?"]).format(names[pick])
    user = "\n".join(body) + "\n\n" + question
    answer = "The secret number of {} is {}.".format(names[pick], keys[pick])
    return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}],
            "kwargs": _thinking_kwargs(rng, 0.5)}


# ---------------------------------------------------------------- short tasks


def _thinking_kwargs(rng, p_off):
    return {"enable_thinking": False} if rng.random() < p_off else {}


def copy_task(rng, sentences):
    text = " ".join(rng.choice(sentences) for _ in range(rng.randint(1, 3)))[:600]
    ask = rng.choice(["Repeat the following text exactly:\n", "Copy this text word for word:\n", "Say this back to me:\n"])
    return {"messages": [{"role": "user", "content": ask + text}, {"role": "assistant", "content": text}],
            "kwargs": _thinking_kwargs(rng, 0.5)}


def _add_steps(a: int, b: int):
    steps, carry, digits = [], 0, []
    xa, xb = str(a)[::-1], str(b)[::-1]
    for i in range(max(len(xa), len(xb))):
        da = int(xa[i]) if i < len(xa) else 0
        db = int(xb[i]) if i < len(xb) else 0
        s = da + db + carry
        steps.append("{} + {}{} = {}, write {}{}".format(
            da, db, " + {}".format(carry) if carry else "", s, s % 10, ", carry 1" if s >= 10 else ""))
        carry = s // 10
        digits.append(str(s % 10))
    if carry:
        steps.append("write the final carry 1")
        digits.append("1")
    return steps


def arithmetic(rng):
    op = rng.choice(["+", "+", "-", "*"])
    if op == "+":
        a, b = rng.randint(0, 9999), rng.randint(0, 9999)
        result = a + b
        thought = "Add digit by digit from the right: " + "; ".join(_add_steps(a, b)) + ". So {} + {} = {}.".format(a, b, result)
    elif op == "-":
        a, b = rng.randint(0, 9999), rng.randint(0, 9999)
        a, b = max(a, b), min(a, b)
        result = a - b
        thought = "{} - {}: check by adding back, {} + {} = {}. So the difference is {}.".format(a, b, result, b, a, result)
    else:
        a, b = rng.randint(2, 99), rng.randint(2, 9)
        result = a * b
        tens, ones = a // 10 * 10, a % 10
        thought = "{} * {} = {} * {} + {} * {} = {} + {} = {}.".format(a, b, tens, b, ones, b, tens * b, ones * b, result)
    shown = {"+": "+", "-": "-", "*": "times"}[op]
    question = rng.choice(["What is {} {} {}?", "Compute {} {} {}.", "{} {} {} = ?"]).format(a, shown, b)
    answer = rng.choice(["{} {} {} = {}.", "The answer is {r}."]).format(a, shown, b, result, r=result)
    think = rng.random() < 0.6
    assistant = {"role": "assistant", "content": answer}
    if think:
        assistant["reasoning_content"] = thought
    return {"messages": [{"role": "user", "content": question}, assistant], "kwargs": {} if think else _thinking_kwargs(rng, 0.5)}


def letters(rng, words):
    word = rng.choice(words)
    while " " in word or not word.isalpha():
        word = rng.choice(words)
    kind = rng.randrange(3)
    if kind == 0:
        q = "How many letters are in the word '{}'?".format(word)
        thought = "Spell it: {}. That is {} letters.".format("-".join(word), len(word))
        a = "The word '{}' has {} letters.".format(word, len(word))
    elif kind == 1:
        q = "Spell '{}' backwards.".format(word)
        thought = "Letters: {}. Reversed: {}.".format("-".join(word), "-".join(word[::-1]))
        a = "'{}' backwards is '{}'.".format(word, word[::-1])
    else:
        x, y = rng.randint(0, 999), rng.randint(0, 999)
        q = "Which is larger, {} or {}?".format(x, y)
        thought = "Compare {} and {}: {}.".format(x, y, "they are equal" if x == y else "{} is larger".format(max(x, y)))
        a = "They are equal." if x == y else "{} is larger.".format(max(x, y))
    return {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a, "reasoning_content": thought}]}


def chat(rng, wordnet, fortunes, packages):
    messages = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    for _ in range(rng.randint(1, 4)):
        kind = rng.randrange(5)
        if kind == 0:
            word, pos, definition, examples, synonyms = rng.choice(wordnet)
            q = rng.choice(["What does '{}' mean?", "Define the {} '{}'.".format(pos, "{}"), "What is the meaning of '{}'?"]).format(word)
            a = "'{}' ({}) means {}.".format(word, pos, definition)
            if examples:
                a += " For example: \"{}\".".format(examples[0])
            messages += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
            if synonyms and rng.random() < 0.5:
                messages += [{"role": "user", "content": "Is there another word for it?"},
                             {"role": "assistant", "content": "Yes: '{}'.".format("', '".join(synonyms[:3]))}]
        elif kind == 1:
            q = rng.choice(["Tell me a fortune.", "Say something witty.", "Give me a quote.", "Cheer me up."])
            messages += [{"role": "user", "content": q}, {"role": "assistant", "content": rng.choice(fortunes)}]
        elif kind == 2:
            name, short, paragraphs = rng.choice(packages)
            q = rng.choice(["What is the Debian package {}?", "What does {} do?", "Tell me about {}."]).format(name)
            a = "{} is a package: {}.".format(name, short[0].lower() + short[1:] if short else short)
            if paragraphs:
                a += " " + paragraphs[-1]
            messages += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        elif kind == 3:
            q = rng.choice(["Who are you?", "What model are you?", "Introduce yourself."])
            messages += [{"role": "user", "content": q}, {"role": "assistant", "content": IDENTITY}]
        else:
            q = rng.choice(["Hello!", "Hi there.", "Good morning!", "Thanks, that helps."])
            a = rng.choice(["Hello! How can I help you today?", "Hi! What would you like to know?", "You're welcome. Anything else?"])
            messages += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    return {"messages": messages, "kwargs": _thinking_kwargs(rng, 0.3)}


# ---------------------------------------------------------------- tools


def _fn(name, description, properties, required):
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required}}}


TOOLS = {
    "get_weather": _fn("get_weather", "Current weather of a city.",
                       {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, ["city"]),
    "calculator": _fn("calculator", "Evaluates an arithmetic expression.", {"expression": {"type": "string"}}, ["expression"]),
    "define_word": _fn("define_word", "Looks a word up in the dictionary.", {"word": {"type": "string"}}, ["word"]),
    "package_info": _fn("package_info", "Describes a Debian package.", {"name": {"type": "string"}}, ["name"]),
    "set_timer": _fn("set_timer", "Starts a timer.", {"minutes": {"type": "integer"}, "label": {"type": "string"}}, ["minutes"]),
}


def _call(name, arguments):
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def tool_use(rng, wordnet, packages):
    tool_names = rng.sample(sorted(TOOLS), rng.randint(2, 5))
    kind = rng.choice(tool_names)
    messages = []
    if rng.random() < 0.3:
        messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    calls, results = [], []
    if kind == "get_weather":
        cities = rng.sample(CITIES, rng.choice([1, 1, 2]))
        unit = rng.choice(["celsius", "fahrenheit"])
        q = "What is the weather in {}?".format(" and ".join(cities))
        for city in cities:
            args = {"city": city} if rng.random() < 0.5 else {"city": city, "unit": unit}
            calls.append(_call("get_weather", args))
            results.append({"city": city, "temperature": rng.randint(-10, 35), "condition": rng.choice(CONDITIONS)})
        final = " ".join("In {} it is {} degrees and {}.".format(r["city"], r["temperature"], r["condition"]) for r in results)
    elif kind == "calculator":
        a, b, c = rng.randint(10, 999), rng.randint(10, 999), rng.randint(2, 20)
        expression = "({} + {}) * {}".format(a, b, c)
        q = "Please calculate {} using the calculator.".format(expression)
        calls.append(_call("calculator", {"expression": expression}))
        results.append({"result": (a + b) * c})
        final = "{} = {}.".format(expression, (a + b) * c)
    elif kind == "define_word":
        word, pos, definition, _, _ = rng.choice(wordnet)
        q = "Look up the word '{}' for me.".format(word)
        calls.append(_call("define_word", {"word": word}))
        results.append({"word": word, "part_of_speech": pos, "definition": definition})
        final = "'{}' is a {} meaning {}.".format(word, pos, definition)
    elif kind == "package_info":
        name, short, _ = rng.choice(packages)
        q = "Which Debian package is {}? Use the tool.".format(name)
        calls.append(_call("package_info", {"name": name}))
        results.append({"name": name, "summary": short})
        final = "{}: {}.".format(name, short)
    else:
        minutes = rng.randint(1, 90)
        label = rng.choice(["tea", "pasta", "meeting", "break", "laundry"])
        q = "Set a timer for {} minutes for the {}.".format(minutes, label)
        calls.append(_call("set_timer", {"minutes": minutes, "label": label}))
        results.append({"status": "started", "minutes": minutes, "label": label})
        final = "Done: a {}-minute timer for the {} is running.".format(minutes, label)
    messages.append({"role": "user", "content": q})
    call_turn = {"role": "assistant", "content": "", "tool_calls": calls}
    think = rng.random() < 0.5
    if think:
        call_turn["reasoning_content"] = "The user asks for something the {} tool provides, so I call it.".format(kind)
    messages.append(call_turn)
    for r in results:
        messages.append({"role": "tool", "content": json.dumps(r)})
    final_turn = {"role": "assistant", "content": final}
    if think:
        final_turn["reasoning_content"] = "The tool answered; I report the result."
    messages.append(final_turn)
    tools = [TOOLS[n] for n in tool_names]
    return {"messages": messages, "tools": tools}


# Tools that no question of synth.chat needs (it asks for definitions, fortunes, packages, the
# model's identity and small talk; define_word and package_info would fit some of those).
UNNEEDED_TOOLS = ("get_weather", "calculator", "set_timer")


def tool_not_needed(rng, wordnet, fortunes, packages):
    """A synth.chat conversation with one to three tools offered that none of its questions needs: the
    answers stay text. Every tool conversation of the data before (tool_use) called a tool, and the
    models trained on it (runs 3-7) call an offered tool for most prompts, "Hello!" included."""
    request = chat(rng, wordnet, fortunes, packages)
    names = rng.sample(UNNEEDED_TOOLS, rng.randint(1, len(UNNEEDED_TOOLS)))
    return {"messages": request["messages"], "tools": [TOOLS[n] for n in names], "kwargs": request["kwargs"]}


def tool_prompt_only(rng, wordnet, packages):
    """A tool conversation cut before the call: what a client sends when the model must call a tool."""
    request = tool_use(rng, wordnet, packages)
    cut = next(i for i, m in enumerate(request["messages"]) if m.get("tool_calls"))
    return request, request["messages"][cut]


# ---------------------------------------------------------------- JSON answers


def _json_text(value):
    return json.dumps(value, ensure_ascii=False)


def json_answer(rng, wordnet, packages):
    """A question whose answer is one short JSON object on a line of its own: what a client using
    response_format json_object expects, and what teaches the model to close its strings, braces
    and brackets. The phrasings never give the object to echo back (the structured-output e2e test
    asks "Return {...} as JSON." and checks that the unconstrained answer is prose)."""
    kind = rng.randrange(5)
    if kind == 0:
        word, pos, definition, _, _ = rng.choice(wordnet)
        q = rng.choice([
            "Give the word '{w}' and its meaning as a JSON object.",
            "Describe the {p} '{w}' in JSON with the keys \"word\", \"part_of_speech\" and \"meaning\".",
            "As a JSON object: what does '{w}' mean?",
            "Answer in JSON: the definition of '{w}'.",
        ]).format(w=word, p=pos)
        a = {"word": word, "part_of_speech": pos, "meaning": definition}
    elif kind == 1:
        name, short, _ = rng.choice(packages)
        q = rng.choice([
            "Return the Debian package {n} as a JSON object with its name and summary.",
            "Describe {n} in JSON (keys: name, summary).",
            "What is {n}? Answer with a JSON object.",
        ]).format(n=name)
        a = {"name": name, "summary": short}
    elif kind == 2:
        x, y = rng.randint(2, 999), rng.randint(2, 999)
        op, sign, value = rng.choice([("plus", "+", x + y), ("minus", "-", x - y), ("times", "*", x * y)])
        q = rng.choice([
            "What is {x} {op} {y}? Answer in JSON.",
            "Compute {x} {sign} {y} and give the result as a JSON object.",
            "As JSON, with the keys \"expression\" and \"result\": {x} {sign} {y}.",
        ]).format(x=x, y=y, op=op, sign=sign)
        a = {"expression": "{} {} {}".format(x, sign, y), "result": value}
    elif kind == 3:
        word, _, _, _, synonyms = rng.choice(wordnet)
        for _ in range(20):  # most entries have synonyms: draw again until one does
            if synonyms:
                break
            word, _, _, _, synonyms = rng.choice(wordnet)
        synonyms = synonyms or [word]
        q = rng.choice([
            "List synonyms of '{w}' as a JSON object.",
            "Give '{w}' and a few words with the same meaning, in JSON.",
        ]).format(w=word)
        a = {"word": word, "synonyms": list(synonyms[:rng.randint(1, 4)])}
    else:
        name, city = rng.choice(NAMES), rng.choice(CITIES)
        age = rng.randint(18, 90)
        q = rng.choice([
            "Make a JSON record for {n}, who is {a} and lives in {c}.",
            "{n} is {a} years old and lives in {c}. Write that as a JSON object.",
            "Put this in JSON: name {n}, age {a}, city {c}.",
        ]).format(n=name, a=age, c=city)
        a = {"name": name, "age": age, "city": city}
        if rng.random() < 0.3:
            a["active"] = rng.random() < 0.5
    return {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": _json_text(a)}],
            "kwargs": _thinking_kwargs(rng, 0.7)}
