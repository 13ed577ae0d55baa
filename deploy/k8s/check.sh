#!/usr/bin/env bash
# The container image and the Kubernetes manifests, checked offline (`make deploy-check`):
#
#   1. hadolint on the Dockerfile;
#   2. base/prometheusrule.yaml and the Helm chart's files/prometheus-rules.yml are what
#      deploy/monitoring/rules.yml generates;
#   3. each overlay, alone and with each component (components/hpa, components/read-token),
#      renders with the kubectl 1.32 that `make install` puts in $BIN, and kustomize prints
#      nothing on stderr: any warning, a deprecated field included, fails;
#   4. the Helm chart (deploy/helm/controlplane) passes `helm lint --strict` and renders with
#      `helm template`, silently, with its default values and each example values file
#      (deploy/helm/check.sh);
#   5. each rendered object, of the overlays and of the chart, validates against the Kubernetes
#      $K8S_VERSION schemas, strictly (unknown fields fail), with kubernetes-validate. It has no
#      schema for CRDs and only WARNs about them, passing: the Prometheus Operator kinds listed
#      in CRD_KINDS are expected and checked by tests/unit/test_deploy_manifests.py and
#      tests/unit/test_helm_chart.py instead; any other kind without a schema (a typo, a new
#      CRD) fails here;
#   6. promtool checks each rendered PrometheusRule's rules, and runs rules_test.yml against
#      them: every overlay renders one; a chart rendering has one when its values turn it on.
#
#   deploy/k8s/check.sh              run the checks
#   deploy/k8s/check.sh sync-rules   regenerate base/prometheusrule.yaml and the chart's copy
#                                    after editing rules.yml
set -euo pipefail
cd "$(dirname "$0")/../.."

BIN=${BIN:-.venv/bin}
# The Kubernetes of the kubectl that renders (tools/k8s-tools.txt). kubernetes-validate 1.37.0
# (constraints.txt) bundles the schemas of 1.32 to 1.37. A release without 1.32 fails this check
# ("could not be validated") rather than validating against another version: then move both
# this and the kubectl on.
K8S_VERSION=1.32.0
OVERLAYS=(local-store s3)
COMPONENTS=(hpa read-token)
CRD_KINDS=(
    "ServiceMonitor monitoring.coreos.com/v1"
    "PrometheusRule monitoring.coreos.com/v1"
    "AlertmanagerConfig monitoring.coreos.com/v1alpha1"
)
RULES=deploy/monitoring/rules.yml
RULE_RESOURCE=deploy/k8s/base/prometheusrule.yaml
# The Helm chart's copy, which its templates/prometheusrule.yaml reads with .Files.Get.
CHART_RULES=deploy/helm/controlplane/files/prometheus-rules.yml

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

# The chart's copy: rules.yml's `groups:` (comments included) as is; the template indents it
# under the PrometheusRule's `spec:`.
render_chart_rules() {
    cat <<'EOF'
# GENERATED from deploy/monitoring/rules.yml by `deploy/k8s/check.sh sync-rules`: edit that
# file and regenerate; `make deploy-check` and the unit tests fail while the two differ.
# templates/prometheusrule.yaml puts this under the PrometheusRule's spec.
EOF
    sed -n '/^groups:/,$p' "$RULES"
}

if [ "${1:-}" = sync-rules ]; then
    render_rule_resource >"$RULE_RESOURCE"
    echo "wrote $RULE_RESOURCE"
    render_chart_rules >"$CHART_RULES"
    echo "wrote $CHART_RULES"
    exit 0
