"""English text from Debian packages on this machine.

- Debian package descriptions: apt's Translation-en index (enable it once with
  `apt-get update -o Acquire::Languages=en`); read with apt-helper so no lz4 module is needed.
- WordNet 3.0 glosses and example sentences (package wordnet-base).
- fortune cookies (packages fortunes, fortunes-min).
Each loader returns plain Python lists; nothing here knows about chat formats."""
import glob
import os
import re
import subprocess

FORTUNE_DIR = "/usr/share/games/fortunes"
WORDNET_DIR = "/usr/share/wordnet"
APT_LISTS = "/var/lib/apt/lists"


def load_package_descriptions():
    """Returns [(package, short description, [paragraphs of the long description])], deduplicated by text."""
    paths = sorted(glob.glob(os.path.join(APT_LISTS, "*_i18n_Translation-en*")))
    if not paths:
        raise SystemExit("no Translation-en index: run `apt-get update -o Acquire::Languages=en` first")
    seen = set()
    out = []
    for path in paths:
        text = subprocess.run(["/usr/lib/apt/apt-helper", "cat-file", path], check=True, capture_output=True).stdout
        for block in text.decode("utf-8", "replace").split("\n\n"):
            package, short, body = None, None, []
            in_desc = False
            for line in block.split("\n"):
                if line.startswith("Package: "):
                    package = line[9:].strip()
                elif line.startswith("Description-en: "):
                    short = line[16:].strip()
                    in_desc = True
                elif in_desc and line.startswith(" "):
                    body.append(line[1:])
                else:
                    in_desc = False
            if not package or not short:
                continue
            paragraphs = []
            current = []
            for line in body:
                if line.strip() == ".":
                    if current:
                        paragraphs.append(current)
                    current = []
                else:
                    current.append(line)
            if current:
                paragraphs.append(current)
            # Keep prose paragraphs; list items ("  * foo") are kept as lines.
            cleaned = []
            for para in paragraphs:
                if all(not l.startswith(" ") for l in para):
                    cleaned.append(" ".join(l.strip() for l in para))
                else:
                    cleaned.append("\n".join(l.rstrip() for l in para))
            key = short + "\n" + "\n".join(cleaned)
            if key in seen:
                continue
            seen.add(key)
            out.append((package, short, cleaned))
    return out


def load_fortunes():
    """Returns a list of fortune texts (one quote or joke each), from the non-offensive sets."""
    out = []
    for path in sorted(glob.glob(os.path.join(FORTUNE_DIR, "*"))):
        if "." in os.path.basename(path) or os.path.isdir(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            for item in f.read().split("\n%\n"):
                item = item.strip("\n%")
                if 20 <= len(item) <= 1200 and "\t" not in item:
                    out.append(item)
    return out


_GLOSS_SPLIT = re.compile(r';\s*(?=")')


def load_wordnet():
    """Returns [(word, part of speech, definition, [examples], [synonyms])]."""
    pos_names = {"noun": "noun", "verb": "verb", "adj": "adjective", "adv": "adverb"}
    out = []
    for suffix, pos in pos_names.items():
        with open(os.path.join(WORDNET_DIR, "data." + suffix), encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("  ") or "|" not in line:
                    continue
                head, gloss = line.split("|", 1)
                fields = head.split()
                count = int(fields[3], 16)
                words = [fields[4 + 2 * i].replace("_", " ") for i in range(count)]
                words = [re.sub(r"\(.*\)$", "", w) for w in words]
                parts = _GLOSS_SPLIT.split(gloss.strip())
                definition = parts[0].strip().rstrip(";").strip()
                examples = [p.strip().strip(";").strip().strip('"') for p in parts[1:]]
                examples = [e for e in examples if e]
                if definition:
                    out.append((words[0], pos, definition, examples, words[1:]))
    return out
