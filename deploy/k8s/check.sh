#!/usr/bin/env bash
# The container image and the Kubernetes manifests, checked offline (`make deploy-check`):
#
#   1. hadolint on the Dockerfile;
#   2. base/prometheusrule.yaml is what deploy/monitoring/rules.yml generates;
#   3. each overlay renders with `kubectl kustomize`;
#   4. each rendered object validates against the Kubernetes $K8S_VERSION schemas, strictly
#      (unknown fields fail), with kubernetes-validate. It has no schema for CRDs and only WARNs
#      about them, passing: the Prometheus Operator kinds listed in CRD_KINDS are expected and
#      checked by tests/unit/test_deploy_manifests.py instead; any other kind without a schema
#      (a typo, a new CRD) fails here;
#   5. promtool checks the rendered PrometheusRule's rules, and runs rules_test.yml against them.
#
#   deploy/k8s/check.sh              run the checks
#   deploy/k8s/check.sh sync-rules   regenerate base/prometheusrule.yaml after editing rules.yml
set -euo pipefail
cd "$(dirname "$0")/../.."

BIN=${BIN:-.venv/bin}
K8S_VERSION=1.30.0
OVERLAYS=(local-store s3)
CRD_KINDS=(
    "ServiceMonitor monitoring.coreos.com/v1"
    "PrometheusRule monitoring.coreos.com/v1"
    "AlertmanagerConfig monitoring.coreos.com/v1alpha1"
)
RULES=deploy/monitoring/rules.yml
RULE_RESOURCE=deploy/k8s/base/prometheusrule.yaml

# The PrometheusRule: rules.yml's `groups:` (comments included) under `spec:`.
render_rule_resource() {
    cat <<'EOF'
# GENERATED from deploy/monitoring/rules.yml by `deploy/k8s/check.sh sync-rules`: edit that
# file and regenerate; `make deploy-check` and the unit tests fail while the two differ.
#
# Prometheus Operator: the same alerts as deploy/monitoring/rules.yml. A Prometheus selects
# PrometheusRules by label (kube-prometheus-stack: ruleSelector, by default `release: <its Helm
# release>`); add that label in an overlay if yours needs it.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: controlplane
  labels:
    app.kubernetes.io/name: triton
    app.kubernetes.io/part-of: controlplane
spec:
EOF
    sed -n '/^groups:/,$p' "$RULES" | sed 's/^\(.\)/  \1/'
}

if [ "${1:-}" = sync-rules ]; then
    render_rule_resource >"$RULE_RESOURCE"
    echo "wrote $RULE_RESOURCE"
    exit 0
elif [ $# -gt 0 ]; then
    echo "usage: $0 [sync-rules]" >&2
    exit 2
fi

for tool in kubectl promtool; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        case $tool in
            kubectl) package=kubernetes-client ;;
            promtool) package=prometheus ;;
        esac
        echo "$tool not found on PATH: install the Debian package '$package', which ships it" >&2
        exit 1
    fi
done
for tool in hadolint kubernetes-validate python; do
    if [ ! -x "$BIN/$tool" ]; then
        echo "$BIN/$tool not found: run 'make install' (the test extra installs it)" >&2
        exit 1
    fi
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "== hadolint Dockerfile"
"$BIN/hadolint" Dockerfile

echo "== $RULE_RESOURCE is generated from $RULES"
if ! render_rule_resource | diff -u "$RULE_RESOURCE" -; then
    echo "$RULE_RESOURCE is stale: run 'deploy/k8s/check.sh sync-rules'" >&2
    exit 1
fi

for overlay in "${OVERLAYS[@]}"; do
    rendered=$work/$overlay.yaml
    echo "== kubectl kustomize deploy/k8s/overlays/$overlay"
    # The deprecation warnings for `bases` and `patchesStrategicMerge` are expected (see the
    # overlays' kustomization.yaml); anything else kustomize says is shown.
    if ! kubectl kustomize "deploy/k8s/overlays/$overlay" >"$rendered" 2>"$work/stderr"; then
        cat "$work/stderr" >&2
        exit 1
    fi
    grep -v -E "^# Warning: '(bases|patchesStrategicMerge)' is deprecated" "$work/stderr" >&2 || true

    echo "== kubernetes-validate --strict -k $K8S_VERSION ($overlay)"
    status=0
    "$BIN/kubernetes-validate" --strict --quiet -k "$K8S_VERSION" "$rendered" >"$work/validate" \
        || status=$?
    unexpected=0
    while IFS= read -r line; do
        case $line in
            "WARN "*"Couldn't find schema for kind "*)
                expected=0
                for crd in "${CRD_KINDS[@]}"; do
                    read -r kind api <<<"$crd"
                    if [[ $line == *"for kind $kind with api version $api for"* ]]; then
                        expected=1
                    fi
                done
                if [ $expected -eq 0 ]; then
                    echo "$line (not a kind this check knows: fix it, or add it to CRD_KINDS)" >&2
                    unexpected=1
                fi
                ;;
            *) echo "$line" >&2 ;;
        esac
    done <"$work/validate"
    if [ $status -ne 0 ] || [ $unexpected -ne 0 ]; then
        echo "deploy/k8s/overlays/$overlay does not validate against Kubernetes $K8S_VERSION" >&2
        exit 1
    fi
    echo "== promtool on the rendered PrometheusRule ($overlay)"
    mkdir -p "$work/rules-$overlay"
    "$BIN/python" - "$rendered" "$work/rules-$overlay/rules.yml" <<'EOF'
import sys

import yaml

# Go's YAML writes the string "=" bare, which PyYAML would read as its obscure `value` tag.
yaml.SafeLoader.add_constructor("tag:yaml.org,2002:value", yaml.SafeLoader.construct_scalar)
docs = [doc for doc in yaml.safe_load_all(open(sys.argv[1])) if doc]
rules = [doc for doc in docs if doc["kind"] == "PrometheusRule"]
if len(rules) != 1:
    sys.exit(f"expected one PrometheusRule in the rendered overlay, found {len(rules)}")
with open(sys.argv[2], "w") as out:
    yaml.safe_dump(rules[0]["spec"], out, sort_keys=False)
print(f"{len(docs)} objects rendered; the PrometheusRule's spec extracted")
EOF
    promtool check rules "$work/rules-$overlay/rules.yml"
    cp deploy/monitoring/rules_test.yml "$work/rules-$overlay/"
    promtool test rules "$work/rules-$overlay/rules_test.yml"
done
echo "deploy-check: ok"
