#!/usr/bin/env bash
# Offline checks of everything under deploy/ (no cluster, no build, no image needed):
#   1. kubectl kustomize renders every overlay (dev, production, hpa) and the examples (the
#      trainer Job, the PyTorch DDP Job, the dev cluster with python-ops workers);
#   2. every rendered object validates against the Kubernetes and CRD schemas (KEDA, Prometheus
#      operator, cert-manager) with no unknown field; selectors match labels, named ports exist,
#      references resolve, pods are locked down, autoscaled Deployments set no replicas
#      (deploy/checks/validate.mjs, itself tested by node --test); every overlay but dev runs a
#      registry-qualified, tagged image and `kustomize edit set image sluice=REG/sluice:TAG`
#      takes effect in each overlay (deploy/checks/images.py);
#      the worker autoscalers' replica bounds are the dispatcher's --min/--max-workers
#      (deploy/checks/scale_bounds.py);
#   3. prometheusrule.yaml is the rendering of rules/sluice.rules.yaml; promtool check rules and
#      promtool test rules (every alert fires and stays quiet);
#   4. every Grafana dashboard expression is evaluated by a real Prometheus.
#
#   deploy/check.sh
#   KUBECTL=/path/to/kubectl deploy/check.sh
#
# Needs (docs/deploy.md, "What CI machines must provide"):
#   - kubectl >= 1.27 (built-in kustomize v5; checked with 1.32.4). Not from Debian: Debian 12's
#     kubernetes-client is 1.20 (kustomize v2), too old for these manifests;
#   - node >= 20 with the npm that comes with it (once, the npm registry for
#     deploy/checks/node_modules). Not from Debian: Debian 12's nodejs is 18 and its npm package
#     depends on that nodejs;
#   - promtool and prometheus, python3-yaml: Debian's packages, scripts/bootstrap.sh installs them.
#
# A missing tool is an error, never a skip. Ends with "deploy checks: N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."

passed=0
failed=0
out=$(mktemp -d /tmp/sluice-deploy-check-XXXXXX)
trap 'rm -rf "$out"' EXIT

run() {  # run NAME COMMAND...: one check, its output shown only when it fails
  local name=$1; shift
  local t0=$SECONDS
  if "$@" >"$out/log" 2>&1; then
    passed=$((passed + 1))
    echo "ok    $name ($((SECONDS - t0))s)"
  else
    failed=$((failed + 1))
    echo "FAIL  $name"
    sed 's/^/      /' "$out/log"
  fi
}

need() {  # need TOOL HINT: fail loudly (and stop) when a tool is missing
  if ! command -v "$1" >/dev/null 2>&1; then
    echo "deploy/check.sh: ERROR: $1 not found. $2" >&2
    echo "deploy checks: $passed passed, $((failed + 1)) failed"
    exit 1
  fi
}

kubectl=${KUBECTL:-kubectl}
no_debian_kubectl="Debian 12 has no usable kubectl (its kubernetes-client package is 1.20, kustomize v2: \
too old): install a kubectl release >= 1.27 from the Kubernetes project's own packages, or set \
KUBECTL=/path/to/kubectl. The manifests cannot be rendered without it."
no_debian_node="Install Node.js >= 20 with its npm (a nodejs 20.x or newer build that bundles npm). \
Debian 12's nodejs (18) is too old and its npm package pulls that nodejs in: do not apt-get them."
need "$kubectl" "$no_debian_kubectl"
need node "$no_debian_node"
need npm "npm comes with the Node.js >= 20 build. $no_debian_node"
need promtool "apt-get install prometheus (scripts/bootstrap.sh installs it)."
need prometheus "apt-get install prometheus (scripts/bootstrap.sh installs it)."
need /usr/bin/python3 "apt-get install python3 python3-yaml (Debian's python3: the checks import yaml from it)."
node_major=$(node -p 'process.versions.node.split(".")[0]')
if ((node_major < 20)); then
  echo "deploy/check.sh: ERROR: node $(node --version) is too old: deploy/checks needs node >= 20. $no_debian_node" >&2
  echo "deploy checks: $passed passed, $((failed + 1)) failed"
  exit 1
