#!/usr/bin/env python3
"""Offline checks of kvroute's rendered manifests (`kubectl kustomize` output), for what
neither kustomize nor kubernetes-validate looks at (run by scripts/manifests.sh):

- the custom kinds, for which no schema is at hand offline (CUSTOM_KINDS): the fields their
  controllers require, and no field they do not know where the API is closed;
- references between the objects of one render: selectors of Services, workloads,
  disruption budgets, ServiceMonitors and the InferencePool that match some Pod template;
  ConfigMaps, Secrets, claims and service accounts that exist; named probe and Service
  ports that a container declares; $(VAR) references that an env entry defines;
  Gateway/HTTPRoute/InferencePool/endpoint picker references;
- kvroute's own wiring: the gateway's (or picker's) TOML config in its ConfigMap, its
  discovery namespace and selector against the engines of the render (never itself), the
  engines' block size and model directory against router.block_size and tokenizer, event
  sources (named ports, or `kvroute.io/events: nats` with a relay named after its Pod), the
  NATS URL against a Service, --pool-name against the InferencePool;
- with --kvroute BIN: every gateway and picker container's command is dry-run with its own
  arguments, environment and config (`--print-config`: the files, the `KVROUTE__` variables
  and the flags, checked, nothing started; a tokenizer directory absent here is replaced by
  `builtin`), so a key the binary does not know (every table is deny_unknown_fields) or a
  value it refuses fails here and not in the cluster.

Usage: check_manifests.py [--allow-no-engines] [--kvroute BIN] RENDER.yaml
       check_manifests.py --custom-kinds     (the kinds whose missing schema is expected)
Needs PyYAML (the tools venv of scripts/tools.sh has it) and Python 3.11+ (tomllib).
"""

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import tomllib

import yaml

# Custom kinds these manifests use, by kind: the API group and versions checked here.
CUSTOM_KINDS = {
    "ServiceMonitor": ("monitoring.coreos.com", {"v1"}),
    "Gateway": ("gateway.networking.k8s.io", {"v1"}),
    "HTTPRoute": ("gateway.networking.k8s.io", {"v1"}),
    "InferencePool": ("inference.networking.k8s.io", {"v1"}),
}

