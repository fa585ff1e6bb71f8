#!/usr/bin/env bash
# The device check, in one run: doctor, every cuda-marked test, the built-in suites on CUDA
# (ops, quant, convergence, search, fingerprint: cuBLAS bf16/fp16/fp32/tf32 GEMMs, cuBLASLt's FP8
# GEMM through torch._scaled_mm and every SDPA backend, fingerprinted; the table is in the report)
# recording cuda-smXY goldens and a results file into $OUT
# (review them, then copy $OUT/golden/cuda-sm* to golden/ and commit), the markdown report, and
# the Triton corpus compiled (tests/test_triton_corpus.py), the ErrorStats benchmark on CUDA (the fused Triton kernel, the chunked fallback, and a check
# that their statistics agree: exit 1 if not) and on this host's CPU at 2 threads (another CPU
# kind than the development machine's), and numcheck.telemetry's cost on CUDA (the tiny models;
# tests/test_telemetry_cuda.py runs with the cuda tests). Outputs go to $OUT (default ./out);
# the dated notes under docs/ are written from them. Runs without installing numcheck (the GPU
# image has its own CUDA torch): PYTHONPATH and `-p numcheck.frontends.plugin`.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-out}
mkdir -p "$OUT"
py=${PYTHON:-python3}
step() {  # step NAME COMMAND...: run, keep the output, print rc and wall time
  local name=$1; shift
  local t0=$SECONDS
  "$@" > "$OUT/$name.txt" 2>&1
  echo "== $name: rc=$? $((SECONDS - t0)) s"
  tail -n 25 "$OUT/$name.txt"
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
step doctor "$py" -m numcheck doctor
step tests_cuda "$py" -m pytest -p numcheck.frontends.plugin tests -q -n 8 -m cuda -rfE -p no:cacheprovider
step suites_cuda "$py" -m pytest -p numcheck.frontends.plugin suites -q -n 8 --dist loadgroup \
  --numcheck-device cuda -rfEx -p no:cacheprovider --numcheck-golden-dir "$OUT/golden" \
  --numcheck-refresh --numcheck-results "$OUT/results.parquet"
step report "$py" -m numcheck report "$OUT/results.parquet" --out "$OUT/report.md"
step triton_interp_vs_compiled "$py" bench/triton_interp_vs_compiled.py
# The Triton corpus (liger-kernel, torchao) compiled, same adapters, cases and planted faults as
# on the CPU interpreter; the libraries from the image or from a `pip install --target` folder
# carried along and named by NUMCHECK_CORPUS_PATH (the GPU machine has no network).
step triton_corpus_cuda env NUMCHECK_CORPUS_DEVICE=cuda \
  PYTHONPATH="$PYTHONPATH${NUMCHECK_CORPUS_PATH:+:$NUMCHECK_CORPUS_PATH}" \
  "$py" -m pytest -p numcheck.frontends.plugin tests/test_triton_corpus.py --numcheck-slow -q \
  -rfEs -p no:cacheprovider
step bench_cuda "$py" bench/bench_error_stats.py --device cuda
step bench_cpu env OMP_NUM_THREADS=2 "$py" bench/bench_error_stats.py --device cpu
step bench_telemetry_cuda "$py" bench/bench_telemetry_overhead.py --device cuda --steps 50
# numcheck inspect on 2 ranks with NCCL (one GPU per rank; issue 33), where there are 2 GPUs;
# on one GPU the ranks would share it, which NCCL refuses: the step says so and is skipped.
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  step inspect_nproc_nccl "$py" -m numcheck inspect --model tiny_lm --nproc 2 --steps 5 \
    --out "$OUT/inspect_nproc"
else
  echo "== inspect_nproc_nccl: skipped (needs 2 GPUs, this machine has $(nvidia-smi -L | wc -l))"
fi
