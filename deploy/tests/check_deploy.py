#!/usr/bin/env python3
"""Consistency checks of deploy/ that neither promtool nor
kubernetes-validate can make (run by `cargo xtask test`, step deploy-sync):

- prometheusrule.yaml is prometheus-rules.yaml wrapped in a PrometheusRule,
  byte for byte as generated here (`--write` regenerates it), its groups
  are the rule file's groups, and `promtool check rules` accepts the groups
  extracted from it;
- daemonset-privileged.yaml is daemonset.yaml except for the container's
  securityContext (privileged: true there; drop ALL plus a few capabilities
  here, at least those that loading needs, and no privilege escalation);
- the ConfigMap's config.toml parses, has the keys the DaemonSet relies on,
  and its textfile_dir is the directory the DaemonSet mounts and probes.

Usage: python3 deploy/tests/check_deploy.py [--write]
Needs PyYAML (a dependency of kubernetes-validate) and promtool.
"""

import copy
import os
import subprocess
import sys
import tempfile

import yaml

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    tomllib = None

DEPLOY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RULES = os.path.join(DEPLOY, "prometheus-rules.yaml")
PROMETHEUSRULE = os.path.join(DEPLOY, "prometheusrule.yaml")
DAEMONSET = os.path.join(DEPLOY, "daemonset.yaml")
PRIVILEGED = os.path.join(DEPLOY, "daemonset-privileged.yaml")
CONFIGMAP = os.path.join(DEPLOY, "configmap.yaml")

PROMETHEUSRULE_HEADER = """\
# GENERATED from prometheus-rules.yaml by
#   python3 deploy/tests/check_deploy.py --write
# Edit prometheus-rules.yaml (comments and assumptions are there), not this
# file: `cargo xtask test` fails while the two differ.
#
# The observer's rules for prometheus-operator (kube-prometheus,
# kube-prometheus-stack): a PrometheusRule with the same groups as the plain
# rule file. A Prometheus picks it up only if its ruleSelector and
# ruleNamespaceSelector match: kube-prometheus-stack, for one, selects rules
# labelled `release: <its Helm release name>` by default; give it that label
# (`kubectl -n observer label prometheusrule observer release=<name>`, or a
# kustomize patch) rather than editing this generated file.
#
#   kubectl apply -f deploy/prometheusrule.yaml
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: observer
  namespace: observer
  labels:
    app.kubernetes.io/name: observer
spec:
"""

# Keys of config.toml that daemonset.yaml and the alerts rely on.
CONFIG_KEYS = {
    "interfaces",
    "interval",
    "textfile_dir",
    "max_peers",
    "allow_set_refresh",
    "allow_sets",
    "allow_cidrs",
    "xdp_mode",
}
# Capabilities the unprivileged DaemonSet may add (see its comments).
ALLOWED_CAPS = {"BPF", "NET_ADMIN", "PERFMON", "NET_RAW", "SYS_CHROOT"}
# What loading and attaching need (the observer's preflight asks for them).
START_CAPS = {"BPF", "NET_ADMIN", "PERFMON"}

failures = []


def fail(message):
    failures.append(message)
    print(f"FAIL: {message}")


def ok(message):
    print(f"ok: {message}")


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def rel(path):
    return os.path.relpath(path, os.path.dirname(DEPLOY))


def generate_prometheusrule(rules_text):
    """The rule file from its `groups:` line on, indented under `spec:`.

    The rule file's leading comment (usage of the plain file) is left out;
    comments inside the groups are kept. Indenting every line by the same
    amount keeps block scalars (`expr: |`) intact."""
    lines = rules_text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("groups:")), None)
    if start is None:
        raise SystemExit(f"{rel(RULES)} has no top-level `groups:` line")
    body = "".join(f"  {line}\n" if line.strip() else "\n" for line in lines[start:])
    return PROMETHEUSRULE_HEADER + body


