#!/usr/bin/env python3
"""Writes the values table of helm/herald/README.md from the `# --` comments of
helm/herald/values.yaml (the helm-docs convention), between the README's
`<!-- values:start -->` and `<!-- values:end -->` lines.

    scripts/chart-readme.py            rewrite the table
    scripts/chart-readme.py --check    exit 1 (with a diff) when the README is stale
    scripts/chart-readme.py --paths    print the documented value paths, one a line

A `# --` comment (continued by the `#` lines after it) documents the key below it; a
documented map is one row, its children need no comment. A leaf without a comment, and
not inside a documented map, is an error: every value is documented. Needs PyYAML.
"""
import difflib
import json
import re
import sys
from pathlib import Path

import yaml

CHART = Path(__file__).resolve().parent.parent / "helm" / "herald"
START, END = "<!-- values:start -->", "<!-- values:end -->"
KEY = re.compile(r"^(\s*)([A-Za-z0-9_]+):(\s.*)?$")


def documented(values_text):
    """(path, description) of every documented key, in file order; errors for the rest."""
    values = yaml.safe_load(values_text)
    rows, errors, stack, doc = [], [], [], None
    for number, line in enumerate(values_text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("# --"):
            doc = [stripped[4:].strip()]
            continue
        if stripped.startswith("#") and doc is not None:
            doc.append(stripped[1:].strip())
            continue
        match = KEY.match(line)
        if not match:
            if stripped and not stripped.startswith("#"):
                doc = None
            continue
        indent = len(match.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = [k for _, k, _ in stack] + [match.group(2)]
        inside_documented = any(d for _, _, d in stack)
        node = values
        for k in path:
            node = node[k]
        is_container = isinstance(node, dict) and node and doc is None
        if doc is not None:
            rows.append((".".join(path), " ".join(doc), node))
        elif not inside_documented and not is_container:
            errors.append(f"values.yaml:{number}: `{'.'.join(path)}` has no `# --` comment")
        stack.append((indent, match.group(2), doc is not None or inside_documented))
        doc = None
    return rows, errors


def default_text(value):
    if value == "" or value is None:
        return '`""`' if value == "" else "`null`"
    text = json.dumps(value, separators=(", ", ": ")) if isinstance(value, (dict, list)) else str(value).lower() if isinstance(value, bool) else str(value)
    return "`" + text.replace("|", "\\|") + "`"


def table(rows):
    out = ["| key | default | description |", "|---|---|---|"]
    for path, doc, value in rows:
        out.append(f"| `{path}` | {default_text(value)} | {doc.replace('|', chr(92) + '|')} |")
    return "\n".join(out)


def main():
    rows, errors = documented((CHART / "values.yaml").read_text())
    if errors:
        print("\n".join(errors), file=sys.stderr)
        return 1
    if "--paths" in sys.argv:
        print("\n".join(path for path, _, _ in rows))
        return 0
    readme_path = CHART / "README.md"
    readme = readme_path.read_text()
    if START not in readme or END not in readme:
        print(f"README.md lacks {START} ... {END}", file=sys.stderr)
        return 1
    head, rest = readme.split(START, 1)
    _, tail = rest.split(END, 1)
    new = f"{head}{START}\n{table(rows)}\n{END}{tail}"
    if "--check" in sys.argv:
        if new != readme:
            sys.stdout.writelines(difflib.unified_diff(readme.splitlines(True), new.splitlines(True), "README.md", "generated"))
            print("helm/herald/README.md is stale: run scripts/chart-readme.py", file=sys.stderr)
            return 1
        return 0
    readme_path.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
