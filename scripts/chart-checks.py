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
    chart-checks.py pod-labels RENDERED.yaml...   pod templates carry no chart or version
                                                  label, and their selector's labels
    chart-checks.py pod-template RENDERED.yaml KIND NAME
                                                  prints the pod template of one object
                                                  (canonical JSON), to compare renders
    chart-checks.py job-name RENDERED.yaml        prints the migrations Job's name
    chart-checks.py readers-values README.md OUT  writes a values file setting `config`
                                                  to every key of README.md's table
    chart-checks.py readers RENDERED.yaml README.md
                                                  each component's ConfigMap holds the
                                                  keys README.md says it reads, only them
    chart-checks.py metadata                      Chart.yaml's home, sources, icon,
                                                  maintainers and Artifact Hub annotations
    chart-checks.py wired RENDERED.yaml VALUES.yaml
                                                  every value of ci/all-values.yaml that
                                                  platform teams set shows in the render
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


# --- pod templates, the migrations Job, config readers --------------------------------

def docs_of(path):
    return [d for d in yaml.safe_load_all(Path(path).read_text()) if d]


def pod_labels(paths):
    count = 0
    for path in paths:
        for doc in docs_of(path):
            if doc["kind"] not in ("Deployment", "Job"):
                continue
            count += 1
            where = f"{Path(path).name}: {doc['kind']} {doc['metadata']['name']}"
            labels = doc["spec"]["template"]["metadata"].get("labels") or {}
            for bad in ("helm.sh/chart", "app.kubernetes.io/version", "app.kubernetes.io/managed-by"):
                if bad in labels:
                    fail(f"{where}: the pod template carries {bad}, which changes with the chart")
            selector = (doc["spec"].get("selector") or {}).get("matchLabels") or {}
            for key, value in selector.items():
                if labels.get(key) != value:
                    fail(f"{where}: the pod template lacks its selector's {key}={value}")
            for key in ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/component"):
                if key not in labels:
                    fail(f"{where}: the pod template lacks {key}")
    if count == 0:
        fail("no pod templates found")
    return count


def pod_template(path, kind, name):
    for doc in docs_of(path):
        if doc["kind"] == kind and doc["metadata"]["name"] == name:
            return json.dumps(doc["spec"]["template"], sort_keys=True, indent=1)
    fail(f"{path}: no {kind} {name}")
    return ""


def job_name(path):
    names = [d["metadata"]["name"] for d in docs_of(path) if d["kind"] == "Job"]
    if len(names) != 1:
        fail(f"{path}: {len(names)} Jobs, expected one")
        return ""
    return names[0]


def readme_readers(readme):
    """{KEY (without HERALD_): set of readers} from README.md's configuration table."""
    rows = re.findall(r"^\| `HERALD_([A-Z0-9_]+)` \| `[^`]*` \|[^|]*\| ([a-z, ]+) \|", Path(readme).read_text(), re.M)
    if len(rows) < 50:
        fail(f"{readme}: only {len(rows)} configuration rows found; has the table changed?")
    return {key: {r.strip() for r in readers.split(",")} for key, readers in rows}


def readers_values(readme, out):
    config = {key: "1" for key in readme_readers(readme)}
    Path(out).write_text(yaml.safe_dump({"config": config}))


def readers(rendered, readme):
    want = readme_readers(readme)
    maps = {}
    for doc in docs_of(rendered):
        name = doc["metadata"]["name"]
        if doc["kind"] == "ConfigMap" and name.endswith("-config"):
            component = doc["metadata"]["labels"]["app.kubernetes.io/component"]
            maps[component] = {k[len("HERALD_"):] for k in doc["data"]}
    for component in ("gateway", "worker"):
        if component not in maps:
            fail(f"{rendered}: no {component} ConfigMap")
            continue
        for key, who in want.items():
            if (component in who) != (key in maps[component]):
                where = "holds" if key in maps[component] else "lacks"
                fail(f"the {component} ConfigMap {where} HERALD_{key}, read by {', '.join(sorted(who))}")
    return len(want)


