"""English text from Debian packages on this machine.

- Debian package descriptions: apt's Translation-en index (enable it once with
  `apt-get update -o Acquire::Languages=en`); read with apt-helper so no lz4 module is needed.
- WordNet 3.0 glosses and example sentences (package wordnet-base).
- fortune cookies (packages fortunes, fortunes-min).
- manuals: the prose of Python's documentation (its reStructuredText sources, package
  python3.11-doc) and of Perl's (its POD pages, package perl-doc), markup and code left out.
Each loader returns plain Python lists; nothing here knows about chat formats."""
import glob
import os
import re
import subprocess

# The kinds of plain-text documents (no chat turns): the curriculum's "text" share
# (tools/train/pipeline.py hands them to tools/train/curriculum.py apart from the chat documents)
# and what make_r3.py's --text-frac subsamples.
PLAIN_KINDS = frozenset({"packages", "dictionary", "fortunes", "manuals"})

FORTUNE_DIR = "/usr/share/games/fortunes"
PYTHON_DOC_GLOB = "/usr/share/doc/python3*/html/_sources"
PERL_POD_GLOB = "/usr/share/perl/5*/pod"
KERNEL_DOC_GLOB = "/usr/share/doc/linux-doc-*/html/_sources"
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


def prose(paragraph, min_chars=60):
    """Whether a paragraph (one line) reads as English prose: long enough, mostly letters and
    spaces, a sentence end, and no code-like characters to speak of."""
    if len(paragraph) < min_chars or not re.search(r"[.?!:](\s|$)", paragraph):
        return False
    letters = sum(c.isalpha() or c == " " for c in paragraph)
    code = sum(paragraph.count(c) for c in "{}[]<>=$@;\\|_")
    return letters >= 0.85 * len(paragraph) and code <= max(2, len(paragraph) // 40)


_RST_ROLE = re.compile(r":[\w:.-]+:`([^`<]*?)(?:\s*<[^`>]*>)?`")
_RST_LINK = re.compile(r"`([^`<]*?)\s*<[^`>]*>`__?")
_RST_REF = re.compile(r"`([^`]+)`_")
_RST_LITERAL = re.compile(r"``([^`]+)``")
_RST_EMPH = re.compile(r"\*\*?([^*\s][^*]*?)\*\*?")
_RST_FOOTNOTE = re.compile(r"\s*\[#?[\w-]*\]_")


def rst_paragraphs(text):
    """The prose paragraphs of a reStructuredText page, one line each: headings, directives and
    their options, literal blocks (after "::") and tables left out; roles, links and emphasis
    reduced to their text. Indented prose (a directive's body) is kept."""
    out, literal = [], False
    for block in re.split(r"\n\s*\n", text):
        lines = [line for line in block.split("\n") if line.strip()]
        if not lines:
            continue
        follows_literal, literal = literal, lines[-1].rstrip().endswith("::")
        first = lines[0].strip()
        if follows_literal and lines[0][:1].isspace():
            literal = True  # a literal block goes on until text at the margin
            continue
        if first.startswith(("..", ">>>", "+", "|", "=", "-", "*", "#", ":")) or first[:1].isdigit():
            continue
        if len(lines) > 1 and re.fullmatch(r"([=~^\"'`#*+-])\1{2,}", lines[1].strip()):
            continue  # a heading
        paragraph = " ".join(line.strip() for line in lines)
        paragraph = paragraph[:-1] if paragraph.endswith("::") else paragraph
        for pattern in (_RST_ROLE, _RST_LINK, _RST_REF, _RST_LITERAL, _RST_EMPH):
            paragraph = pattern.sub(r"\1", paragraph)
        paragraph = re.sub(r"\s+", " ", _RST_FOOTNOTE.sub("", paragraph)).strip()
        if prose(paragraph):
            out.append(paragraph)
    return out


_POD_CODE = re.compile(r"[A-Z](?:<<+\s(.*?)\s>>+|<([^<>]*)>)")
_POD_ESCAPES = {"lt": "<", "gt": ">", "verbar": "|", "sol": "/"}


def _pod_code(match):
    inner = match.group(1) if match.group(1) is not None else match.group(2)
    kind = match.group(0)[0]
    if kind == "E":
        return _POD_ESCAPES.get(inner, "")
    if kind in "XZ":
        return ""
    if kind == "L":  # L<text|target>, L<name/"section">, L<name>
        inner = inner.split("|", 1)[0] if "|" in inner else inner.split("/", 1)[0] or inner
        return inner.strip('"')
    return inner


def pod_paragraphs(text):
    """The prose paragraphs of a POD page, one line each: commands (=head1, =item, ...) and
    verbatim (indented) blocks left out, formatting codes (C<...>, L<...|...>, E<lt>) reduced to
    their text."""
    out, skipping = [], False
    for block in re.split(r"\n\s*\n", text):
        if not block.strip():
            continue
        if block.startswith("=begin"):
            skipping = True
        if skipping:
            skipping = not block.rstrip().split("\n")[-1].startswith("=end")
            continue
        if block.startswith("=") or block[:1].isspace():
            continue
        paragraph = " ".join(line.strip() for line in block.split("\n"))
        for _ in range(4):  # codes nest: B<C<...>>
            paragraph = _POD_CODE.sub(_pod_code, paragraph)
        paragraph = re.sub(r"\s+", " ", paragraph).strip()
        if prose(paragraph):
            out.append(paragraph)
    return out


def _rst_pages(root_glob, prefix, skip=()):
    """[(prefix + page path, [prose paragraphs])] of the newest tree root_glob names: its Sphinx
    sources (*.rst.txt), pages under a `skip` folder left out, in a fixed order."""
    pages = []
    for root in sorted(glob.glob(root_glob))[-1:]:
        for path in sorted(glob.glob(os.path.join(root, "**", "*.rst.txt"), recursive=True)):
            name = os.path.relpath(path, root)
            if name.split(os.sep, 1)[0] in skip:
                continue
            with open(path, encoding="utf-8", errors="replace") as f:
                pages.append((prefix + name, rst_paragraphs(f.read())))
    return pages


def load_manuals():
    """Returns [(page name, [prose paragraphs])] from Python's and Perl's documentation on this
    machine (pages without prose left out), in a fixed order."""
    pages = _rst_pages(PYTHON_DOC_GLOB, "python:")
    for root in sorted(glob.glob(PERL_POD_GLOB))[-1:]:
        for path in sorted(glob.glob(os.path.join(root, "*.pod"))):
            with open(path, encoding="utf-8", errors="replace") as f:
                pages.append(("perl:" + os.path.basename(path), pod_paragraphs(f.read())))
    pages = [(name, paragraphs) for name, paragraphs in pages if paragraphs]
    if not pages:
        raise SystemExit("no manuals: apt-get install python3.11-doc perl-doc")
    return pages


def load_kernel_docs():
    """Returns [(page name, [prose paragraphs])] from the Linux kernel's documentation on this
    machine (linux-doc: the reStructuredText sources beside its HTML; ~10M characters of prose in
    6.1), its translations left out (other languages), pages without prose left out, in a fixed
    order."""
    pages = [(name, paragraphs) for name, paragraphs in _rst_pages(KERNEL_DOC_GLOB, "linux:", skip=("translations",))
             if paragraphs]
    if not pages:
        raise SystemExit("no kernel documentation: apt-get install linux-doc")
    return pages
