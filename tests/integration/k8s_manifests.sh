# SPDX-License-Identifier: Apache-2.0
# The Kubernetes manifests (deploy/k8s), with a kit made by fedbox-provision
# from deploy/k8s/hosts.k8s, pass the offline validator
# (deploy/k8s/validate: kubernetes-models' compiled Kubernetes OpenAPI
# schemas, unknown fields and dangling references refused); the validator
# refuses broken copies; where kubectl is installed, its kustomize build of
# the same folder passes too and holds the same objects. Skipped when the
# validator's npm packages are absent (scripts/bootstrap k8s).
source tests/integration/lib.sh
V=deploy/k8s/validate
command -v node >/dev/null || skip "no node (scripts/bootstrap k8s)"
[ -d "$V/node_modules/kubernetes-models" ] ||
	skip "no $V/node_modules (scripts/bootstrap k8s installs them)"

mkdir -p "$T/k8s"
cp deploy/k8s/*.yaml deploy/k8s/hosts.k8s "$T/k8s/"
scripts/fedbox-provision --keygen "$B/fedbox-keygen" -o "$T/k8s/kit" \
	deploy/k8s/hosts.k8s >/dev/null || fail "fedbox-provision failed"
node "$V/validate.mjs" "$T/k8s" >"$T/v.out" 2>&1 || { cat "$T/v.out"; fail "manifests invalid"; }
cat "$T/v.out"
grep -q "^valid: 9 objects" "$T/v.out" || fail "expected 9 objects"
for kind in "1 StatefulSet" "1 Deployment" "2 Service" "2 ConfigMap" "2 Secret"; do
	grep -q "$kind" "$T/v.out" || fail "no $kind in the manifests"
done
grep -q "nvidia.com/gpu: 1" deploy/k8s/worker.yaml || fail "the worker asks for no GPU"
grep -q "volumeClaimTemplates:" deploy/k8s/coordinator.yaml || fail "no PVC for the coordinator"

# Broken copies are refused, each for its own reason.
broken() { # NAME SED-EXPR FILE EXPECTED
	rm -rf "$T/b" && cp -r "$T/k8s" "$T/b"
	sed -i "$2" "$T/b/$3"
	if node "$V/validate.mjs" "$T/b" >"$T/b.out" 2>&1; then
		fail "$1: the validator passed a broken manifest"
	fi
	grep -q "$4" "$T/b.out" || fail "$1: expected '$4' in: $(cat "$T/b.out")"
	echo "refused ($1): $(grep -m1 INVALID "$T/b.out")"
}
broken "typo" '0,/          resources:/s//          resource:/' coordinator.yaml \
	"unknown field spec.template.spec.containers\[0\].resource"
broken "type" 's/replicas: 1/replicas: "one"/' coordinator.yaml "replicas must be integer"
broken "secret" 's/name: fedbox-worker-box-0-keys/name: nope/' worker.yaml \
	"names Secret nope, which is not defined"
broken "port" 's/targetPort: fedbox-lane1/targetPort: lane-one/' coordinator.yaml \
	"targetPort lane-one is no container port"
broken "kit" 's|kit/hub/keys/allowlist|kit/hub/keys/missing|' kustomization.yaml \
	"does not exist"

if command -v kubectl >/dev/null && kubectl kustomize "$T/k8s" >"$T/rendered.yaml" 2>"$T/kz.err"; then
	node "$V/validate.mjs" "$T/rendered.yaml" >"$T/r.out" 2>&1 ||
		{ cat "$T/r.out"; fail "kubectl kustomize output invalid"; }
	tail -1 "$T/r.out"
	grep -q "^valid: 9 objects" "$T/r.out" || fail "kubectl kustomize gave another set of objects"
else
	echo "kubectl kustomize not run: $(command -v kubectl >/dev/null && head -1 "$T/kz.err" || echo 'no kubectl')"
fi
echo PASS