def wired(rendered, values_path):
    """The values platform teams set, each found where it belongs in the render (values
    merged over the chart's defaults, as Helm merges them)."""
    v = merged_values([values_path])
    docs = docs_of(rendered)
    by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    full = v["fullnameOverride"]

    def get(kind, name):
        doc = by.get((kind, name))
        if doc is None:
            fail(f"no {kind} {name} in the render")
            return {}
        return doc

    def expect(what, got, want):
        if got != want:
            fail(f"{what}: {got!r}, expected {want!r}")

    def contains(what, items, want):
        if not isinstance(items, list) or any(w not in items for w in want):
            fail(f"{what}: {items!r} lacks {want!r}")

    ours = [d for d in docs if (d["metadata"].get("labels") or {}).get("app.kubernetes.io/managed-by")]
    for d in ours:
        where = f"{d['kind']} {d['metadata']['name']}"
        for key, value in v["commonLabels"].items():
            expect(f"{where} label {key}", d["metadata"]["labels"].get(key), value)
        for key, value in v["commonAnnotations"].items():
            expect(f"{where} annotation {key}", (d["metadata"].get("annotations") or {}).get(key), value)
    for extra in ("herald-all-extra", "herald-extra-text"):
        get("ConfigMap", extra)
    otel = v["otel"]
    for component in ("gateway", "worker"):
        data = get("ConfigMap", f"{full}-{component}-config").get("data") or {}
        if otel["endpoint"]:
            expect(f"{component} HERALD_OTEL__ENDPOINT", data.get("HERALD_OTEL__ENDPOINT"), otel["endpoint"])
            ratio = data.get("HERALD_OTEL__SAMPLE_RATIO")
            expect(f"{component} HERALD_OTEL__SAMPLE_RATIO", ratio and float(ratio), float(otel["sampleRatio"]))
            expect(f"{component} HERALD_OTEL__SERVICE_NAME", data.get("HERALD_OTEL__SERVICE_NAME"),
                   otel["serviceName"] or None)
    image = f"{v['global']['imageRegistry']}/{v['image']['repository']}:{v['image']['tag']}@{v['image']['digest']}"
    pulls = [{"name": s["name"]} for s in v["global"]["imagePullSecrets"] + v["imagePullSecrets"]]
    for component in ("gateway", "worker"):
        c = v[component]
        dep = get("Deployment", f"{full}-{component}")
        if not dep:
            continue
        pod = dep["spec"]["template"]
        spec = pod["spec"]
        main = spec["containers"][0]
        where = f"Deployment {full}-{component}"
        expect(f"{where} image", main["image"], image)
        expect(f"{where} imagePullSecrets", spec.get("imagePullSecrets"), pulls)
        expect(f"{where} revisionHistoryLimit", dep["spec"].get("revisionHistoryLimit"), v["revisionHistoryLimit"])
        for key, value in c["annotations"].items():
            expect(f"{where} annotation {key}", dep["metadata"]["annotations"].get(key), value)
        for key, value in {**v["podAnnotations"], **c["podAnnotations"]}.items():
            expect(f"{where} pod annotation {key}", pod["metadata"]["annotations"].get(key), value)
        for key, value in {**v["commonLabels"], **v["podLabels"], **c["podLabels"]}.items():
            expect(f"{where} pod label {key}", pod["metadata"]["labels"].get(key), value)
        contains(f"{where} env", main.get("env"), v["extraEnv"] + c["extraEnv"])
        contains(f"{where} envFrom", main.get("envFrom"), v["extraEnvFrom"] + c["extraEnvFrom"])
        expect(f"{where} initContainers", spec.get("initContainers"), c["initContainers"])
        expect(f"{where} lifecycle", main.get("lifecycle"), c["lifecycle"])
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            got = {k: x for k, x in main[probe].items() if k != "httpGet"}
            expect(f"{where} {probe}", got, c[probe])
        hpa = get("HorizontalPodAutoscaler", f"{full}-{component}")
        a = c["autoscaling"]
        if hpa:
            expect(f"HPA {full}-{component} behavior", hpa["spec"].get("behavior"), a["behavior"])
            contains(f"HPA {full}-{component} metrics", hpa["spec"]["metrics"], a["metrics"])
            resources = {m["resource"]["name"]: m["resource"]["target"]["averageUtilization"]
                         for m in hpa["spec"]["metrics"] if m["type"] == "Resource"}
            want = {k: x for k, x in (("cpu", a["targetCPUUtilizationPercentage"]),
                                       ("memory", a["targetMemoryUtilizationPercentage"])) if x}
            expect(f"HPA {full}-{component} resource targets", resources, want)
    svc = get("Service", f"{full}-gateway")
    s = v["gateway"]["service"]
    if svc:
        for key in ("externalTrafficPolicy", "loadBalancerSourceRanges", "loadBalancerClass"):
            expect(f"Service {full}-gateway {key}", svc["spec"].get(key), s[key])
        expect(f"Service {full}-gateway nodePort", svc["spec"]["ports"][0].get("nodePort"), s["nodePort"])
        for key, value in s["labels"].items():
            expect(f"Service {full}-gateway label {key}", svc["metadata"]["labels"].get(key), value)
    route = get("HTTPRoute", f"{full}-gateway")
    r = v["gateway"]["httpRoute"]
    if route:
        expect("HTTPRoute parentRefs", route["spec"]["parentRefs"], r["parentRefs"])
        expect("HTTPRoute hostnames", route["spec"]["hostnames"], r["hostnames"])
        rule = route["spec"]["rules"][0]
        expect("HTTPRoute timeouts", rule.get("timeouts"), r["timeouts"])
        expect("HTTPRoute path", rule["matches"], [{"path": {"type": "PathPrefix", "value": "/v1"}}])
        expect("HTTPRoute backend", rule["backendRefs"], [{"name": f"{full}-gateway", "port": s["port"]}])
        for key, value in r["annotations"].items():
            expect(f"HTTPRoute annotation {key}", route["metadata"]["annotations"].get(key), value)
    sm = get("ServiceMonitor", full)
    m = v["metrics"]["serviceMonitor"]
    for endpoint in (sm.get("spec") or {}).get("endpoints", []):
        expect("ServiceMonitor scrapeTimeout", endpoint.get("scrapeTimeout"), m["scrapeTimeout"])
        contains("ServiceMonitor relabelings", endpoint.get("relabelings"), m["relabelings"])
        expect("ServiceMonitor metricRelabelings", endpoint.get("metricRelabelings"), m["metricRelabelings"])
    jobs = [d for d in docs if d["kind"] == "Job"]
    mig = v["migrations"]
    for job in jobs:
        expect("Job activeDeadlineSeconds", job["spec"].get("activeDeadlineSeconds"), mig["activeDeadlineSeconds"])
        expect("Job ttlSecondsAfterFinished", job["spec"].get("ttlSecondsAfterFinished"), mig["ttlSecondsAfterFinished"])
        pod = job["spec"]["template"]
        for key, value in {**v["podAnnotations"], **mig["podAnnotations"]}.items():
            expect(f"Job pod annotation {key}", pod["metadata"]["annotations"].get(key), value)
        contains("Job env", pod["spec"]["containers"][0].get("env"), v["extraEnv"] + mig["extraEnv"])
        contains("Job envFrom", pod["spec"]["containers"][0].get("envFrom"), v["extraEnvFrom"])
    if len(jobs) != 1:
        fail(f"{len(jobs)} migrations Jobs")
    return len(ours)


