#!/usr/bin/env python3
"""Checks the module layering of each crate (docs/architecture.md, "Module layering").

Every module of a crate has a layer (the table below); a module may import only
modules of lower layers, never one of its own layer or above, so no import cycle can
form. A directory module (`session/`) counts as one module. Imports are read from
`crate::...` paths outside comments and `#[cfg(test)]` blocks. A module missing from
the table fails the check, so a new module gets a place on purpose.

usage: scripts/check-layering.py [ROOT]   (exit 1 on a violation)"""
import os
import re
import sys

LAYERS = {
    "shared": [
        ["metric_catalog", "dependencies"],
        ["ids", "error", "tls", "telemetry", "scripts", "process", "process_metrics"],
        ["redis", "db", "auth", "mysql_server", "migration_rules", "clock", "sql_script"],
        ["device_epochs"],
        ["identity"],
        ["keys", "config", "service_token"],
        ["otel", "runtime", "names"],
        ["protocol", "device_state"],
        ["ops"],
        [""],
    ],
    "clients/rust": [
        ["tls"],
        ["http", "ws"],
        ["device"],
        [""],
    ],
    "gateway": [
        ["tls", "mailbox", "budget", "watchers", "meters"],
        ["error", "limits", "listener", "client_ip", "waiters", "epoch", "sessions", "acks", "status", "starts"],
        ["ingress_writer", "send_span", "announcer"],
        ["history", "ingress", "devices", "recovery", "watermarks", "delivered", "typing", "roster", "identity"],
        ["session", "liveness", "notices"],
        ["state"],
        ["api"],
        [""],
    ],
    "loadtest": [
        ["integrity", "recorder", "sampler", "slope", "chart", "pacer"],
        ["cli", "load"],
        ["engine", "cpu"],
        ["senders", "soak_report"],
        ["report"],
        ["scenarios", "probe", "sends"],
        [""],
    ],
    "worker": [
        ["lease", "batch", "projections", "janitor", "notices", "commit_slots"],
        ["seq_floor"],
        ["commit", "fanout", "reads", "delivered", "push"],
        ["outbox", "committer", "timeline", "spans"],
        ["context", "server_check"],
        ["group"],
        ["ingress", "trace"],
        ["admin"],
        [""],
    ],
}


def strip(text):
    """Drops comments, strings and test modules, which name modules without importing them."""
    text = re.sub(r"#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*mod\s+\w+\s*(?:;|\{.*)", "", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r'r#".*?"#', '""', text, flags=re.S)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    return text


def unit(path, src):
    rel = os.path.relpath(path, src)[:-3].replace(os.sep, "::")
    top = rel.split("::")[0]
    return "" if top in ("lib", "main") else top


def main(root):
    bad = []
    for crate, layers in LAYERS.items():
        src = os.path.join(root, crate, "src")
        layer_of = {m: i for i, names in enumerate(layers) for m in names}
        units = set()
        edges = set()
        for dp, _, files in os.walk(src):
            for f in files:
                if not f.endswith(".rs"):
                    continue
                path = os.path.join(dp, f)
                if f.endswith(("_proptests.rs", "_tests.rs")) or f == "tests.rs":
                    continue
                u = unit(path, src)
                units.add(u)
                text = strip(open(path, encoding="utf-8").read())
                names = set(re.findall(r"\bcrate::(\w+)", text))
                for group in re.findall(r"\bcrate::\{([^}]*)\}", text):
                    names.update(re.findall(r"\b(\w+)", group))
                for n in names:
                    edges.add((u, n))
        for u in sorted(units):
            if u not in layer_of:
                bad.append(f"{crate}: module `{u or 'lib'}` has no layer in scripts/check-layering.py")
        for u, n in sorted(edges):
            if n not in units or n == u:
                continue  # an item of lib.rs or of the module itself
            if u in layer_of and n in layer_of and layer_of[n] >= layer_of[u]:
                bad.append(f"{crate}: `{u or 'lib'}` (layer {layer_of[u]}) imports `{n}` (layer {layer_of[n]})")
    for b in bad:
        print(b)
    print(f"layering: {len(bad)} violation(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
