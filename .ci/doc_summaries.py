#!/usr/bin/env python3
"""Fails when a public doc comment in src/ does not open with a whole summary.

rustdoc shows a doc comment's first paragraph as the item's summary (in
module listings, search results and the item's tooltip), so that paragraph
must be a whole sentence with the details, `# Examples`, `# Errors` and the
other sections after it. For every `///` block on a public item and every
`//!` block, this checks that

- the summary is not empty (the block does not open with a heading, a code
  block or nothing at all);
- the summary ends a sentence (its last character, past closing brackets,
  quotes and emphasis, is `.`, `:`, `?` or `!`);
- no prose paragraph is cut by a section heading or a code block: the
  paragraph before one ends a sentence too, so an example inserted in the
  middle of a sentence is caught wherever it is.

It reports every failure as `file:line: message` (the line of the paragraph
that is cut) and exits with status 1 if there is any.

An item counts as public unless its declaration is restricted (`pub(crate)`,
`pub(super)`, `pub(in ...)`) or has no `pub` where one is needed: free items,
inherent methods and fields, outside traits, enums and trait impls. The
crate warns on `unreachable_pub` (an error under CI's clippy `-D warnings`),
so a bare `pub` is really public. `//!` blocks are all checked, private
modules' too: their first paragraph is a summary as well. `#[doc = "..."]`
attributes and `/** */` comments are not read (the crate uses neither).

Usage: .ci/doc_summaries.py [PATH ...]   (default: src)
"""

import os
import re
import sys

SENTENCE_END = ".:?!"
# What may follow the sentence's last mark: "(as X does.)", "*not*.", "`x`."
CLOSERS = ")]}\"'*_`"
HEADING = re.compile(r"^ {0,3}#{1,6}(\s|$)")
FENCE = re.compile(r"^ {0,3}(```|~~~)")
LIST_ITEM = re.compile(r"^ {0,3}([-*+]|\d+[.)])\s")
TABLE_ROW = re.compile(r"^ {0,3}\|")
DOC_LINE = re.compile(r"^\s*(///|//!)(?!/)(.*)$")
RESTRICTED = re.compile(r"^pub\s*\(")
ITEM_KEYWORDS = re.compile(
    r"^(?:(?:default|const|async|unsafe|extern(?:\s+\"[^\"]*\")?)\s+)*"
    r"(fn|struct|enum|union|const|static|type|mod|use|trait|impl|macro_rules!)\b"
)


def code_only(text):
    """`text` with comments, string and char literals blanked out.

    Keeps the line structure, so that braces can be counted line by line
    without being fooled by a `{` in a format string or a Lua script.
    """
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif (m := re.compile(r'b?r(#*)"').match(text, i)) and (
            i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")
        ):
            end = '"' + m.group(1)
            j = text.find(end, m.end())
            j = n if j < 0 else j + len(end)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "'" and (m := re.compile(r"'(\\.[^']*|[^\\'])'").match(text, i)):
            out.append(" " * (m.end() - i))
            i = m.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)


def scopes(code_lines):
    """For each line, the kind of block it sits in: `(kind, public)`.

    `kind` is "trait", "enum", "trait impl" or "other"; `public` says
    whether the block's item was declared with a bare `pub`.
    """
    stack, result, pending = [], [], ("other", False)
    for line in code_lines:
        result.append(stack[-1] if stack else ("other", True))
        stripped = line.strip()
        if stripped:
            public = bool(re.match(r"^pub\s", stripped))
            rest = re.sub(r"^pub(\s*\([^)]*\))?\s+", "", stripped)
            if re.match(r"^(unsafe\s+)?trait\b", rest):
                pending = ("trait", public)
            elif re.match(r"^enum\b", rest):
                pending = ("enum", public)
            elif re.match(r"^(unsafe\s+)?impl\b.*\bfor\b", rest):
                pending = ("trait impl", True)
            elif re.match(r"^(unsafe\s+)?impl\b", rest):
                pending = ("impl", True)
            elif ITEM_KEYWORDS.match(rest) or re.match(r"^[A-Za-z_]\w*!", rest):
                pending = ("other", public)
        for c in line:
            if c == "{":
                stack.append(pending)
                pending = ("other", False)
            elif c == "}" and stack:
                stack.pop()
    return result