fi
kustomize_major=$("$kubectl" version --client 2>/dev/null | sed -n 's/^Kustomize Version: v\([0-9]*\).*/\1/p')
if [[ -z "$kustomize_major" ]] || ((kustomize_major < 5)); then
  echo "deploy/check.sh: ERROR: $("$kubectl" version --client 2>&1 | head -1) has kustomize" \
    "${kustomize_major:-(none reported)}, these manifests need kustomize v5. $no_debian_kubectl" >&2
  echo "deploy checks: $passed passed, $((failed + 1)) failed"
  exit 1
fi
echo "== deploy checks with $("$kubectl" version --client 2>/dev/null | head -1), node $(node --version), $(promtool --version 2>&1 | head -1 | cut -d' ' -f1-3)"

# The checker's npm packages, exactly as package-lock.json pins them.
if [[ ! -d deploy/checks/node_modules ]] ||
   ! cmp -s deploy/checks/package-lock.json deploy/checks/node_modules/.package-lock.json.sluice; then
  run "npm ci (deploy/checks)" bash -c 'cd deploy/checks && npm ci --no-audit --no-fund --loglevel=error &&
    cp package-lock.json node_modules/.package-lock.json.sluice'
fi

# 1. Render.
render() { "$kubectl" kustomize "$1" >"$2"; }
for overlay in dev production hpa; do
  run "kustomize overlays/$overlay" render "deploy/kubernetes/overlays/$overlay" "$out/$overlay.yaml"
done
run "kustomize examples/trainer" render deploy/kubernetes/examples/trainer "$out/trainer.yaml"
run "kustomize examples/pytorch-ddp" render deploy/kubernetes/examples/pytorch-ddp "$out/pytorch-ddp.yaml"
run "kustomize examples/python-ops" render deploy/kubernetes/examples/python-ops "$out/python-ops.yaml"
run "examples/pytorch-ddp/train.py parses" /usr/bin/python3 -c \
  'import ast, sys; ast.parse(open(sys.argv[1]).read(), sys.argv[1])' \
  deploy/kubernetes/examples/pytorch-ddp/train.py
run "kustomize deploy/monitoring" render deploy/monitoring "$out/monitoring.yaml"

# 2. Schemas, unknown fields, selectors, ports, references. Each example is checked with the
# overlay it is applied next to: the trainer Job with dev, the PyTorch DDP Job with production.
run "schemas and cross-references" node deploy/checks/validate.mjs \
  "dev=$out/dev.yaml,$out/trainer.yaml" "production=$out/production.yaml,$out/pytorch-ddp.yaml" \
  "hpa=$out/hpa.yaml" "python-ops=$out/python-ops.yaml"
run "validate.mjs catches what it claims (node --test)" env KUBECTL="$kubectl" \
  node --test deploy/checks/test/
run "images: registry-qualified and tagged outside dev; kustomize edit set image works" \
  /usr/bin/python3 deploy/checks/images.py "$kubectl" deploy/kubernetes dev production hpa
run "images.py catches what it claims" /usr/bin/python3 deploy/checks/test/images_test.py "$kubectl"
run "autoscalers' replica bounds = the dispatcher's --min/--max-workers" /usr/bin/python3 \
  deploy/checks/scale_bounds.py "$out/production.yaml" "$out/hpa.yaml"
run "prometheus-adapter values parse" /usr/bin/python3 -c \
  'import sys, yaml; r = yaml.safe_load(open(sys.argv[1]))["rules"]["external"]; assert r and r[0]["name"]["as"] == "sluice_desired_workers", r' \
  deploy/kubernetes/overlays/hpa/prometheus-adapter-values.yaml

# 3. Rules.
run "prometheusrule.yaml is up to date" /usr/bin/python3 deploy/monitoring/render-prometheusrule.py --check
run "promtool check rules" promtool check rules deploy/monitoring/rules/sluice.rules.yaml
run "promtool test rules" promtool test rules deploy/monitoring/rules/sluice.rules.test.yaml

# 4. Dashboard.
run "dashboard JSON parses" /usr/bin/python3 -m json.tool deploy/monitoring/dashboards/sluice.json
run "dashboard queries evaluate in a real Prometheus" /usr/bin/python3 tests/deploy/dashboard_check.py

echo "deploy checks: $passed passed, $failed failed"
((failed == 0))
