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
# all GPUs with NCCL).
set -u
# Each program runs under timeout(1), so that a hang (a lost NCCL peer)
# costs minutes, not the whole call.
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
timeout "${CHECK_TIMEOUT:-180}" "$B/tests/gpu/cuda_check" 2>&1 | tee "$out/check.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
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
	timeout "${BENCH_TIMEOUT:-300}" "$B/bench/gpu/fedbox_bench" --gpus "$g" --rows "${rows}n" \
	    --math "$maths" --seconds "$secs" 2>&1 | tee -a "$out/bench.log"
	[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
	echo "== ddp_bench.py --gpus $g"
	timeout "${BENCH_TIMEOUT:-300}" python3 "$here/ddp_bench.py" --gpus "$g" --rows "$rows" \
	    --math "$maths" --seconds "$secs" 2>&1 | tee -a "$out/bench.log"
	[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
done

python3 "$here/table.py" "$out/bench.log" "$out/machine.log" \
    >"$out/table.md"
touch "$out/check.log"
grep -h '^\(PASS\|FAIL\|SKIP\|INFO\)' "$out/check.log" "$out/sanitizer.log"
grep -h 'ERROR SUMMARY' "$out/sanitizer.log"
cat "$out/table.md"
exit $status