# API groups of Kubernetes itself (kubernetes-validate has their schemas).
BUILTIN_GROUPS = {
    "", "apps", "batch", "policy", "autoscaling", "rbac.authorization.k8s.io",
    "networking.k8s.io", "discovery.k8s.io", "storage.k8s.io", "scheduling.k8s.io",
    "coordination.k8s.io", "node.k8s.io", "certificates.k8s.io", "admissionregistration.k8s.io",
    "apiextensions.k8s.io", "apiregistration.k8s.io", "flowcontrol.apiserver.k8s.io",
    "resource.k8s.io", "events.k8s.io",
}
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}
DURATION = re.compile(r"^([0-9]{1,5}(h|m|s|ms)){1,4}$")  # Gateway API's Duration
PROM_DURATION = re.compile(r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$")
VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
MARKERS = {"serve": "kvroute gateway on", "epp": "kvroute endpoint picker:"}


class Render:
    """One render: its objects by (kind, namespace, name), its Pod templates."""

    def __init__(self, docs):
        self.objects = [d for d in docs if isinstance(d, dict)]
        self.errors = []
        self.by_key = {}
        for o in self.objects:
            self.by_key[(o.get("kind"), ns_of(o), name_of(o))] = o
        self.templates = []  # (owner object, template metadata, pod spec)
        for o in self.objects:
            spec = o.get("spec") or {}
            if o.get("kind") in WORKLOADS:
                t = spec.get("template") or {}
                self.templates.append((o, t.get("metadata") or {}, t.get("spec") or {}))
            elif o.get("kind") == "Pod":
                self.templates.append((o, o.get("metadata") or {}, spec))

    def error(self, obj, msg):
        where = f"{obj.get('kind')}/{name_of(obj)}" if isinstance(obj, dict) else str(obj)
        self.errors.append(f"{where}: {msg}")

    def get(self, kind, ns, name):
        return self.by_key.get((kind, ns, name))

    def templates_matching(self, ns, labels):
        return [
            t for t in self.templates
            if ns_of(t[0]) == ns and labels_match(labels, (t[1].get("labels") or {}))
        ]


def ns_of(o):
    return (o.get("metadata") or {}).get("namespace") or ""


def name_of(o):
    return (o.get("metadata") or {}).get("name") or "?"


def labels_match(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def containers(pod_spec):
    return list(pod_spec.get("initContainers") or []) + list(pod_spec.get("containers") or [])


def port_names(pod_spec):
    return {p.get("name") for c in containers(pod_spec) for p in c.get("ports") or [] if p.get("name")}


def port_numbers(pod_spec):
    return {p.get("containerPort") for c in containers(pod_spec) for p in c.get("ports") or []}


def arg_value(args, flag):
    """The value after `flag` (or of `flag=value`) in a container's args, else None."""
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if isinstance(a, str) and a.startswith(flag + "="):
            return a[len(flag) + 1:]
    return None


def selector_labels(sel):
    """`k=v,k2=v2` as a dict; None for selector syntax other than equality."""
    out = {}
    for part in filter(None, (p.strip() for p in sel.split(","))):
        m = re.fullmatch(r"([A-Za-z0-9./_-]+)\s*==?\s*([A-Za-z0-9._-]*)", part)
        if not m:
            return None
        out[m.group(1)] = m.group(2)
    return out


def check_keys(r, obj, where, value, allowed):
    if isinstance(value, dict):
        for k in value:
            if k not in allowed:
                r.error(obj, f"{where}: unknown field {k!r}")


# ---------------------------------------------------------------------------------------
# Custom kinds


def check_custom_kinds(r):
    for o in r.objects:
        kind, api = o.get("kind"), o.get("apiVersion", "")
        if not kind or not api or not (o.get("metadata") or {}).get("name"):
            r.error(o, "needs apiVersion, kind and metadata.name")
            continue
        group, _, version = api.rpartition("/")
        if kind in CUSTOM_KINDS:
            want_group, versions = CUSTOM_KINDS[kind]
            if group != want_group or version not in versions:
                r.error(o, f"apiVersion {api}: expected {want_group}/{sorted(versions)}")
                continue
            {"ServiceMonitor": check_servicemonitor, "Gateway": check_gateway,
             "HTTPRoute": check_httproute, "InferencePool": check_inferencepool}[kind](r, o)
        elif group not in BUILTIN_GROUPS:
            r.error(o, f"custom kind {kind} ({api}) has no check: add it to CUSTOM_KINDS")


def check_servicemonitor(r, o):
    spec = o.get("spec") or {}
    check_keys(r, o, "spec", spec, {
        "jobLabel", "targetLabels", "podTargetLabels", "endpoints", "selector",
        "selectorMechanism", "namespaceSelector", "sampleLimit", "scrapeProtocols",
        "fallbackScrapeProtocol", "targetLimit", "labelLimit", "labelNameLengthLimit",
        "labelValueLengthLimit", "nativeHistogramBucketLimit", "nativeHistogramMinBucketFactor",
        "convertClassicHistogramsToNHCB", "scrapeClassicHistograms", "keepDroppedTargets",
        "attachMetadata", "scrapeClass", "bodySizeLimit"})
    sel = spec.get("selector")
    if not isinstance(sel, dict) or not (sel.get("matchLabels") or sel.get("matchExpressions")):
        r.error(o, "spec.selector needs matchLabels or matchExpressions")
    eps = spec.get("endpoints")
    if not isinstance(eps, list) or not eps:
        r.error(o, "spec.endpoints must be a non-empty list")
        return
    for i, ep in enumerate(eps):
        check_keys(r, o, f"spec.endpoints[{i}]", ep, {
            "port", "targetPort", "path", "scheme", "params", "interval", "scrapeTimeout",
            "tlsConfig", "bearerTokenFile", "bearerTokenSecret", "authorization", "honorLabels",
            "honorTimestamps", "trackTimestampsStaleness", "basicAuth", "oauth2",
            "metricRelabelings", "relabelings", "proxyUrl", "followRedirects", "enableHttp2",
            "filterRunning", "noProxy", "proxyFromEnvironment", "proxyConnectHeader"})
        if not isinstance(ep, dict) or not (ep.get("port") or ep.get("targetPort")):
            r.error(o, f"spec.endpoints[{i}] needs a port (name) or targetPort")
            continue
        if "path" in ep and not str(ep["path"]).startswith("/"):
            r.error(o, f"spec.endpoints[{i}].path must start with /")
        for f in ("interval", "scrapeTimeout"):
            if f in ep and not PROM_DURATION.match(str(ep[f])):
                r.error(o, f"spec.endpoints[{i}].{f} {ep[f]!r} is not a duration")
        if ep.get("scheme", "http") not in ("http", "https", "HTTP", "HTTPS"):
            r.error(o, f"spec.endpoints[{i}].scheme must be http or https")


def check_gateway(r, o):
    spec = o.get("spec") or {}
    check_keys(r, o, "spec", spec, {"gatewayClassName", "listeners", "addresses",
                                     "infrastructure", "backendTLS", "allowedListeners"})
    if not isinstance(spec.get("gatewayClassName"), str) or not spec["gatewayClassName"]:
        r.error(o, "spec.gatewayClassName is required")
    ls = spec.get("listeners")
    if not isinstance(ls, list) or not 1 <= len(ls) <= 64:
        r.error(o, "spec.listeners must hold 1 to 64 listeners")
        return
    names = set()
    for i, l in enumerate(ls):
        check_keys(r, o, f"spec.listeners[{i}]", l,
                   {"name", "hostname", "port", "protocol", "tls", "allowedRoutes"})
        if not isinstance(l, dict):
            r.error(o, f"spec.listeners[{i}] must be an object")
            continue
        if not l.get("name") or l["name"] in names:
            r.error(o, f"spec.listeners[{i}] needs a unique name")
        names.add(l.get("name"))
        if not isinstance(l.get("port"), int) or not 1 <= l["port"] <= 65535:
            r.error(o, f"spec.listeners[{i}].port must be 1-65535")
        proto = l.get("protocol")
        if proto not in ("HTTP", "HTTPS", "TLS", "TCP", "UDP") and "/" not in str(proto):
            r.error(o, f"spec.listeners[{i}].protocol {proto!r} is not a Gateway API protocol")
        if proto in ("HTTPS", "TLS") and not l.get("tls"):
            r.error(o, f"spec.listeners[{i}]: {proto} needs tls")


def check_httproute(r, o):
    spec = o.get("spec") or {}
    check_keys(r, o, "spec", spec, {"parentRefs", "hostnames", "rules"})
    prs = spec.get("parentRefs")
    if not isinstance(prs, list) or not 1 <= len(prs) <= 32:
        r.error(o, "spec.parentRefs must hold 1 to 32 references")
        prs = []
    for i, p in enumerate(prs):
        check_keys(r, o, f"spec.parentRefs[{i}]", p,
                   {"group", "kind", "namespace", "name", "sectionName", "port"})
        if not isinstance(p, dict) or not p.get("name"):
            r.error(o, f"spec.parentRefs[{i}].name is required")
            continue
        if p.get("group", "gateway.networking.k8s.io") != "gateway.networking.k8s.io" or \
                p.get("kind", "Gateway") != "Gateway":
            r.error(o, f"spec.parentRefs[{i}] must be a gateway.networking.k8s.io Gateway")
            continue
        gw = r.get("Gateway", p.get("namespace", ns_of(o)), p["name"])
        if gw is None:
            r.error(o, f"spec.parentRefs[{i}]: no Gateway {p['name']!r} in this render")
        elif p.get("sectionName") and p["sectionName"] not in {
                l.get("name") for l in (gw.get("spec") or {}).get("listeners") or []}:
            r.error(o, f"spec.parentRefs[{i}]: Gateway {p['name']} has no listener {p['sectionName']!r}")
    rules = spec.get("rules")
    if not isinstance(rules, list) or not 1 <= len(rules) <= 16:
        r.error(o, "spec.rules must hold 1 to 16 rules")
        return
    for i, rule in enumerate(rules):
        check_keys(r, o, f"spec.rules[{i}]", rule, {"name", "matches", "filters", "backendRefs",
                                                     "timeouts", "retry", "sessionPersistence"})
        for j, m in enumerate(rule.get("matches") or []):
            path = (m or {}).get("path")
            if path is not None:
                if path.get("type", "PathPrefix") not in ("Exact", "PathPrefix", "RegularExpression") \
                        or not str(path.get("value", "/")).startswith("/"):
                    r.error(o, f"spec.rules[{i}].matches[{j}].path: bad type or value")
        for f, v in (rule.get("timeouts") or {}).items():
            if f not in ("request", "backendRequest") or not DURATION.match(str(v)):
                r.error(o, f"spec.rules[{i}].timeouts.{f}: {v!r} is not a Gateway API duration")
        brs = rule.get("backendRefs")
        if not isinstance(brs, list) or not brs:
            r.error(o, f"spec.rules[{i}].backendRefs: none (the route would answer 500)")
            continue
        for j, b in enumerate(brs):
            check_backend_ref(r, o, f"spec.rules[{i}].backendRefs[{j}]", b)


def check_backend_ref(r, o, where, b):
    check_keys(r, o, where, b, {"group", "kind", "name", "namespace", "port", "weight", "filters"})
    if not isinstance(b, dict) or not b.get("name"):
        r.error(o, f"{where}.name is required")
        return
    group, kind, ns = b.get("group", ""), b.get("kind", "Service"), b.get("namespace", ns_of(o))
    if (group, kind) == ("", "Service"):
        svc = r.get("Service", ns, b["name"])
        if not isinstance(b.get("port"), int):
            r.error(o, f"{where}: a Service backend needs a port")
        elif svc is None:
            r.error(o, f"{where}: no Service {b['name']!r} in this render")
        elif b["port"] not in {p.get("port") for p in (svc.get("spec") or {}).get("ports") or []}:
            r.error(o, f"{where}: Service {b['name']} has no port {b['port']}")
    elif (group, kind) == ("inference.networking.k8s.io", "InferencePool"):
        if r.get("InferencePool", ns, b["name"]) is None:
            r.error(o, f"{where}: no InferencePool {b['name']!r} in this render")
    else:
        r.error(o, f"{where}: backend {group or 'core'}/{kind} is neither a Service nor an InferencePool")


def check_inferencepool(r, o):
    spec = o.get("spec") or {}
    check_keys(r, o, "spec", spec, {"selector", "targetPorts", "endpointPickerRef"})
    sel = spec.get("selector")
    check_keys(r, o, "spec.selector", sel, {"matchLabels"})
    labels = (sel or {}).get("matchLabels") if isinstance(sel, dict) else None
    if not isinstance(labels, dict) or not labels or \
            not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        r.error(o, "spec.selector.matchLabels must be a non-empty map of strings")
        labels = None
    tps = spec.get("targetPorts")
    numbers = []
    if not isinstance(tps, list) or not 1 <= len(tps) <= 8:
        r.error(o, "spec.targetPorts must hold 1 to 8 ports")
    else:
        for i, tp in enumerate(tps):
            check_keys(r, o, f"spec.targetPorts[{i}]", tp, {"number"})
            n = (tp or {}).get("number") if isinstance(tp, dict) else None
            if not isinstance(n, int) or not 1 <= n <= 65535:
                r.error(o, f"spec.targetPorts[{i}].number must be 1-65535")
            elif n in numbers:
                r.error(o, f"spec.targetPorts[{i}].number {n} is listed twice")
            else:
                numbers.append(n)
    epr = spec.get("endpointPickerRef")
    check_keys(r, o, "spec.endpointPickerRef", epr, {"group", "kind", "name", "port", "failureMode"})
    if not isinstance(epr, dict) or not epr.get("name"):
        r.error(o, "spec.endpointPickerRef.name is required")
        epr = None
    else:
        port = (epr.get("port") or {}).get("number") if isinstance(epr.get("port"), dict) else None
        if epr.get("kind", "Service") == "Service" and (not isinstance(port, int) or not 1 <= port <= 65535):
            r.error(o, "spec.endpointPickerRef.port.number is required for a Service (1-65535)")
        if epr.get("failureMode", "FailClose") not in ("FailOpen", "FailClose"):
            r.error(o, "spec.endpointPickerRef.failureMode must be FailOpen or FailClose")
    # Its engines and its picker, in this render.
    ns = ns_of(o)
    if labels:
        engines = r.templates_matching(ns, labels)
        if not engines:
            r.error(o, f"spec.selector.matchLabels {labels} match no Pod template")
        for owner, _, pod in engines:
            if numbers and numbers[0] not in port_numbers(pod):
                r.error(o, f"targetPorts[0] {numbers[0]} is no container port of {owner['kind']}/{name_of(owner)}")
    if epr and epr.get("kind", "Service") == "Service" and epr.get("group", "") == "":
        svc = r.get("Service", ns, epr["name"])
        if svc is None:
            r.error(o, f"endpointPickerRef: no Service {epr['name']!r} in this render")
            return
        port = (epr.get("port") or {}).get("number")
        sp = [p for p in (svc.get("spec") or {}).get("ports") or [] if p.get("port") == port]
        if not sp:
            r.error(o, f"endpointPickerRef: Service {epr['name']} has no port {port}")
        elif sp[0].get("appProtocol") != "kubernetes.io/h2c":
            r.error(o, f"endpointPickerRef: Service {epr['name']} port {port} needs appProtocol kubernetes.io/h2c (gRPC)")
        pickers = [
            (owner, c) for owner, _, pod in r.templates_matching(ns, (svc.get("spec") or {}).get("selector") or {})
            for c in pod.get("containers") or [] if (c.get("args") or [None])[0] == "epp"
        ]
        if not pickers:
            r.error(o, f"endpointPickerRef: Service {epr['name']} selects no `kvroute epp` container")
        for owner, c in pickers:
            if arg_value(c.get("args") or [], "--pool-name") != name_of(o):
                r.error(owner, f"container {c.get('name')}: --pool-name is not {name_of(o)!r}, the InferencePool pointing at it")


# ---------------------------------------------------------------------------------------
# References between objects


def check_references(r):
    for o in r.objects:
        kind, ns, spec = o.get("kind"), ns_of(o), o.get("spec") or {}
        if kind in WORKLOADS and kind != "Job":
            ml = (spec.get("selector") or {}).get("matchLabels") or {}
            tl = (((spec.get("template") or {}).get("metadata") or {}).get("labels") or {})
            if not ml or not labels_match(ml, tl):
                r.error(o, f"spec.selector.matchLabels {ml} do not match its own Pod template's labels {tl}")
        if kind == "Service" and spec.get("selector"):
            matched = r.templates_matching(ns, spec["selector"])
            if not matched:
                r.error(o, f"selector {spec['selector']} matches no Pod template in this render")
            for p in spec.get("ports") or []:
                tp = p.get("targetPort", p.get("port"))
                for owner, _, pod in matched:
                    if isinstance(tp, str) and tp not in port_names(pod):
                        r.error(o, f"port {p.get('name')}: targetPort {tp!r} is no container port name of {owner['kind']}/{name_of(owner)}")
                    if isinstance(tp, int) and tp not in port_numbers(pod):
                        r.error(o, f"port {p.get('name')}: targetPort {tp} is no container port of {owner['kind']}/{name_of(owner)}")
        if kind == "PodDisruptionBudget":
            ml = (spec.get("selector") or {}).get("matchLabels") or {}
            if not r.templates_matching(ns, ml):
                r.error(o, f"selector {ml} matches no Pod template")
        if kind == "ServiceMonitor":
            ml = (spec.get("selector") or {}).get("matchLabels") or {}
            svcs = [s for s in r.objects if s.get("kind") == "Service" and ns_of(s) == ns
                    and labels_match(ml, (s.get("metadata") or {}).get("labels") or {})]
            if not svcs:
                r.error(o, f"selector {ml} matches no Service's labels in this render")
            for ep in spec.get("endpoints") or []:
                for s in svcs:
                    if ep.get("port") and ep["port"] not in {p.get("name") for p in (s.get("spec") or {}).get("ports") or []}:
                        r.error(o, f"endpoint port {ep['port']!r} is no port name of Service {name_of(s)}")
        if kind == "RoleBinding":
            ref = o.get("roleRef") or {}
            if ref.get("kind") == "Role" and r.get("Role", ns, ref.get("name")) is None:
                r.error(o, f"roleRef: no Role {ref.get('name')!r} in this render")
            for s in o.get("subjects") or []:
                if s.get("kind") == "ServiceAccount" and \
                        r.get("ServiceAccount", s.get("namespace", ns), s.get("name")) is None:
                    r.error(o, f"subject: no ServiceAccount {s.get('name')!r} in this render")
    for owner, meta, pod in r.templates:
        check_pod(r, owner, pod)


def check_pod(r, owner, pod):
    ns = ns_of(owner)
    sa = pod.get("serviceAccountName")
    if sa and sa != "default" and r.get("ServiceAccount", ns, sa) is None:
        r.error(owner, f"serviceAccountName {sa!r}: no such ServiceAccount in this render")
    volumes = {v.get("name"): v for v in pod.get("volumes") or []}
    for v in volumes.values():
        cm, sec, pvc = v.get("configMap"), v.get("secret"), v.get("persistentVolumeClaim")
        if cm:
            obj = r.get("ConfigMap", ns, cm.get("name"))
            if obj is None and not cm.get("optional"):
                r.error(owner, f"volume {v['name']}: no ConfigMap {cm.get('name')!r} in this render")
            for it in cm.get("items") or []:
                if obj is not None and it.get("key") not in (obj.get("data") or {}):
                    r.error(owner, f"volume {v['name']}: ConfigMap {cm.get('name')} has no key {it.get('key')!r}")
        if sec and r.get("Secret", ns, sec.get("secretName")) is None and not sec.get("optional"):
            r.error(owner, f"volume {v['name']}: no Secret {sec.get('secretName')!r} in this render")
        if pvc and r.get("PersistentVolumeClaim", ns, pvc.get("claimName")) is None:
            r.error(owner, f"volume {v['name']}: no PersistentVolumeClaim {pvc.get('claimName')!r} in this render")
    for c in containers(pod):
        cname = c.get("name")
        names = {p.get("name") for p in c.get("ports") or []}
        numbers = {p.get("containerPort") for p in c.get("ports") or []}
        for m in c.get("volumeMounts") or []:
            if m.get("name") not in volumes:
                r.error(owner, f"container {cname}: volumeMount {m.get('name')!r} names no volume")
        env = {e.get("name"): e for e in c.get("env") or []}
        for e in env.values():
            ref = (e.get("valueFrom") or {})
            for key, kind, field in (("configMapKeyRef", "ConfigMap", "data"), ("secretKeyRef", "Secret", None)):
                kr = ref.get(key)
                if kr and not kr.get("optional"):
                    obj = r.get(kind, ns, kr.get("name"))
                    if obj is None:
                        r.error(owner, f"container {cname}: env {e['name']}: no {kind} {kr.get('name')!r} in this render")
                    elif field and kr.get("key") not in (obj.get(field) or {}):
                        r.error(owner, f"container {cname}: env {e['name']}: {kind} {kr.get('name')} has no key {kr.get('key')!r}")
        for ef in c.get("envFrom") or []:
            for key, kind in (("configMapRef", "ConfigMap"), ("secretRef", "Secret")):
                kr = ef.get(key)
                if kr and not kr.get("optional") and r.get(kind, ns, kr.get("name")) is None:
                    r.error(owner, f"container {cname}: envFrom: no {kind} {kr.get('name')!r} in this render")
        for word in list(c.get("command") or []) + list(c.get("args") or []):
            for var in VAR_REF.findall(str(word)):
                if var not in env:
                    r.error(owner, f"container {cname}: $({var}) is not defined in its env (it would stay literal)")
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            p = c.get(probe)
            if not p:
                continue
            for how in ("httpGet", "tcpSocket"):
                port = (p.get(how) or {}).get("port")
                if isinstance(port, str) and port not in names:
                    r.error(owner, f"container {cname}: {probe} port {port!r} is no port name of the container")
                if isinstance(port, int) and port not in numbers:
                    r.error(owner, f"container {cname}: {probe} port {port} is not declared by the container")
            grpc = p.get("grpc")
            if grpc and grpc.get("port") not in numbers:
                r.error(owner, f"container {cname}: {probe} gRPC port {grpc.get('port')} is not declared by the container")


# ---------------------------------------------------------------------------------------
# kvroute's own wiring


def kvroute_command(c):
    args = c.get("args") or []
    return args[0] if args and not c.get("command") and args[0] in ("serve", "epp", "relay", "worker", "loadgen") else None


def mounted_file(r, owner, pod, c, path):
    """The text of the ConfigMap key mounted at `path` in container c, else None."""
    volumes = {v.get("name"): v for v in pod.get("volumes") or []}
    for m in c.get("volumeMounts") or []:
        mp = m.get("mountPath", "").rstrip("/")
        if not path.startswith(mp + "/"):
            continue
        rest = path[len(mp) + 1:]
        if m.get("subPath"):
            continue
        cm = (volumes.get(m.get("name")) or {}).get("configMap")
        if not cm:
            return None
        obj = r.get("ConfigMap", ns_of(owner), cm.get("name"))
        if obj is None:
            return None
        key = rest
        for it in cm.get("items") or []:
            if it.get("path") == rest:
                key = it.get("key")
        return (obj.get("data") or {}).get(key)
    return None


def path_is_mounted(c, path):
    return any(path == m.get("mountPath") or path.startswith(m.get("mountPath", "").rstrip("/") + "/")
               for m in c.get("volumeMounts") or [])


def engine_facts(r, owner, pod):
    """Block size and model directory of an engine Pod template (None when unknown)."""
    for c in pod.get("containers") or []:
        args = [str(a) for a in c.get("args") or []]
        cmd = [str(a) for a in c.get("command") or []]
        whole = cmd + args
        if kvroute_command(c) == "worker":
            bs = arg_value(args, "--block-size")
            return (int(bs) if bs else None), "builtin" if arg_value(args, "--tokenizer") in (None, "builtin") else arg_value(args, "--tokenizer"), c
        if any("vllm" in w for w in cmd):
            bs = arg_value(whole, "--block-size")
            return (int(bs) if bs else None), arg_value(whole, "--model"), c
        if any("sglang" in w for w in cmd):
            bs = arg_value(whole, "--page-size")
            return (int(bs) if bs else None), arg_value(whole, "--model-path"), c
        if any("trtllm-serve" in w for w in cmd):
            model = args[1] if len(args) > 1 and args[0] == "serve" else (args[0] if args else None)
            opts = arg_value(whole, "--extra_llm_api_options") or arg_value(whole, "--config")
            bs = None
            text = mounted_file(r, owner, pod, c, opts) if opts else None
            if text is not None:
                bs = ((yaml.safe_load(text) or {}).get("kv_cache_config") or {}).get("tokens_per_block")
            return bs, model, c
    return None, None, None


def merge_tables(base, over):
    """`over` laid over `base` as kvroute layers its config files: tables key by key, other
    values replaced."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merge_tables(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def env_overrides(cfg, c):
    """`cfg` with the container's `KVROUTE__KEY__PATH` variables laid over it, as kvroute lays
    them (name order; a TOML value, else a string; a table merged)."""
    for e in sorted(c.get("env") or [], key=lambda e: e.get("name", "")):
        name = e.get("name", "")
        if not name.startswith("KVROUTE__") or "value" not in e:
            continue
        parts = [p.lower() for p in name[len("KVROUTE__"):].split("__")]
        try:
            value = tomllib.loads(f"v = {e['value']}")["v"]
        except tomllib.TOMLDecodeError:
            value = str(e["value"])
        at = cfg
        for p in parts[:-1]:
            at = at.setdefault(p, {}) if isinstance(at.get(p, {}), dict) else {}
        at[parts[-1]] = merge_tables(at[parts[-1]], value) if isinstance(value, dict) and isinstance(at.get(parts[-1]), dict) else value
    return cfg


def gateway_config(r, owner, pod, c):
    """The container's config files (every --config, layered in order) and its `KVROUTE__`
    variables as one dict, and each file's (path, text)."""
    args = c.get("args") or []
    paths = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--config"]
    paths += [a.split("=", 1)[1] for a in args if a.startswith("--config=")]
    if not paths:
        r.error(owner, f"container {c.get('name')}: no --config")
        return None, None
    merged, files = {}, []
    for path in paths:
        text = mounted_file(r, owner, pod, c, path)
        if text is None:
            r.error(owner, f"container {c.get('name')}: --config {path} is no key of a mounted ConfigMap in this render")
            return None, None
        try:
            merged = merge_tables(merged, tomllib.loads(text))
        except tomllib.TOMLDecodeError as e:
            r.error(owner, f"container {c.get('name')}: --config {path} is not TOML: {e}")
            return None, None
        files.append((path, text))
    return env_overrides(merged, c), files


def resolve(c, owner, word):
    """`$(VAR)` of a container's env resolved where the downward API says what it is."""
    env = {e.get("name"): e for e in c.get("env") or []}

    def one(m):
        e = env.get(m.group(1)) or {}
        if "value" in e:
            return str(e["value"])
        fp = ((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
        if fp == "metadata.namespace":
            return ns_of(owner) or "default"
        return m.group(0)
    return VAR_REF.sub(one, str(word))


def check_kvroute(r, allow_no_engines):
    services = {(ns_of(s), name_of(s)): s for s in r.objects if s.get("kind") == "Service"}

    def service_port(ns, url, scheme):
        m = re.fullmatch(scheme + r"://([A-Za-z0-9.-]+):(\d+)/?", url.strip())
        if not m:
            return f"{url!r} is not {scheme}://HOST:PORT"
        host, port = m.group(1), int(m.group(2))
        name, _, rest = host.partition(".")
        svc_ns = rest.split(".")[0] if rest else ns
        svc = services.get((svc_ns, name))
        if svc is None:
            return f"{url}: no Service {name!r} in this render"
        if port not in {p.get("port") for p in (svc.get("spec") or {}).get("ports") or []}:
            return f"{url}: Service {name} has no port {port}"
        return None

    for owner, meta, pod in r.templates:
        ns = ns_of(owner)
        for c in pod.get("containers") or []:
            cmd, args = kvroute_command(c), [str(a) for a in c.get("args") or []]
            if cmd == "relay":
                worker = arg_value(args, "--worker") or ""
                m = VAR_REF.fullmatch(worker)
                env = {e.get("name"): e for e in c.get("env") or []}
                fp = (((env.get(m.group(1)) or {}).get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath") if m else None
                if fp != "metadata.name":
                    r.error(owner, f"container {c.get('name')}: relay --worker must be the Pod's name (an env var from fieldRef metadata.name), got {worker!r}")
                if (meta.get("annotations") or {}).get("kvroute.io/events") != "nats":
                    r.error(owner, "a relay publishes this engine's events to NATS, but the Pod lacks the annotation kvroute.io/events: nats")
                for url in (arg_value(args, "--nats") or "nats://127.0.0.1:4222").split(","):
                    err = service_port(ns, url, "nats")
                    if err:
                        r.error(owner, f"container {c.get('name')}: --nats {err}")
            if cmd == "loadgen":
                target = arg_value(args, "--target") or "http://127.0.0.1:8000"
                err = service_port(ns, target, "http")
                if err:
                    r.error(owner, f"container {c.get('name')}: --target {err}")
            if cmd not in ("serve", "epp"):
                continue
            cfg, _ = gateway_config(r, owner, pod, c)
            if cfg is None:
                continue
            where = f"container {c.get('name')} ({cmd}) config"
            plane = cfg.get("plane")
            if plane is not None:
                for url in str(plane.get("url", "nats://127.0.0.1:4222")).split(","):
                    err = service_port(ns, url, "nats")
                    if err:
                        r.error(owner, f"{where}: [plane] url {err}")
            k8s = (cfg.get("discovery") or {}).get("kubernetes")
            if k8s is None:
                continue
            block_size = (cfg.get("router") or {}).get("block_size", 16)
            if cmd == "serve":
                want_ns = ns or "default"
                if k8s.get("namespace", "default") != want_ns:
                    r.error(owner, f"{where}: [discovery.kubernetes] namespace {k8s.get('namespace', 'default')!r} is not the Pod's namespace {want_ns!r}")
                labels = selector_labels(k8s.get("selector", ""))
                if not k8s.get("selector"):
                    r.error(owner, f"{where}: [discovery.kubernetes] selector is empty (every Pod of the namespace would be an engine)")
                    continue
                if labels is None:
                    r.error(owner, f"{where}: selector {k8s['selector']!r}: only k=v,... is checked here")
                    continue
                port = None
            else:
                pool_name = arg_value(args, "--pool-name")
                if not pool_name:
                    r.error(owner, f"{where}: kvroute epp without --pool-name")
                    continue
                pool_ns = resolve(c, owner, arg_value(args, "--pool-namespace") or "$(NAMESPACE)")
                pool = r.get("InferencePool", pool_ns, pool_name)
                if pool is None:
                    r.error(owner, f"{where}: --pool-name {pool_name!r}: no InferencePool of that name in namespace {pool_ns!r} of this render")
                    continue
                labels = ((pool.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
                port = (((pool.get("spec") or {}).get("targetPorts") or [{}])[0]).get("number")
            if labels_match(labels, meta.get("labels") or {}):
                r.error(owner, f"{where}: the engine selector {labels} matches the gateway's own Pods")
            engines = [t for t in r.templates_matching(ns, labels) if t[0] is not owner]
            if not engines:
                if not allow_no_engines:
                    r.error(owner, f"{where}: the engine selector {labels} matches no Pod template in this render")
                continue
            for eowner, emeta, epod in engines:
                ename = f"{eowner['kind']}/{name_of(eowner)}"
                notes = emeta.get("annotations") or {}
                if port is None and "kvroute.io/port" not in notes and k8s.get("port") is None and \
                        k8s.get("port_name", "http") not in port_names(epod):
                    r.error(owner, f"{where}: port_name {k8s.get('port_name', 'http')!r} is no container port name of {ename}")
                events = notes.get("kvroute.io/events")
                if events is None and k8s.get("events_port_name"):
                    for key in ("events_port_name", "replay_port_name"):
                        if k8s.get(key) and k8s[key] not in port_names(epod):
                            r.error(owner, f"{where}: {key} {k8s[key]!r} is no container port name of {ename}")
                elif events == "nats":
                    if plane is None:
                        r.error(owner, f"{where}: {ename} has kvroute.io/events: nats but the config has no [plane]")
                    if not any(kvroute_command(x) == "relay" for x in epod.get("containers") or []):
                        r.error(owner, f"{where}: {ename} has kvroute.io/events: nats but no relay container")
                elif events is None:
                    r.error(owner, f"{where}: {ename} has no event source (no kvroute.io/events, no events_port_name): it would be tracked approximately")
                bs, model, ec = engine_facts(r, eowner, epod)
                if ec is None:
                    r.error(owner, f"{where}: {ename} runs no engine this check knows (kvroute worker, vLLM, SGLang, TensorRT-LLM)")
                    continue
                if bs is None:
                    r.error(owner, f"{where}: the block size of {ename} is not written in its manifest (give it explicitly)")
                elif int(bs) != int(block_size):
                    r.error(owner, f"{where}: router.block_size {block_size} differs from the block size {bs} of {ename}")
                tok = cfg.get("tokenizer")
                if tok is None:
                    r.error(owner, f"{where}: no tokenizer: the gateway would route approximately")
                elif tok != "builtin" and not path_is_mounted(c, tok):
                    r.error(owner, f"{where}: tokenizer {tok!r} is on no volume mounted in the container")
                if tok is not None and str(tok).rstrip("/") != str(model).rstrip("/"):
                    what = "tokenizer" if kvroute_command(ec) == "worker" else "model directory"
                    r.error(owner, f"{where}: tokenizer {tok!r} is not the {what} {model!r} of {ename}")


# ---------------------------------------------------------------------------------------
# Starting the gateway and picker containers once


def run_configs(r, binary):
    """Dry-runs each serve/epp container's command with its config (`--print-config`)."""
    tmp = tempfile.mkdtemp(prefix="kvroute-manifests-")
    n = 0
    for owner, meta, pod in r.templates:
        for c in pod.get("containers") or []:
            cmd = kvroute_command(c)
            if cmd not in ("serve", "epp"):
                continue
            cfg, files = gateway_config(r, owner, pod, c)
            if cfg is None:
                continue
            tok = cfg.get("tokenizer")
            note = ""
            absent = tok and tok != "builtin" and not os.path.isdir(tok)
            if absent:
                note = f" (tokenizer {tok} absent here: builtin)"
            local = {}
            for mounted, text in files:
                if absent:
                    text = re.sub(r'(?m)^tokenizer\s*=.*$', 'tokenizer = "builtin"', text)
                local[mounted] = os.path.join(tmp, f"{n}.toml")
                n += 1
                with open(local[mounted], "w") as f:
                    f.write(text)
            args = [resolve(c, owner, a) for a in c.get("args") or []]
            for i, a in enumerate(args):
                if a == "--config" and i + 1 < len(args):
                    args[i + 1] = local.get(args[i + 1], args[i + 1])
                elif a.startswith("--config="):
                    mounted = a.split("=", 1)[1]
                    args[i] = "--config=" + local.get(mounted, mounted)
            env = dict(os.environ, RUST_LOG="error", RUST_BACKTRACE="0", KUBECONFIG=os.devnull)
            env = {k: v for k, v in env.items() if not k.startswith("KVROUTE__")}
            for e in c.get("env") or []:
                if "value" in e:
                    env[e["name"]] = str(e["value"])
                elif e.get("name"):
                    env[e["name"]] = resolve(c, owner, f"$({e['name']})")
            label = f"container {c.get('name')}: `kvroute {cmd}` with its config"
            try:
                p = subprocess.run([binary] + args + ["--print-config"], capture_output=True,
                                   env=env, cwd=tmp, timeout=30)
                ok = p.returncode == 0
                err = p.stderr.decode(errors="replace")
                if ok:
                    tomllib.loads(p.stdout.decode())
            except subprocess.TimeoutExpired:
                ok, err = False, "no answer within 30 s"
            except tomllib.TOMLDecodeError as e:
                ok, err = False, f"--print-config printed no TOML: {e}"
            if ok:
                print(f"  checked: {owner['kind']}/{name_of(owner)} {label}{note}")
            else:
                tail = "\n      ".join(err.strip().splitlines()[:12])
                r.error(owner, f"{label} is refused: {shlex.join([binary] + (c.get('args') or []))} --print-config\n      {tail}")
    shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("render", nargs="?")
    ap.add_argument("--allow-no-engines", action="store_true",
                    help="a gateway whose selector matches no engine of the render is fine (the base)")
    ap.add_argument("--kvroute", help="a kvroute binary: dry-run each gateway and picker with its config")
    ap.add_argument("--custom-kinds", action="store_true", help="print the custom kinds checked here")
    a = ap.parse_args()
    if a.custom_kinds:
        print(" ".join(f"{k}:{g}" for k, (g, _) in sorted(CUSTOM_KINDS.items())))
        return 0
    if not a.render:
        ap.error("a rendered manifest file is required")
    with open(a.render) as f:
        r = Render(list(yaml.safe_load_all(f)))
    check_custom_kinds(r)
    check_references(r)
    check_kvroute(r, a.allow_no_engines)
    if a.kvroute and not r.errors:
        run_configs(r, os.path.abspath(a.kvroute))
    for e in r.errors:
        print(f"  ERROR {e}")
    return 1 if r.errors else 0


if __name__ == "__main__":
    sys.exit(main())
