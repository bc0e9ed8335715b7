#!/usr/bin/env python3
"""The chart checks of scripts/chart-test.sh that are easier in Python. Needs PyYAML.

    chart-checks.py restricted RENDERED.yaml...   Pod Security "restricted" fields, and
                                                  the chart's own hardening, on every pod
    chart-checks.py dashboard DASHBOARD.json      template variables, units, windows,
                                                  registered metrics
    chart-checks.py rules PROMETHEUSRULE.yaml OUT runbook anchors and registered metrics
                                                  of the rendered alerts; writes OUT, a
                                                  promtool rule file without annotations
    chart-checks.py covers VALUES.yaml PATHS      VALUES sets every path listed in PATHS
    chart-checks.py tls RENDERED.yaml [VALUES.yaml...]
                                                  the TLS Secrets, mounts, env and URLs
                                                  the values (chart defaults, then each
                                                  VALUES) ask for, in every pod, and no
                                                  others
"""
import json
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CATALOG = ROOT / "shared/src/metric_catalog.rs"
# Series Prometheus itself adds to every scrape.
BUILTIN = {"up"}
PROMQL_WORDS = {"sum", "max", "min", "avg", "rate", "increase", "by", "on", "without", "and", "or",
                "unless", "offset", "vector", "absent", "histogram_quantile", "label_values", "le",
                "bool", "ignoring", "group_left", "group_right", "count", "humanizePercentage"}
failures = []


def fail(message):
    failures.append(message)


def registered_metrics():
    """The metric catalog's names: what the processes export with a `# HELP` line. Its
    unit test checks that each entry is recorded by the code and that the code records
    nothing uncatalogued, so a query naming a catalogued metric names a real one."""
    text = CATALOG.read_text()
    names = set(re.findall(r'(?:counter|gauge|histogram)\(\s*"([a-z0-9_]+)"', text))
    if len(names) < 50:
        fail(f"{CATALOG}: only {len(names)} metrics found; has its format changed?")
    return names