def metadata():
    chart_dir = ROOT / "helm/herald"
    chart = yaml.safe_load((chart_dir / "Chart.yaml").read_text())
    for field in ("home", "sources", "icon", "maintainers", "description", "appVersion"):
        if not chart.get(field):
            fail(f"Chart.yaml has no {field}")
    for url in [chart.get("home", ""), chart.get("icon", "")] + (chart.get("sources") or []):
        if not url.startswith("https://"):
            fail(f"Chart.yaml: {url!r} is not an https URL")
    icon = chart.get("icon", "")
    if not (chart_dir / icon.rsplit("/helm/herald/", 1)[-1]).is_file():
        fail(f"Chart.yaml: the icon {icon} is not a file of the chart")
    ann = chart.get("annotations") or {}
    if ann.get("artifacthub.io/license") != "Apache-2.0":
        fail("Chart.yaml: artifacthub.io/license is not the repository's Apache-2.0")
    values = yaml.safe_load((chart_dir / "values.yaml").read_text())
    registry = values["image"].get("registry") or ""
    repository = (registry.rstrip("/") + "/" if registry else "") + values["image"]["repository"]
    image = repository + ":" + (values["image"]["tag"] or chart["appVersion"])
    images = [i["image"] for i in yaml.safe_load(ann.get("artifacthub.io/images", "[]")) or []]
    if images != [image]:
        fail(f"Chart.yaml: artifacthub.io/images {images} is not the chart's default image {image}")
    for key in ("artifacthub.io/links", "artifacthub.io/changes"):
        if not yaml.safe_load(ann.get(key, "[]")):
            fail(f"Chart.yaml: no {key}")
    return len(ann)


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
    elif command == "pod-labels":
        print(f"{pod_labels(args)} pod templates checked")
    elif command == "pod-template":
        print(pod_template(args[0], args[1], args[2]))
    elif command == "job-name":
        print(job_name(args[0]))
    elif command == "readers-values":
        readers_values(args[0], args[1])
    elif command == "readers":
        print(f"{readers(args[0], args[1])} settings' readers checked")
    elif command == "metadata":
        print(f"{metadata()} Artifact Hub annotations checked")
    elif command == "wired":
        print(f"{wired(args[0], args[1])} objects of the release checked")
    else:
        sys.exit(f"unknown command {command}")
    if failures:
        print("\n".join(failures), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
