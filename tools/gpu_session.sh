#!/usr/bin/env bash
# Every GPU check and measurement of the repository, in one go, in this order:
#   ceilings  every ceiling of this GPU (copy, cuBLAS, FFMA, mma.sync, wgmma) into
#             ceilings/<gpu>.json: the roofline every chapter and page reads
#   validate  each kernel family's GPU tests and compute-sanitizer (memcheck, racecheck,
#             synccheck), in parallel; what passes is recorded in kernels/validated.json
#             (FAMILIES="k3 k5" for some of them; JOBS processes at once, default 8; ADMIT=1 also runs the
#             kernels not yet run, alone, and records each that passes: the run names them, to take out of
#             NOT_YET_RUN; PENDING=1 runs only those, beside families whose records are current)
#   tests     the whole GPU-marked pytest suite in one process
#   01 .. 10  each chapter's run.py, which writes chapters/NN/results/<gpu>.json; the default
#             list is moe_gemm.core.chapters' (01 02 03 04 06: 05 needs a compute capability 10.x
#             GPU, 07 and 08 run in parts, each named in FLAGS_07 / FLAGS_08)
#
#   tools/gpu_session.sh                 # ceilings, validate, then the default chapters
#   tools/gpu_session.sh validate 03     # only these stages
#   FLAGS_02=--profile tools/gpu_session.sh 02   # extra flags for one chapter's run.py
#
# Logs (and a tarball of the results files, the ceilings and the validation record) go to $OUT if
# it is set, else to ./gpu-session/. MOE_GEMM_CACHE names the NVRTC cache (a copy of one made on
# any machine with the same NVRTC skips the compiles).
# A numpy<2.5 wheel folder in $WHEELS (default .whl) is installed first when present: numba-cuda
# 0.30 needs numpy < 2.5 (see README).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-session}
mkdir -p "$out"
wheels=${WHEELS:-.whl}
if compgen -G "$wheels/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$wheels"/*.whl
    export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD/python:${PYTHONPATH:-} PYTHONUNBUFFERED=1 MOE_GEMM_CACHE=${MOE_GEMM_CACHE:-/tmp/moe-gemm-cache}
stages=("$@")
if [ ${#stages[@]} -eq 0 ]; then
    default=$(python3 -m moe_gemm.core.chapters --default-gpu-stages) || exit 2
    read -ra stages <<<"ceilings validate $default"
fi
status=0
summary=()
run_stage() {  # name, timeout seconds, command...
    local name=$1 limit=$2; shift 2
    local start=$SECONDS
    echo "=== $name: $*" | tee -a "$out/session.log"
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    tail -n 40 "$out/$name.log"
    summary+=("$(printf '%-14s rc=%-3s %4ss' "$name" "$rc" $((SECONDS - start)))")
    [ $rc -eq 0 ] || status=1
}
for stage in "${stages[@]}"; do
    case $stage in
        ceilings) run_stage ceilings 900 python3 -m moe_gemm.measure.ceilings ;;
        validate) run_stage validate ${VALIDATE_TIMEOUT:-1500} python3 -m moe_gemm.measure.validation run ${FAMILIES:-} \
                      --jobs ${JOBS:-8} ${ADMIT:+--admit} ${PENDING:+--pending-only} ;;
        tests) run_stage tests ${TESTS_TIMEOUT:-900} python3 -m pytest -q -m gpu -p no:cacheprovider --timeout 300 tests ;;
        [0-9][0-9]) flags=FLAGS_$stage
                run_stage "ch$stage" ${CHAPTER_TIMEOUT:-900} python3 "chapters/$stage/run.py" ${!flags:-} ;;
        *) echo "unknown stage $stage"; exit 2 ;;
    esac
done
tar czf "$out/results.tgz" chapters/*/results ceilings kernels/validated.json 2>/dev/null
printf '%s\n' "${summary[@]}"
exit $status