def is_public_item(lines, code_lines, scope_of, after):
    """Whether the item that the `///` block ending before `after` documents
    is public, as far as the source line shows."""
    i, depth = after, 0
    while i < len(lines):
        code = code_lines[i].strip()
        if depth:
            depth += code.count("[") - code.count("]")
            i += 1
            continue
        if not code or DOC_LINE.match(lines[i]):
            i += 1
            continue
        if code.startswith("#["):
            depth = code.count("[") - code.count("]")
            i += 1
            continue
        break
    else:
        return False
    decl = code_lines[i].strip()
    if RESTRICTED.match(decl):
        return False
    if re.match(r"^pub\s", decl):
        return True
    kind, public = scope_of[i]
    if kind in ("trait", "enum"):
        return public
    if kind == "trait impl":
        return True
    # A free item, an inherent method or a field without `pub`, or a
    # macro's private item: not public.
    return False


def sentence_ends(paragraph):
    text = " ".join(line.strip() for line in paragraph).rstrip()
    return text.rstrip(CLOSERS)[-1:] in SENTENCE_END if text else False


def elements(lines):
    """Splits a doc comment into ("text", lines), ("heading", line) and
    ("code", line) elements, in order; blank lines end a text element."""
    out, paragraph, fence = [], [], None
    for n, text in lines:
        if fence is not None:
            if FENCE.match(text) and text.strip().startswith(fence):
                fence = None
            continue
        if FENCE.match(text) or HEADING.match(text) or not text.strip():
            if paragraph:
                out.append(("text", paragraph))
                paragraph = []
            if FENCE.match(text):
                fence = text.strip()[:3]
                out.append(("code", (n, text)))
            elif HEADING.match(text):
                out.append(("heading", (n, text)))
            continue
        paragraph.append((n, text))
    if paragraph:
        out.append(("text", paragraph))
    return out


def check_block(path, block, report):
    """`block` is a list of (line number, text after the doc marker)."""
    lines = [(n, t[1:] if t.startswith(" ") else t) for n, t in block]
    parts = elements(lines)
    if not parts:
        report(path, block[0][0], "empty doc comment: no summary")
        return
    kind, value = parts[0]
    if kind != "text":
        n, text = value
        what = "a heading" if kind == "heading" else "a code block"
        report(
            path,
            n,
            f"the summary is empty: the doc comment opens with {what} "
            f"({text.strip()!r}); put a whole sentence first",
        )
        return
    for index, (kind, value) in enumerate(parts):
        if kind != "text":
            continue
        texts = [t for _, t in value]
        start, last = value[0][0], texts[-1].strip()[-40:]
        prose = not (LIST_ITEM.match(texts[0]) or TABLE_ROW.match(texts[0]))
        following = parts[index + 1] if index + 1 < len(parts) else None
        if index == 0 and not prose:
            report(path, start, "the summary is a list or a table, not a sentence")
        elif not prose or sentence_ends(texts):
            continue
        elif following and following[0] == "heading":
            heading = following[1][1].strip()
            which = "the summary" if index == 0 else "a paragraph"
            report(path, start, f"{heading!r} cuts {which} before it ends a sentence: ...{last!r}")
        elif following and following[0] == "code":
            which = "the summary" if index == 0 else "a paragraph"
            report(path, start, f"a code block cuts {which} before it ends a sentence: ...{last!r}")
        elif index == 0:
            report(path, start, f"the summary does not end a sentence: ...{last!r}")


def check_file(path, report):
    with open(path, encoding="utf-8") as f:
        source = f.read()
    lines = source.split("\n")
    code_lines = code_only(source).split("\n")
    scope_of = scopes(code_lines)
    i = 0
    while i < len(lines):
        m = DOC_LINE.match(lines[i])
        if not m:
            i += 1
            continue
        marker, block = m.group(1), []
        while i < len(lines) and (m := DOC_LINE.match(lines[i])) and m.group(1) == marker:
            block.append((i + 1, m.group(2)))
            i += 1
        if marker == "//!" or is_public_item(lines, code_lines, scope_of, i):
            check_block(path, block, report)


def main(argv):
    roots = argv[1:] or ["src"]
    failures = []

    def report(path, line, message):
        failures.append(f"{path}:{line}: {message}")

    for root in roots:
        paths = [root] if os.path.isfile(root) else sorted(
            os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.endswith(".rs")
        )
        for path in paths:
            check_file(path, report)
    for failure in failures:
        print(failure)
    sys.stdout.flush()
    if failures:
        print(f"{len(failures)} doc comment(s) without a whole summary first", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