def check_prometheusrule(write):
    rules_text = read(RULES)
    generated = generate_prometheusrule(rules_text)
    if write:
        with open(PROMETHEUSRULE, "w", encoding="utf-8") as f:
            f.write(generated)
        ok(f"wrote {rel(PROMETHEUSRULE)}")
    current = read(PROMETHEUSRULE) if os.path.exists(PROMETHEUSRULE) else ""
    if current != generated:
        fail(
            f"{rel(PROMETHEUSRULE)} is not generated from {rel(RULES)}: "
            "run `python3 deploy/tests/check_deploy.py --write`"
        )
        return
    rules = yaml.safe_load(rules_text)
    wrapped = yaml.safe_load(current)
    if wrapped.get("apiVersion") != "monitoring.coreos.com/v1" or wrapped.get("kind") != "PrometheusRule":
        fail(f"{rel(PROMETHEUSRULE)} is not a monitoring.coreos.com/v1 PrometheusRule")
    if set(rules) != {"groups"} or wrapped.get("spec") != rules:
        fail(f"the groups of {rel(PROMETHEUSRULE)} differ from {rel(RULES)}")
        return
    ok(f"{rel(PROMETHEUSRULE)} wraps the groups of {rel(RULES)}")
    # What prometheus-operator hands to Prometheus is spec: check that
    # extracted copy with promtool too.
    with tempfile.TemporaryDirectory() as tmp:
        extracted = os.path.join(tmp, "prometheusrule-spec.yaml")
        with open(extracted, "w", encoding="utf-8") as f:
            yaml.safe_dump(wrapped["spec"], f, sort_keys=False)
        result = subprocess.run(
            ["promtool", "check", "rules", extracted],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            fail(f"promtool check rules on the spec of {rel(PROMETHEUSRULE)}:\n{result.stdout}{result.stderr}")
        else:
            ok(f"promtool check rules accepts the spec of {rel(PROMETHEUSRULE)}")


def load_all(path):
    return [doc for doc in yaml.safe_load_all(read(path)) if doc is not None]


def daemonset_of(docs, path):
    found = [d for d in docs if d.get("kind") == "DaemonSet"]
    if len(found) != 1:
        raise SystemExit(f"{rel(path)}: expected one DaemonSet, found {len(found)}")
    return found[0]


def containers(daemonset):
    return daemonset["spec"]["template"]["spec"]["containers"]


def check_daemonsets():
    plain_docs = load_all(DAEMONSET)
    privileged_docs = load_all(PRIVILEGED)
    plain = daemonset_of(plain_docs, DAEMONSET)
    privileged = daemonset_of(privileged_docs, PRIVILEGED)

    for c in containers(plain):
        sc = c.get("securityContext", {})
        caps = sc.get("capabilities", {})
        if sc.get("privileged") or caps.get("drop") != ["ALL"]:
            fail(f"{rel(DAEMONSET)}: container {c['name']} must drop ALL capabilities and not be privileged")
        extra = set(caps.get("add", [])) - ALLOWED_CAPS
        if extra:
            fail(f"{rel(DAEMONSET)}: container {c['name']} adds unexpected capabilities {sorted(extra)}")
        missing = START_CAPS - set(caps.get("add", []))
        if missing:
            fail(f"{rel(DAEMONSET)}: container {c['name']} lacks {sorted(missing)}, needed to load and attach")
        if sc.get("allowPrivilegeEscalation") is not False:
            fail(f"{rel(DAEMONSET)}: container {c['name']} must set allowPrivilegeEscalation: false (no_new_privs)")
        if not sc.get("readOnlyRootFilesystem"):
            fail(f"{rel(DAEMONSET)}: container {c['name']} must have a read-only root filesystem")
    for c in containers(privileged):
        if c.get("securityContext", {}).get("privileged") is not True:
            fail(f"{rel(PRIVILEGED)}: container {c['name']} is not privileged")

    def without_security_context(docs):
        docs = copy.deepcopy(docs)
        for doc in docs:
            if doc.get("kind") == "DaemonSet":
                for c in containers(doc):
                    c.pop("securityContext", None)
        return docs

    if without_security_context(plain_docs) != without_security_context(privileged_docs):
        fail(f"{rel(PRIVILEGED)} differs from {rel(DAEMONSET)} in more than the containers' securityContext")
    else:
        ok(f"{rel(PRIVILEGED)} is {rel(DAEMONSET)} with another securityContext")
    return plain


def check_config(daemonset):
    configmaps = [d for d in load_all(CONFIGMAP) if d.get("kind") == "ConfigMap"]
    if len(configmaps) != 1:
        fail(f"{rel(CONFIGMAP)}: expected one ConfigMap")
        return
    configmap = configmaps[0]
    pod = daemonset["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    container = containers(daemonset)[0]
    mounts = {m["name"]: m for m in container["volumeMounts"]}

    config_volumes = [n for n, v in volumes.items() if v.get("configMap", {}).get("name") == configmap["metadata"]["name"]]
    if configmap["metadata"].get("namespace") != daemonset["metadata"].get("namespace") or len(config_volumes) != 1:
        fail(f"the DaemonSet does not mount ConfigMap {configmap['metadata']['name']} of its namespace")
        return
    config_dir = mounts[config_volumes[0]]["mountPath"]
    command = container.get("command", []) + container.get("args", [])
    config_path = None
    if "--config" in command[:-1]:
        config_path = command[command.index("--config") + 1]
    if config_path is None or os.path.dirname(config_path) != config_dir:
        fail(f"the DaemonSet's --config {config_path} is not in the ConfigMap's mount {config_dir}")
    elif os.path.basename(config_path) not in configmap["data"]:
        fail(f"the ConfigMap has no key {os.path.basename(config_path)}")

    text = configmap["data"].get("config.toml", "")
    if tomllib is None:
        print("skip: config.toml not parsed (Python < 3.11 has no tomllib)")
        return
    try:
        config = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        fail(f"{rel(CONFIGMAP)}: config.toml does not parse: {e}")
        return
    missing = CONFIG_KEYS - set(config)
    if missing:
        fail(f"{rel(CONFIGMAP)}: config.toml lacks {sorted(missing)}")
        return

    textfile_dir = config["textfile_dir"]
    textfile_mounts = [m for m in container["volumeMounts"] if m["mountPath"] == textfile_dir]
    if len(textfile_mounts) != 1:
        fail(f"the DaemonSet mounts nothing at textfile_dir {textfile_dir}")
    else:
        volume = volumes[textfile_mounts[0]["name"]]
        if volume.get("hostPath", {}).get("path") != textfile_dir:
            fail(f"the volume at {textfile_dir} is not the host's {textfile_dir}")
        if textfile_mounts[0].get("readOnly"):
            fail(f"the textfile directory {textfile_dir} is mounted read-only")
    # The probes run `observer health --textfile-dir DIR` (no shell in the
    # image): DIR must be textfile_dir.
    for probe in ("startupProbe", "livenessProbe"):
        command = container.get(probe, {}).get("exec", {}).get("command", [])
        expected = ["observer", "health", "--textfile-dir", textfile_dir]
        if command[: len(expected)] != expected:
            fail(f"the DaemonSet's {probe} is not `{' '.join(expected)} ...`: {command}")
    ok(f"config.toml, its mount, --config, the textfile mount and the probes agree ({textfile_dir})")


def main():
    write = sys.argv[1:] == ["--write"]
    if sys.argv[1:] and not write:
        raise SystemExit(__doc__)
    check_prometheusrule(write)
    daemonset = check_daemonsets()
    check_config(daemonset)
    if failures:
        print(f"deploy checks: {len(failures)} failed")
        sys.exit(1)
    print("deploy checks: all passed")


if __name__ == "__main__":
    main()
