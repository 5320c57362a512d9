# SPDX-License-Identifier: Apache-2.0
# The container images and deploy/compose.yaml: deploy/podman-federation
# makes a bookworm base (debootstrap, podman import), builds the image of
# deploy/Dockerfile (and with FB_DEPLOY_CUDA=1 the CUDA worker image),
# provisions kits and runs a coordinator and two workers as containers on a
# podman network until 3 rounds commit; this checks what it printed.
source tests/deploy/lib.sh
need_root "rootful podman, debootstrap"
for t in podman podman-compose debootstrap; do
	command -v "$t" >/dev/null || skip "no $t (scripts/bootstrap deploy installs it)"
done
args=()
[ "${FB_DEPLOY_CUDA:-0}" = 1 ] && args+=(--cuda)
deploy/podman-federation "${args[@]}" >"$T/pf.out" 2>&1 || {
	tail -30 "$T/pf.out"
	grep -q "no runtime could start a container" "$T/pf.out" &&
		skip "podman cannot start containers here: $(grep -m1 'cannot start' "$T/pf.out")"
	fail "deploy/podman-federation failed"
}
cat "$T/pf.out"
grep -q "runtime image has no compiler; runs as fedbox" "$T/pf.out" || fail "runtime image check missing"
[ "$(grep -c '^round   [123]/3  workers 2/2' "$T/pf.out")" = 3 ] || fail "3 rounds with 2 workers were not printed"
grep -q "coordinator exit 0; 3 of 3 rounds committed" "$T/pf.out" || fail "not 3 committed rounds"
grep -q "secure aggregation on" "$T/pf.out" || fail "not a secure federation"
for w in box-0 box-1; do
	grep -q "worker $w admitted" "$T/pf.out" || fail "$w was not admitted"
done
if [ "${FB_DEPLOY_CUDA:-0}" = 1 ]; then
	grep -q "built localhost/fedbox-cuda:" "$T/pf.out" || fail "no CUDA image"
	grep -Eq "worker\[box-0\] INFO backend: (cuda|cpu \((no CUDA device|cannot load))" "$T/pf.out" ||
		fail "the CUDA image's worker did not report its backend"
fi
echo PASS
