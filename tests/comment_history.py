"""History in comments and docstrings: what belongs in a commit body, not beside the code.

A comment says why the code is as it is; when it was found, on which machine, in which CI stop
or issue, and what it measured there is history: the commit that made the change keeps it. This
scans testbed/**/*.py, benchmarks/*.py and the Makefile (comments through tokenize, docstrings
through ast) for the marks of history below, and counts testbed/'s trailing comments (code, then a
comment on the same line) per 1,000 lines. `python -m tests.comment_history` prints both;
tests/test_comment_history.py asserts that testbed/ and the Makefile have none."""
from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# A figure with a unit: what a measurement reads.
_FIGURE = (r"\d[\d,]*(?:\.\d+)?(?:\s?[-–]\s?\d[\d,]*(?:\.\d+)?)?\s?"
           r"(?:ns|µs|us|ms|s|sec|min|h|%|x|[KMG]i?B|[KMG]B/s|[kKMG]bit/s|[kKMG]bit|Mbps|Gbps)(?![\w/])")
# One character of the same sentence: not a full stop that ends one, nor a semicolon.
_SAME = r"(?:(?!\.\s)[^;])"
_MONTH = (r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|"
          r"Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)")

# (kind, pattern): each names one mark of history. A date followed by a time of day is a value
# (a trace's clock origin), not when something happened.
RULES: list[tuple[str, re.Pattern[str]]] = [
    ("issue", re.compile(r"\bissues?\s+#?\d+\b", re.I)),
    ("date", re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b(?!\s+[0-2]\d:\d\d)")),
    ("date", re.compile(rf"\b(?:[0-3]?\d\s+)?{_MONTH}\.?\s+(?:[0-3]?\d,?\s+)?20\d\d\b")),
    ("this machine", re.compile(rf"\bthis machine\b{_SAME}*?{_FIGURE}|{_FIGURE}{_SAME}*?\bthis machine\b", re.I)),
    ("here", re.compile(rf"{_FIGURE}[^.;:]{{0,40}}\b(?:measured|seen|tried) here\b|"
                        rf"{_FIGURE}\s+here\b|\b(?:measured|seen|tried) here\b[^.;]{{0,20}}{_FIGURE}", re.I)),
    ("CI", re.compile(rf"\bin CI\b{_SAME}*?{_FIGURE}|{_FIGURE}{_SAME}*?\bin CI\b|\bonce in CI\b|\bCI host once\b")),
    ("stop", re.compile(r"\bstop \d+\b")),
    ("session", re.compile(r"\b(?:this|that|last|previous|earlier|one|an? (?:earlier|later)) session\b|"
                           r"\bsessions? \d+\b", re.I)),
    ("took", re.compile(rf"\btook (?:about |~|some )?{_FIGURE}")),
    ("then and now", re.compile(r"\bused to be\b|\bas before\b|\(before, |"
                                r"\b[Mm]easured (?:here|while)\b|\b[Mm]easured on an? [A-Z]")),
    ("measured", re.compile(rf"\bmeasured\b:?\s+(?:at |as |to be )?~?{_FIGURE}|{_FIGURE},? measured\b")),
]

# `#N` names one of this project's issues; `name#N` or `Name #N` (moby#48783, Mininet #650) an
# upstream report, which is a reason (the bug the code works around), not history.
_HASH_REF = re.compile(r"(?<![\w&#])#(\d+)\b")
_NAME_BEFORE = re.compile(r"([A-Za-z][\w.-]*)\s*$")
_OUR_WORDS = {"issue", "issues", "pr", "see", "in", "and", "or", "from", "by", "of", "per", "at", "since"}


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    kind: str
    text: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: [{self.kind}] {self.text}"


def _hash_refs(text: str) -> bool:
    for m in _HASH_REF.finditer(text):
        before = _NAME_BEFORE.search(text[: m.start()])
        if before is None or before.group(1).lower() in _OUR_WORDS or not before.group(1)[0].isupper():
            return True
    return False


def kinds(text: str) -> list[str]:
    """The marks of history in one comment or docstring (empty: none)."""
    found = [kind for kind, rule in RULES if rule.search(text)]
    if _hash_refs(text):
        found.append("issue")
    return sorted(set(found), key=found.index)


def _comments(source: str) -> list[tuple[int, str, bool]]:
    """(line, text, trailing) of each comment; runs of whole-line comments joined into one block."""
    out: list[tuple[int, str, bool]] = []
    last_line = -2
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.COMMENT:
            continue
        row = tok.start[0]
        trailing = tok.line[: tok.start[1]].strip() != ""
        text = tok.string.lstrip("#").strip()
        if not trailing and out and not out[-1][2] and row == last_line + 1:
            out[-1] = (out[-1][0], out[-1][1] + " " + text, False)
        else:
            out.append((row, text, trailing))
        last_line = row
    return out


def _docstrings(source: str, path: str) -> list[tuple[int, str]]:
    tree = ast.parse(source, path)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                out.append((body[0].lineno, " ".join(body[0].value.value.split())))
    return out


def python_findings(path: Path, root: Path) -> list[Finding]:
    source = path.read_text()
    rel = str(path.relative_to(root))
    texts = [(line, text) for line, text, _ in _comments(source)] + _docstrings(source, rel)
    return [Finding(rel, line, ", ".join(k), text) for line, text in sorted(texts) if (k := kinds(text))]


def _makefile_findings(path: Path, root: Path) -> list[Finding]:
    rel = str(path.relative_to(root))
    blocks: list[tuple[int, str]] = []
    last = -2
    for number, line in enumerate(path.read_text().splitlines(), 1):
        stripped = line.strip()
        if not stripped.startswith("#"):
            continue
        text = stripped.lstrip("#").strip()
        if blocks and number == last + 1:
            blocks[-1] = (blocks[-1][0], blocks[-1][1] + " " + text)
        else:
            blocks.append((number, text))
        last = number
    return [Finding(rel, line, ", ".join(k), text) for line, text in blocks if (k := kinds(text))]


def package_files(root: Path = REPO) -> list[Path]:
    return sorted((root / "testbed").rglob("*.py"))


def findings(root: Path = REPO, benchmarks: bool = True) -> list[Finding]:
    """Every comment block and docstring in testbed/ (and benchmarks/*.py), and every Makefile
    comment block, that carries history."""
    files = package_files(root) + (sorted((root / "benchmarks").glob("*.py")) if benchmarks else [])
    out = [f for p in files for f in python_findings(p, root)]
    makefile = root / "Makefile"
    if makefile.exists():
        out += _makefile_findings(makefile, root)
    return out


def trailing_density(root: Path = REPO) -> tuple[int, int, float]:
    """(trailing comments, lines, trailing comments per 1,000 lines) over testbed/**/*.py; a
    `# noqa` or `# type:` pragma is not a comment to a reader and does not count."""
    trailing = lines = 0
    for path in package_files(root):
        source = path.read_text()
        lines += len(source.splitlines())
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT and tok.line[: tok.start[1]].strip() \
                    and not re.match(r"#\s*(?:noqa|type:|pragma)", tok.string):
                trailing += 1
    return trailing, lines, 1000 * trailing / max(lines, 1)


def main() -> int:
    found = findings()
    for f in found:
        print(f)
    trailing, lines, density = trailing_density()
    print(f"{len(found)} finding(s); testbed/: {trailing} trailing comments in {lines} lines "
          f"({density:.1f} per 1,000)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