elif [ $# -gt 0 ]; then
    echo "usage: $0 [sync-rules]" >&2
    exit 2
fi

if ! command -v promtool >/dev/null 2>&1; then
    echo "promtool not found on PATH: install the Debian package 'prometheus', which ships it" >&2
    exit 1
fi
for tool in hadolint kubernetes-validate python kubectl; do
    if [ ! -x "$BIN/$tool" ]; then
        echo "$BIN/$tool not found: run 'make install' (it installs the test extra and kubectl)" >&2
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
echo "== $CHART_RULES is generated from $RULES"
if ! render_chart_rules | diff -u "$CHART_RULES" -; then
    echo "$CHART_RULES is stale: run 'deploy/k8s/check.sh sync-rules'" >&2
    exit 1
fi

# What a user renders: each overlay as shipped, and each overlay with a component it can opt
# into, through a kustomization of its own (kustomize takes only relative paths to them).
sources=()
for overlay in "${OVERLAYS[@]}"; do
    sources+=("deploy/k8s/overlays/$overlay")
    for component in "${COMPONENTS[@]}"; do
        dir=$work/$overlay+$component
        mkdir -p "$dir"
        {
            echo "apiVersion: kustomize.config.k8s.io/v1beta1"
            echo "kind: Kustomization"
            echo "resources: [$(realpath --relative-to="$dir" "deploy/k8s/overlays/$overlay")]"
            echo "components: [$(realpath --relative-to="$dir" "deploy/k8s/components/$component")]"
        } >"$dir/kustomization.yaml"
        sources+=("$dir")
    done
done

# Validate one rendering ($2, named $1) against the schemas, and run promtool on its
# PrometheusRule; $3 is "required" when it must have one, "optional" when it may have none.
check_rendered() {
    local target=$1 rendered=$2 rule=$3
    echo "== kubernetes-validate --strict -k $K8S_VERSION ($target)"
    local status=0 unexpected=0 line expected crd kind api
    "$BIN/kubernetes-validate" --strict --quiet -k "$K8S_VERSION" "$rendered" >"$work/validate" \
        || status=$?
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
        echo "$target does not validate against Kubernetes $K8S_VERSION" >&2
        exit 1
    fi
    echo "== promtool on the rendered PrometheusRule ($target)"
    mkdir -p "$work/rules-$target"
    "$BIN/python" - "$rendered" "$work/rules-$target/rules.yml" "$rule" <<'EOF'
import sys

import yaml

# Go's YAML writes the string "=" bare, which PyYAML would read as its obscure `value` tag.
yaml.SafeLoader.add_constructor("tag:yaml.org,2002:value", yaml.SafeLoader.construct_scalar)
docs = [doc for doc in yaml.safe_load_all(open(sys.argv[1])) if doc]
rules = [doc for doc in docs if doc["kind"] == "PrometheusRule"]
if not rules and sys.argv[3] == "optional":
    print(f"{len(docs)} objects rendered; no PrometheusRule (its values leave it out)")
    sys.exit(0)
if len(rules) != 1:
    sys.exit(f"expected one PrometheusRule in the rendering, found {len(rules)}")
with open(sys.argv[2], "w") as out:
    yaml.safe_dump(rules[0]["spec"], out, sort_keys=False)
print(f"{len(docs)} objects rendered; the PrometheusRule's spec extracted")
EOF
    if [ -s "$work/rules-$target/rules.yml" ]; then
        promtool check rules "$work/rules-$target/rules.yml"
        cp deploy/monitoring/rules_test.yml "$work/rules-$target/"
        promtool test rules "$work/rules-$target/rules_test.yml"
    fi
}

echo "== $("$BIN/kubectl" version --client | head -1)"
for source in "${sources[@]}"; do
    target=${source##*/}
    rendered=$work/$target.yaml
    echo "== kubectl kustomize $target"
    if ! "$BIN/kubectl" kustomize "$source" >"$rendered" 2>"$work/stderr"; then
        cat "$work/stderr" >&2
        exit 1
    fi
    if [ -s "$work/stderr" ]; then
        cat "$work/stderr" >&2
        echo "kustomize printed the above for $target: fix the manifests until it prints nothing" >&2
        exit 1
    fi
    check_rendered "$target" "$rendered" required
done

BIN=$BIN deploy/helm/check.sh "$work/helm"
for rendered in "$work"/helm/helm-*.yaml; do
    check_rendered "$(basename "$rendered" .yaml)" "$rendered" optional
done
echo "deploy-check: ok"
