#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/gpu/run.sh [OUTDIR] -- everything issue 5 measures on a GPU machine,
# in one go: the correctness check (tests/gpu/cuda_check), a short run under
# compute-sanitizer (memcheck), then fedbox vs PyTorch DDP on rows a, b, c,
# fp32 and tf32, on 1 GPU and on 2, 4, ... up to all visible GPUs. Logs go
# to OUTDIR (default $OUT, else /tmp/fedbox-gpu); the table is printed last
# and written to OUTDIR/table.md. Builds nothing: run `make` first (or
# carry build/). Knobs: BENCH_SECONDS (timed seconds per row, default 2),
# BENCH_ROWS (default abc), BENCH_MATH (default fp32,tf32), BENCH_GPUS (a
# list, default "1 2 4 8" capped at the visible count), GPU_CHECKS (default
# "check san1 san_all": the correctness run, memcheck on 1 GPU, memcheck on
# all GPUs with NCCL; add "graphs" for the multi-GPU CUDA Graph matrix:
# NCCL_GRAPH_MIXING_SUPPORT 0/1 x FB_CUDA_GATE 1/0, three trainers each).
set -u
case "${1:-}" in
-h | --help)
	sed -n '3,14p' "$0" | sed 's/^# \{0,1\}//'
	exit 0
	;;
-*)
	echo "bench/gpu/run.sh: unknown option $1 (see --help)" >&2
	exit 2
	;;
esac
# Each program runs under guard(), so that a hang (a lost NCCL peer) costs
# a minute, not the whole call, and leaves every thread's backtrace.
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-${OUT:-/tmp/fedbox-gpu}}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
    NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 NCCL_DEBUG=${NCCL_DEBUG:-WARN}
secs=${BENCH_SECONDS:-2}
rows=${BENCH_ROWS:-abc}
maths=${BENCH_MATH:-fp32,tf32}
B=$root/build
status=0

ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
gdb=$(command -v cuda-gdb || echo /usr/local/cuda/bin/cuda-gdb)

# guard SECONDS LOG CMD...: runs CMD with its output added to LOG; if it is
# still running after SECONDS, prints every host thread's backtrace
# (cuda-gdb attached) and kills it. Returns CMD's status (124 on a hang).
guard() {
	local secs=$1 log=$2 t=0 pid
	shift 2
	"$@" > >(tee -a "$log") 2>&1 &
	pid=$!
	while kill -0 "$pid" 2>/dev/null; do
		sleep 1
		t=$((t + 1))
		if [ "$t" -ge "$secs" ]; then
			echo "HANG: $* still running after ${secs}s" | tee -a "$log"
			timeout 90 "$gdb" -batch -p "$pid" \
			    -ex "thread apply all bt 25" 2>&1 |
			    grep -E '^(Thread|#)' | tee -a "$log"
			kill -9 "$pid" 2>/dev/null
			wait "$pid" 2>/dev/null
			return 124
		fi
	done
	wait "$pid"
}
{
	date -u +%Y-%m-%dT%H:%M:%SZ
	nvidia-smi --query-gpu=index,name,driver_version,memory.total \
	    --format=csv 2>&1
	nvidia-smi topo -m 2>&1 | head -8
	python3 -c 'import torch; print("torch", torch.__version__, \
"cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())' 2>&1
} | tee "$out/machine.log"

checks=${GPU_CHECKS:-check san1 san_all}
case " $checks " in *" check "*)
echo "== correctness: tests/gpu/cuda_check"
guard "${CHECK_TIMEOUT:-180}" "$out/check.log" "$B/tests/gpu/cuda_check" ||
    status=1
;; esac

cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
: >"$out/sanitizer.log"
case " $checks " in *" san1 "*)
echo "== compute-sanitizer memcheck: cuda_check --quick (1 GPU)"
timeout "${CHECK_TIMEOUT:-150}" "$cs" --tool memcheck --error-exitcode 3 "$B/tests/gpu/cuda_check" --quick \
    2>&1 | tee -a "$out/sanitizer.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
;; esac
# With NCCL: its own probing makes CUDA API calls that fail on purpose
# (peer access already enabled, kernel images for other GPUs), so API
# errors are not reported; memory errors are.
case " $checks " in *" san_all "*)
if [ "$ngpu" -gt 1 ]; then
	echo "== compute-sanitizer memcheck: cuda_check --quick-all (NCCL)"
	timeout "${CHECK_TIMEOUT:-150}" "$cs" --tool memcheck --report-api-errors no \
	    --error-exitcode 3 "$B/tests/gpu/cuda_check" \
	    --quick-all 2>&1 | tee -a "$out/sanitizer.log"
	[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
;; esac

: >"$out/bench.log"
for g in ${BENCH_GPUS:-1 2 4 8}; do
	[ "$g" -le "$ngpu" ] || continue
	echo "== fedbox_bench --gpus $g"
	guard "${BENCH_TIMEOUT:-300}" "$out/bench.log" "$B/bench/gpu/fedbox_bench" \
	    --gpus "$g" --rows "${rows}n" --math "$maths" --seconds "$secs" ||
	    status=1
	[ -n "${BENCH_NO_DDP:-}" ] && continue
	echo "== ddp_bench.py --gpus $g"
	guard "${BENCH_TIMEOUT:-300}" "$out/bench.log" python3 "$here/ddp_bench.py" \
	    --gpus "$g" --rows "$rows" --math "$maths" --seconds "$secs" ||
	    status=1
done

# Multi-GPU CUDA Graphs with NCCL: which setting hangs. Each cell opens
# three row-(a) trainers in one process (capture, profile recapture, bare
# eager all-reduces, close, open). Printed: GRAPHS mixing=M gate=G rc=RC.
: >"$out/graphs.log"
case " $checks " in *" graphs "*)
if [ "$ngpu" -gt 1 ]; then
	for cell in "0 1" "1 1" "0 0" "1 0"; do
		set -- $cell
		echo "== graphs: NCCL_GRAPH_MIXING_SUPPORT=$1 FB_CUDA_GATE=$2" |
		    tee -a "$out/graphs.log"
		NCCL_GRAPH_MIXING_SUPPORT=$1 FB_CUDA_GATE=$2 guard \
		    "${GRAPHS_TIMEOUT:-45}" "$out/graphs.log" \
		    "$B/bench/gpu/fedbox_bench" --gpus 2 --rows a --math fp32 \
		    --seconds 0.3 --repeat 3
		echo "GRAPHS mixing=$1 gate=$2 rc=$?" | tee -a "$out/graphs.log"
	done
fi
;; esac

python3 "$here/table.py" "$out/bench.log" "$out/machine.log" \
    >"$out/table.md"
touch "$out/check.log"
grep -h '^\(PASS\|FAIL\|SKIP\|INFO\|HANG\)' "$out/check.log" "$out/sanitizer.log"
grep -h '^GRAPHS' "$out/graphs.log"
grep -h 'ERROR SUMMARY' "$out/sanitizer.log"
cat "$out/table.md"
exit $status