def metric_names(expr):
    """Names of the series an expression selects (identifiers followed by a selector)."""
    expr = re.sub(r"`[^`]*`|\"[^\"]*\"", '""', expr)
    return set(re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{", expr))


def check_registered(where, expr, known):
    for name in metric_names(expr):
        if name in BUILTIN:
            continue
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        if name not in known and base not in known:
            fail(f"{where}: {name} is not a metric the code exports (shared/src/metric_catalog.rs)")


# --- Pod Security "restricted" -------------------------------------------------------

def pod_specs(doc):
    kind = doc.get("kind")
    if kind == "Pod":
        yield doc["metadata"]["name"], doc["spec"]
    elif kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
        yield doc["metadata"]["name"], doc["spec"]["template"]["spec"]
    elif kind == "CronJob":
        yield doc["metadata"]["name"], doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]


def check_pod(name, spec):
    pod_sc = spec.get("securityContext") or {}
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field):
            fail(f"{name}: {field} is set")
    for volume in spec.get("volumes") or []:
        if "hostPath" in volume:
            fail(f"{name}: hostPath volume {volume.get('name')}")
    if spec.get("automountServiceAccountToken") is not False:
        fail(f"{name}: automountServiceAccountToken is not false")
    if spec.get("enableServiceLinks") is not False:
        fail(f"{name}: enableServiceLinks is not false")
    containers = (spec.get("initContainers") or []) + (spec.get("containers") or [])
    if not containers:
        fail(f"{name}: no containers")
    for c in containers:
        where = f"{name}/{c['name']}"
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            fail(f"{where}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            fail(f"{where}: allowPrivilegeEscalation is not false")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            fail(f"{where}: capabilities do not drop ALL")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            fail(f"{where}: adds capabilities {caps.get('add')}")
        non_root = sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
        if non_root is not True:
            fail(f"{where}: runAsNonRoot is not true")
        if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
            fail(f"{where}: runs as UID 0")
        seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            fail(f"{where}: seccompProfile is {seccomp}, not RuntimeDefault or Localhost")
        if sc.get("readOnlyRootFilesystem") is not True:
            fail(f"{where}: readOnlyRootFilesystem is not true")


def restricted(paths):
    pods = 0
    for path in paths:
        for doc in yaml.safe_load_all(Path(path).read_text()):
            for name, spec in pod_specs(doc or {}):
                pods += 1
                check_pod(f"{Path(path).name}: {doc['kind']} {name}", spec)
    if pods == 0:
        fail("no pod specs found")
    return pods


# --- dashboard ------------------------------------------------------------------------

MATCHERS = ('namespace="$namespace"', 'job=~"$job"', 'pod=~"$pod"')


def dashboard(path):
    known = registered_metrics()
    board = json.loads(Path(path).read_text())
    variables = {v["name"] for v in board["templating"]["list"]}
    for needed in ("datasource", "namespace", "job", "pod"):
        if needed not in variables:
            fail(f"dashboard: no ${needed} variable")
    for v in board["templating"]["list"]:
        query = v.get("query")
        query = query.get("query") if isinstance(query, dict) else query
        if v["type"] == "query":
            check_registered(f"variable {v['name']}", query, known)
    count = 0
    for panel in board["panels"]:
        title = panel["title"]
        defaults = panel.get("fieldConfig", {}).get("defaults", {})
        if not defaults.get("unit"):
            fail(f"panel {title!r}: no unit")
        for override in panel.get("fieldConfig", {}).get("overrides", []):
            if any(p.get("id") == "unit" for p in override.get("properties", [])):
                fail(f"panel {title!r}: a second unit in an override")
        if panel.get("datasource", {}).get("uid") != "${datasource}":
            fail(f"panel {title!r}: not on the $datasource variable")
        for target in panel.get("targets", []):
            expr = target["expr"]
            count += 1
            check_registered(f"panel {title!r}", expr, known)
            if re.search(r"\[\d+[smhdw]\]", expr):
                fail(f"panel {title!r}: a fixed range window instead of $__rate_interval: {expr}")
            for selector in re.findall(r"\{[^}]*\}", re.sub(r"\{\{[^}]*\}\}", "", expr)):
                for matcher in MATCHERS:
                    if matcher not in selector:
                        fail(f"panel {title!r}: selector {selector} lacks {matcher}")
            if not re.search(r"\{", expr):
                fail(f"panel {title!r}: a query without a selector: {expr}")
    return count


# --- alerts ---------------------------------------------------------------------------

def slug(heading):
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def rules(path, out):
    known = registered_metrics()
    docs = (ROOT / "docs" / "operations.md").read_text()
    anchors = {slug(m) for m in re.findall(r"^#+\s+(.*)$", docs, re.M)}
    doc = yaml.safe_load(Path(path).read_text())
    groups = doc["spec"]["groups"]
    count = 0
    for group in groups:
        for rule in group["rules"]:
            name = rule.get("alert") or rule.get("record")
            count += 1
            check_registered(f"alert {name}", rule["expr"], known)
            annotations = rule.pop("annotations", {}) or {}
            for field in ("summary", "description", "runbook_url"):
                if not annotations.get(field):
                    fail(f"alert {name}: no {field}")
            anchor = annotations.get("runbook_url", "").partition("#")[2]
            if anchor not in anchors:
                fail(f"alert {name}: runbook anchor #{anchor} is not a heading of docs/operations.md")
            if rule.get("labels", {}).get("severity") not in ("critical", "warning"):
                fail(f"alert {name}: severity is not critical or warning")
    Path(out).write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    return count


# --- every documented value is set -----------------------------------------------------

def covers(values_path, paths_path):
    values = yaml.safe_load(Path(values_path).read_text())
    for path in Path(paths_path).read_text().split():
        node = values
        for key in path.split("."):
            if not isinstance(node, dict) or key not in node:
                fail(f"{values_path} does not set {path}")
                break
            node = node[key]


# --- TLS values -------------------------------------------------------------------------

TLS_ROOT = "/etc/herald/tls/"
# The Herald container of each component (sidecars are the user's).
HERALD_CONTAINERS = {"gateway": "gateway", "worker": "worker", "migrations": "migrate",
                     "probe": "probe", "test": "probe"}
BACKEND = ("gateway", "worker", "migrations")


def merged_values(paths):
    def merge(base, over):
        for key, value in (over or {}).items():
            if isinstance(value, dict) and isinstance(base.get(key), dict):
                merge(base[key], value)
            else:
                base[key] = value
        return base
    values = yaml.safe_load((ROOT / "helm/herald/values.yaml").read_text())
    for path in paths:
        merge(values, yaml.safe_load(Path(path).read_text()))
    return values


def expected_tls(values):
    """Per component: {file: (secret, key)} mounted and {variable: file} set."""
    gw, redis, mysql = values["gateway"]["tls"], values["redis"]["tls"], values["mysql"]["tls"]
    files = {c: {} for c in HERALD_CONTAINERS}
    env = {c: {} for c in HERALD_CONTAINERS}
    for c in BACKEND:
        if redis["caSecret"]:
            files[c][TLS_ROOT + "redis-ca/ca.crt"] = (redis["caSecret"], redis["caKey"])
            env[c]["HERALD_REDIS__TLS_CA_FILE"] = TLS_ROOT + "redis-ca/ca.crt"
        if redis["clientSecret"]:
            for name, var in (("tls.crt", "CERT"), ("tls.key", "KEY")):
                files[c][TLS_ROOT + "redis-client/" + name] = (redis["clientSecret"], name)
                env[c][f"HERALD_REDIS__TLS_{var}_FILE"] = TLS_ROOT + "redis-client/" + name
        if mysql["caSecret"]:
            files[c][TLS_ROOT + "mysql/ca.crt"] = (mysql["caSecret"], mysql["caKey"])
        if mysql["clientSecret"]:
            for name in ("tls.crt", "tls.key"):
                files[c][TLS_ROOT + "mysql-client/" + name] = (mysql["clientSecret"], name)
    if gw["enabled"]:
        for name, var in (("tls.crt", "CERT"), ("tls.key", "KEY")):
            files["gateway"][TLS_ROOT + "gateway/" + name] = (gw["existingSecret"], name)
            env["gateway"][f"HERALD_GATEWAY__TLS_{var}_FILE"] = TLS_ROOT + "gateway/" + name
        if gw["caKey"]:
            for c in ("probe", "test"):
                files[c][TLS_ROOT + "gateway-ca/ca.crt"] = (gw["existingSecret"], gw["caKey"])
    return files, env


def mounted_files(where, spec, container):
    """{file: (secret, key)} of the TLS mounts of a container; fails writable ones."""
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    found = {}
    for mount in container.get("volumeMounts") or []:
        path = mount["mountPath"].rstrip("/") + "/"
        if not path.startswith(TLS_ROOT):
            continue
        if mount.get("readOnly") is not True:
            fail(f"{where}: {mount['mountPath']} is not mounted readOnly")
        secret = (volumes.get(mount["name"]) or {}).get("secret")
        if not secret:
            fail(f"{where}: {mount['mountPath']} is not a Secret volume")
            continue
        if not secret.get("items"):
            fail(f"{where}: Secret {secret.get('secretName')} is mounted without items (every key)")
        for item in secret.get("items") or []:
            found[path + item["path"]] = (secret["secretName"], item["key"])
    return found


def arg_after(args, flag):
    return args[args.index(flag) + 1] if flag in args else None


def tls(rendered, values_paths):
    values = merged_values(values_paths)
    files, env = expected_tls(values)
    docs = [d for d in yaml.safe_load_all(Path(rendered).read_text()) if d]
    mysql_url = ""
    for doc in docs:
        if doc["kind"] == "Secret":
            mysql_url = (doc.get("stringData") or {}).get("mysql-url", mysql_url)
    mysql_files = re.findall(r"[?&]ssl-(?:ca|cert|key)=([^&]+)", mysql_url)
    seen = set()
    for doc in docs:
        for name, spec in pod_specs(doc):
            labels = (doc["metadata"] if doc["kind"] == "Pod" else doc["spec"]["template"]["metadata"])["labels"]
            component = labels.get("app.kubernetes.io/component")
            if component not in HERALD_CONTAINERS:
                continue
            seen.add(component)
            for c in spec["containers"]:
                where = f"{doc['kind']} {name}/{c['name']}"
                if c["name"] != HERALD_CONTAINERS[component]:
                    if mounted_files(where, spec, c):
                        fail(f"{where}: a sidecar mounts Herald's TLS Secrets")
                    continue
                found = mounted_files(where, spec, c)
                if found != files[component]:
                    fail(f"{where}: TLS files {found}, expected {files[component]}")
                tls_env = {e["name"]: e.get("value") for e in c.get("env") or []
                           if "TLS" in e["name"] or str(e.get("value", "")).startswith(TLS_ROOT)}
                if tls_env != env[component]:
                    fail(f"{where}: TLS env {tls_env}, expected {env[component]}")
                for var, path in tls_env.items():
                    if path not in found:
                        fail(f"{where}: {var} names {path}, which is not mounted")
                for path in mysql_files if component in BACKEND else []:
                    if path not in found:
                        fail(f"{where}: the MySQL URL names {path}, which is not mounted")
                if component in ("probe", "test"):
                    args = c.get("command") or []
                    url = arg_after(args, "--gateways") or ""
                    scheme = "https://" if values["gateway"]["tls"]["enabled"] else "http://"
                    if not url.startswith(scheme):
                        fail(f"{where}: --gateways {url} does not start with {scheme}")
                    ca = arg_after(args, "--ca-file")
                    want = next(iter(files[component]), None)
                    if ca != want:
                        fail(f"{where}: --ca-file {ca}, expected {want}")
                for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                    check = (c.get(probe) or {}).get("httpGet")
                    if check and check.get("scheme", "HTTP") != "HTTP":
                        fail(f"{where}: {probe} is not plain HTTP on the admin port")
        if doc["kind"] == "Ingress":
            annotations = doc["metadata"].get("annotations") or {}
            protocol = annotations.get("nginx.ingress.kubernetes.io/backend-protocol")
            users = values["gateway"]["ingress"]["annotations"].get("nginx.ingress.kubernetes.io/backend-protocol")
            want = users or ("HTTPS" if values["gateway"]["tls"]["enabled"] else None)
            if protocol != want:
                fail(f"Ingress {doc['metadata']['name']}: backend-protocol {protocol}, expected {want}")
    for component in ("gateway", "worker"):
        if component not in seen:
            fail(f"{rendered}: no {component} pod")
    return len(seen)


def main():
    command, args = sys.argv[1], sys.argv[2:]
    if command == "restricted":
        print(f"{restricted(args)} pod specs checked")
    elif command == "dashboard":
        print(f"{dashboard(args[0])} dashboard queries checked")
    elif command == "rules":
        print(f"{rules(args[0], args[1])} alerts checked")
    elif command == "tls":
        print(f"{tls(args[0], args[1:])} components' TLS files, env and URLs checked")
    elif command == "covers":
        covers(args[0], args[1])
    else:
        sys.exit(f"unknown command {command}")
    if failures:
        print("\n".join(failures), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
