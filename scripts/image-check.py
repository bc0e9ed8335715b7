#!/usr/bin/env python3
"""Checks the Dockerfile without a Docker engine (none runs on this project's machines):

- every base image is pinned by tag and digest (`name:tag@sha256:<64 hex>`), directly or
  through the default of a global ARG, and build and runtime use the same Debian release;
- the runtime user is numeric and the one the chart runs as (values.yaml
  `podSecurityContext.runAsUser`/`runAsGroup`), and is created with those ids;
- the OCI labels are set; no `RUST_LOG` is baked in (it would override the chart's
  `log.level`);
- every one-binary target copies a binary the workspace builds.

usage: scripts/image-check.py [DOCKERFILE VALUES.yaml]   (exit 1 on a problem). Needs PyYAML.
"""
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
PINNED = re.compile(r"^[a-z0-9./-]+:[A-Za-z0-9._-]+@sha256:[0-9a-f]{64}$")
LABELS = ["title", "description", "licenses", "version", "revision", "created"]


def instructions(text):
    """(instruction, arguments) pairs, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", text)
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            yield word.upper(), rest.strip()


def check(dockerfile, values):
    problems = []
    steps = list(instructions(dockerfile.read_text()))
    global_args, stages, current = {}, {}, None
    for word, rest in steps:
        if word == "ARG" and current is None:
            name, _, default = rest.partition("=")
            global_args[name] = default
        elif word == "FROM":
            image, _, name = rest.partition(" AS ")
            image = re.sub(r"^\$\{(\w+)\}$", lambda m: global_args.get(m.group(1), m.group(0)), image.strip())
            current = name.strip() or image
            stages[current] = {"from": image, "steps": []}
            if image not in stages and not PINNED.match(image):
                problems.append(f"stage {current}: base image {image} is not pinned by tag and digest")
        elif current:
            stages[current]["steps"].append((word, rest))
    bases = [s["from"] for s in stages.values() if s["from"] not in stages]
    releases = {m.group(1) for b in bases for m in [re.search(r":[^@]*?(bookworm|trixie|bullseye)", b)] if m}
    if len(releases) != 1:
        problems.append(f"build and runtime bases on different or unknown Debian releases: {bases}")

    pod = yaml.safe_load(values.read_text())["podSecurityContext"]
    uid, gid = pod["runAsUser"], pod["runAsGroup"]
    runtime = stages.get("runtime", {"steps": []})["steps"]
    users = [rest for word, rest in runtime if word == "USER"]
    if users != [f"{uid}:{gid}"]:
        problems.append(f"runtime USER is {users}, the chart runs as {uid}:{gid}")
    script = " ".join(rest for word, rest in runtime if word == "RUN")
    if f"--uid {uid}" not in script or f"--gid {gid}" not in script:
        problems.append(f"the runtime stage does not create user {uid} and group {gid}")
    labels = " ".join(rest for word, rest in runtime if word == "LABEL")
    for label in LABELS:
        if f"org.opencontainers.image.{label}=" not in labels:
            problems.append(f"label org.opencontainers.image.{label} missing")
    if any(word == "ENV" and "RUST_LOG" in rest for _, stage in stages.items() for word, rest in stage["steps"]):
        problems.append("RUST_LOG is set in the image; it would override the chart's log.level")

    bins = {p.parent.parent.name: p for p in ROOT.glob("*/src/main.rs")}
    for target in ("gateway", "worker", "loadtest"):
        copies = [rest for word, rest in stages.get(target, {"steps": []})["steps"] if word == "COPY"]
        if target not in bins or not any(f"herald-{target}" in c for c in copies):
            problems.append(f"target {target} does not copy the herald-{target} binary")
    return problems, len(stages)


def main():
    dockerfile = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "Dockerfile"
    values = Path(sys.argv[2]) if len(sys.argv) > 2 else ROOT / "helm/herald/values.yaml"
    problems, stages = check(dockerfile, values)
    if problems:
        sys.exit("\n".join(f"{dockerfile.name}: {p}" for p in problems))
    print(f"{stages} Dockerfile stages checked")


if __name__ == "__main__":
    main()
