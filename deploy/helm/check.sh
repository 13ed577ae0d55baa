#!/usr/bin/env bash
# The Helm chart, linted and rendered offline; part of `make deploy-check`:
#
#   1. `helm lint --strict` (a warning fails) with the default values and with each example
#      values file in controlplane/examples/;
#   2. `helm template` of the same, in the namespace the overlays use; helm must print nothing on
#      stderr (a deprecation or a coalesce warning fails), and a values file that the chart
#      refuses fails with the chart's message.
#
# Each rendering is written to OUTDIR/helm-<values>.yaml. deploy/k8s/check.sh calls this and then
# validates every file written there exactly as it validates the overlays (the Kubernetes
# schemas, strictly; the Prometheus Operator kinds; promtool on a PrometheusRule), so the chart
# and the overlays pass the same gate. tests/unit/test_helm_chart.py checks what the renderings
# say.
#
#   deploy/helm/check.sh OUTDIR
set -euo pipefail
cd "$(dirname "$0")/../.."

BIN=${BIN:-.venv/bin}
CHART=deploy/helm/controlplane
RELEASE=controlplane
NAMESPACE=triton

if [ $# -ne 1 ]; then
    echo "usage: $0 OUTDIR   (deploy/k8s/check.sh runs it and validates what it renders)" >&2
    exit 2
fi
out=$1
mkdir -p "$out"
if [ ! -x "$BIN/helm" ]; then
    echo "$BIN/helm not found: run 'make install' (tools/install-k8s-tools.py puts it there)" >&2
    exit 1
fi

# "default" is the chart's values.yaml alone; the others add one example file each.
values=(default)
for example in "$CHART"/examples/*.yaml; do
    values+=("$example")
done

echo "== $("$BIN/helm" version --short)"
for source in "${values[@]}"; do
    args=()
    name=default
    if [ "$source" != default ]; then
        args=(--values "$source")
        name=$(basename "$source" .yaml)
    fi

    echo "== helm lint --strict ($name)"
    if ! "$BIN/helm" lint --strict "$CHART" "${args[@]}" >"$out/lint" 2>"$out/stderr"; then
        cat "$out/lint" "$out/stderr" >&2
        echo "helm lint fails for $name" >&2
        exit 1
    fi
    if [ -s "$out/stderr" ] || grep -E '^\[(WARNING|ERROR)\]' "$out/lint" >&2; then
        cat "$out/stderr" >&2
        echo "helm lint warns for $name: fix the chart until it prints nothing but [INFO]" >&2
        exit 1
    fi

    echo "== helm template ($name)"
    rendered=$out/helm-$name.yaml
    if ! "$BIN/helm" template "$RELEASE" "$CHART" --namespace "$NAMESPACE" "${args[@]}" \
        >"$rendered" 2>"$out/stderr"; then
        cat "$out/stderr" >&2
        echo "helm template fails for $name" >&2
        exit 1
    fi
    if [ -s "$out/stderr" ]; then
        cat "$out/stderr" >&2
        echo "helm template printed the above for $name: fix the chart until it prints nothing" >&2
        exit 1
    fi
done
rm -f "$out/lint" "$out/stderr"
