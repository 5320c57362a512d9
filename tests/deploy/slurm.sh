# SPDX-License-Identifier: Apache-2.0
# Slurm: a one-node cluster of Debian's slurm-wlm started here (munged,
# slurmctld and slurmd, with a config, key and state of their own in the
# temp folder, stopped by PID), a coordinator started outside it, and
# deploy/slurm/fedbox-worker.sbatch submitted as a 2-task array, each task
# asking for --gres=gpu:1. The node has no GPU: it declares two fake ones
# (gres.conf: /dev/null and /dev/zero as their device files), so Slurm
# schedules the GPU requests as on a GPU node, and the workers, finding no
# GPU, take the CPU path. Both jobs join, the rounds commit and
# the jobs end COMPLETED.
source tests/deploy/lib.sh
need_root "slurmd runs jobs as root here; munged and slurmctld as root"
for t in munged slurmctld slurmd sbatch squeue scontrol; do
	command -v "$t" >/dev/null || skip "no $t (scripts/bootstrap deploy installs slurm-wlm and munge)"
done

node=$(hostname -s)
S=$T/slurm
mkdir -p "$S/state" "$S/spool" "$S/munge" "$S/log"
chmod 700 "$S/munge"

# ---- munge ------------------------------------------------------------------------
dd if=/dev/urandom of="$S/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$S/munge/munge.key"
munged --key-file="$S/munge/munge.key" --socket="$S/munge/munge.sock" \
	--pid-file="$S/munge/munged.pid" --log-file="$S/log/munged.log" \
	--seed-file="$S/munge/munge.seed" --force >"$S/log/munged.out" 2>&1 ||
	fail "munged did not start: $(cat "$S/log/munged.out" "$S/log/munged.log" 2>/dev/null | tail -3)"
PIDS+=("$(cat "$S/munge/munged.pid")")
munge -S "$S/munge/munge.sock" -n | unmunge -S "$S/munge/munge.sock" >/dev/null ||
	fail "munge credential round trip failed"
echo "munged: pid $(cat "$S/munge/munged.pid"), credential round trip ok"

# ---- slurm.conf -----------------------------------------------------------------
ports=$(free_port)
cat >"$S/slurm.conf" <<CONF
ClusterName=fbtest
SlurmctldHost=$node(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$ports
SlurmdPort=$((ports + 1))
AuthType=auth/munge
AuthInfo=socket=$S/munge/munge.sock
CredType=cred/munge
StateSaveLocation=$S/state
SlurmdSpoolDir=$S/spool
SlurmctldPidFile=$S/slurmctld.pid
SlurmdPidFile=$S/slurmd.pid
SlurmctldLogFile=$S/log/slurmctld.log
SlurmdLogFile=$S/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=10
NodeName=$node NodeAddr=127.0.0.1 CPUs=$(nproc) Gres=gpu:2 State=UNKNOWN
PartitionName=gpu Nodes=$node Default=YES MaxTime=60 State=UP
CONF
# Two fake GPUs: Slurm's gpu plugin wants a device file per GPU and this
# host has none, so two harmless character devices stand in for them. The
# jobs are scheduled as on a GPU node; the workers find no GPU.
printf 'NodeName=%s Name=gpu File=/dev/null\nNodeName=%s Name=gpu File=/dev/zero\n' \
	"$node" "$node" >"$S/gres.conf"
export SLURM_CONF=$S/slurm.conf

slurmctld -D -f "$SLURM_CONF" >"$S/log/slurmctld.out" 2>&1 &
PIDS+=("$!")
slurmd -D -f "$SLURM_CONF" -N "$node" >"$S/log/slurmd.out" 2>&1 &
PIDS+=("$!")
for ((i = 0; i < 300; i++)); do
	state=$(sinfo -h -N -o '%T' 2>/dev/null | head -1 || true)
	[ "$state" = idle ] && break
	sleep 0.2
done
[ "$state" = idle ] || {
	tail -5 "$S"/log/* 2>/dev/null || true
	fail "node $node is '$state', not idle"
}
echo "slurm: $(sinfo -h -o '%P %a %D %T %G')"

# ---- the coordinator and the sbatch'd workers ---------------------------------------
port=$(free_port)
cat >"$T/hosts.txt" <<HOSTS
coordinator hub 127.0.0.1:$port
worker box-0
worker box-1
set coordinator round.rounds 2
set coordinator round.local_steps 40
set coordinator model.hidden [32]
set coordinator transport.lanes 1
set coordinator round.wait_for_workers 3m
set workers train.device auto
HOSTS
scripts/fedbox-provision --keygen "$B/fedbox-keygen" -o "$T/kits" "$T/hosts.txt" >/dev/null ||
	fail "fedbox-provision failed"
start_coordinator "$T/kits/hub/coordinator.yaml"
wait_for "$T/coord.log" "listening on" 20

job=$(FEDBOX_BIN=$ROOT/$B sbatch --parsable --export=ALL --array=0-1 \
	--gres=gpu:1 --cpus-per-task=1 --time=10 -o "$T/job-%A_%a.out" \
	deploy/slurm/fedbox-worker.sbatch "$T/kits") || fail "sbatch failed"
echo "submitted array job $job"
wait_exit "$CPID" 180 || fail "coordinator exited with status $?"
cat "$T/rounds.txt"
OUT=$T/kits/hub/output
for r in 1 2; do
	[ "$(metric $r status)" = ok ] || fail "round $r: $(metric $r status)"
	[ "$(metric $r participants)" = 2 ] || fail "round $r: $(metric $r participants) participants"
done
for ((i = 0; i < 300; i++)); do
	[ -z "$(squeue -h -j "$job" 2>/dev/null)" ] && break
	sleep 0.2
done
[ -z "$(squeue -h -j "$job" 2>/dev/null)" ] || fail "jobs still queued: $(squeue -j "$job")"
for t in 0 1; do
	f=$T/job-${job}_$t.out
	[ -f "$f" ] || fail "no output of task $t"
	head -1 "$f"
	grep -q "admitted as worker" "$f" || fail "task $t never joined: $(tail -3 "$f")"
	grep -q "backend: " "$f" && echo "  $(grep -m1 -o 'backend: .*' "$f")"
	st=$(scontrol show job "${job}_$t" 2>/dev/null | grep -o 'JobState=[A-Z]*' | head -1)
	echo "  task $t: ${st:-JobState=(purged)}"
	[ -z "$st" ] || [ "$st" = JobState=COMPLETED ] || fail "task $t ended $st"
done
grep -q "secure aggregation on" "$T/coord.log" || fail "not a secure federation"
echo PASS
