# Shared steps of the device-call scripts (source it; bash). Earlier scripts (session 8 and before) spell these out
# inline: they are the records of calls that ran (record/) and stay as they ran.
#   device_setup DIR            install the carried wheels (h200_targets.sh STAGE=none), PYTHONPATH, GPU name, the
#                               GPU's clocks / power and the host CPU (machine.txt); the tree's commit from a carried
#                               .device_tree (stamp_tree.sh) for the results
#   serve_variant NAME ARGS...  start `voxflow serve /tmp/real-1.7b` (bf16, 64 seqs, step trace in $R) with extra
#                               ARGS and wait for /ready; returns 1 (and prints the log's tail) if it never came up
#   bench_http ARGS...          `voxflow bench` against it (151 frames, --ignore-eos), last lines shown
#   http_small NAME [ARGS]      serve_small NAME (ARGS: serve options), bench_http_small NAME, stop_server NAME
#   bench_http_at C LABEL [ARGS] bench_http at concurrency C (1, 16 or 64) with the targets' sizes (16 / 64 / 256
#                               prompts) into $R/h200_1p7b_http_LABEL.* (ARGS: more bench options)
#   stop_server NAME            stop it, keep /health and the gzipped trace
#   real_checkpoint_bg          build /tmp/real-1.7b (custom_voice) in the background; `wait $CK` before using it
#   small_checkpoint_bg         the same for /tmp/real-0.6b; `wait $CK6`
#   archive_results             on exit, pack $R into $OUT/r.tgz (a call returns at most 8 files; R under /tmp), and
#                               Triton's kernel cache into $OUT/triton_cache.tgz.* when the call compiled kernels
#   restore_kernel_cache        (device_setup) the carried .triton_cache's kernels into Triton's cache
#                               (device_kernel_cache.sh takes a call's parts here)
#   start_call [1.7B] [0.6B]    device_setup /tmp/r, archive_results, and those checkpoints built in the background
#                               ($CK / $CK6): every call script's first lines
#   pack_results                pack it now (a call that may be cut at its time limit keeps what ran)
#   alternate UNTIL RUN...      `variant RUN` (a function the calling script defines: which server and bench a run
#                               name means) for each RUN in order while SECONDS < UNTIL, packing the results after
#                               each: the A/B loop of alternating runs
#   gpu_tests SECONDS TESTS...  pytest those GPU tests into $R/gpu_tests.txt, failures and the result shown
#   bench_offline LABEL [ARGS]  offline c=256 (prompts_for 256 prompts, 151 frames, 256 seqs; ARGS: more options) into
#                               $R/h200_1p7b_offline_c256_LABEL.*
#   bench_offline_at C LABEL [ARGS]  the same at concurrency C (prompts_for C prompts, C seqs) into
#                               $R/h200_1p7b_offline_cC_LABEL.*
#   probe_small_allocations [ARGS]  probe_allocations.py on /tmp/real-0.6b (2.4 GB pool, codec calls of <= 16; ARGS:
#                               its options, e.g. --dump FILE) into $R/probe_allocations.txt, the pool summaries shown
#   bench_1p7b_at C LABEL [ARGS] offline 1.7B at concurrency C, 1 or 64 (/tmp/real-1.7b, 64 seqs, prompts_for C of
#                               151 frames) with a step trace into $R/h200_1p7b_offline_cC_LABEL.* and
#                               $R/steps_1p7b_LABEL.jsonl (c=1: steps_1p7b_c1_LABEL.jsonl)
#   bench_1p7b_c64 LABEL [ARGS]  bench_1p7b_at 64 (the name session 22-23 call records use)
#   bench_small_traced LABEL [ARGS]  bench_small_8gb with a 2.4 GB pool and a step trace ($R/steps_0p6b_LABEL.jsonl),
#                               then its footprint
#   timeline_at MODEL C LABEL [ENV=VALUE...]  step_timeline.py record of MODEL at concurrency C (with those
#                               environment settings) into $R/timeline_LABEL.json.gz, its report (--sequence) into
#                               $R/timeline_LABEL.txt, the first line shown
#   profile_codec_16 LABEL [ENV=VALUE...]  the codec alone (profile_codec.py on $CODEC_MODEL, /tmp/real-1.7b unless
#                               set (the 0.6B's codec is the same): 16 streams, fp16 on 64
#                               SMs, 1 / 5 / 25 frames) under those settings into
#                               $R/profile_codec_16_fp16_sms64_LABEL.txt, the per-call lines shown
#   summarize_steps GLOB LINES  each step trace matching GLOB (under $R) summarised (step_trace_summary, its first LINES
#                               lines) into $R/step_summaries.txt
#   probe_gemms UNTIL SECONDS NAME [ARGS]  if SECONDS < UNTIL: probe_gemms_beside_codec.py (ARGS: its options) for at
#                               most SECONDS into $R/NAME.txt, shown, then pack_results
#   print_footprint RESULT      a bench result's preemptions and GPU footprint (peak total, peak reserved, and memory
#                               outside the allocator by startup stage when recorded), GiB
#   serve_small NAME [ARGS]     serve_variant for /tmp/real-0.6b in the <= 8 GB configuration (a 2.4 GB KV pool, the
#                               least that holds 64 requests of ~170 prompt positions + 151 frames, as the offline
#                               bench_small_traced; codec calls of <= 16; no preloaded text rows: the whole footprint
#                               7.30 GiB = 7.84e9 bytes, under 8e9, against 7.54 GiB = 8.10e9 with them, at the same
#                               audio-s/s, session 42 call 3); stop it with stop_server NAME. (Session 42 call 2 ran it
#                               with a 2 GB pool: ~54 requests fit, the rest waited: 564 audio-s/s.)
#   bench_http_small LABEL [ARGS]  `voxflow bench` against it at c=64 ($SMALL_PROMPTS prompts, 8 warm-ups) into
#                               $R/h200_0p6b_http_c64_LABEL.*: the 0.6B target as the issue states it (over HTTP)
#   bench_small_8gb LABEL [ARGS] offline 0.6B c=64 in the <= 8 GB configuration (/tmp/real-0.6b; a 2 GB KV pool unless
#                               ARGS give another kv_cache_bytes, codec calls of <= 16; $SMALL_PROMPTS prompts) into
#                               $R/h200_0p6b_offline_c64_LABEL.*. Not capped: its whole footprint was 9.4-9.8 GiB
#                               in session 19 (a cap of 8e9 bytes ran out of memory then), 7.34 GiB with a 2.4 GB
#                               pool in session 21 call 2. 150 s: a fresh machine's first run pays Triton's JIT.

# Every bench here sends prompts no request sent before (`--unique-prompts`, from session 25 on): the bundled set
# has 66 prompts, so larger runs, later levels and repeated runs otherwise measure the server's prefix cache (session
# 25 call 5: HTTP c=64 601.0 audio-s/s on unique prompts, 629.6 on the repeated ones). UNIQUE= (empty) before a
# call reproduces the earlier sessions' runs.
UNIQUE=${UNIQUE---unique-prompts}

device_setup() {
  # Emptied first: a warm machine keeps the last call's folder, and the step traces append to their files.
  R=$1; rm -rf "$R"; mkdir -p "$R"
  export PYTHONUNBUFFERED=1
  if [ -f .device_tree ]; then           # stamp_tree.sh's record of the tree (carried): the results' commit
    export VOXFLOW_GIT_COMMIT=$(head -1 .device_tree)
    grep -q '^dirty$' .device_tree && export VOXFLOW_GIT_DIRTY=1
    echo "tree $(tr '\n' ' ' < .device_tree)" | tee "$R/tree.txt"
  fi
  STAGE=none bash benchmarks/scripts/h200_targets.sh > /dev/null 2>&1
  export PYTHONPATH=$PWD:/tmp/site
  restore_kernel_cache
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$R/gpu.txt"
  # Machines differ by ~10% on the same tree (sessions 18-19): their clocks, power limits and host CPUs, kept.
  { nvidia-smi -q -d CLOCK,POWER,PERFORMANCE; lscpu; } > "$R/machine.txt" 2>&1
}

wait_ready() {                   # the server started as $SRV, its log in serve_log_NAME.txt
  # (up to 300 s: a fresh machine's first server compiles every Triton kernel; session 47 call 3's took longer than
  # the 150 s this waited before, and, left running, held the port against the next two)
  for _ in $(seq 300); do
    curl -sf http://127.0.0.1:8000/ready > /dev/null && return 0
    kill -0 $SRV 2>/dev/null || break
    sleep 1
  done
  echo "== $1: server did not come up"; grep -v "^\s*$" "$R/serve_log_$1.txt" | tail -5
  kill $SRV 2>/dev/null; wait $SRV 2>/dev/null
  return 1
}

# (from session 49 every server also writes its request trace: ~0.5 KB and a few microseconds a request)
serve_model() {                  # MODEL NAME [ARGS]: `voxflow serve` in the background as $SRV, until it is ready
  local model=$1 name=$2; shift 2
  python3 -m voxflow.cli serve "$model" --device cuda --dtype bfloat16 --max-num-seqs 64 --port 8000 "$@" \
    --trace-steps "$R/steps_http_$name.jsonl" --trace-requests "$R/requests_$name.jsonl" \
    > "$R/serve_log_$name.txt" 2>&1 &
  SRV=$!
  wait_ready "$name" || return 1
  curl -s http://127.0.0.1:8000/metrics > "$R/metrics_start_$name.txt"      # (stop_server's loop lag counts from here)
}

serve_variant() { serve_model /tmp/real-1.7b "$@"; }

# Prompts of a closed-loop run at concurrency c: PROMPTS_PER_USER x c, at least 16. The project's benchmarking rules
# (shared/reference/benchmarking.md) ask for >= 10 x c; sessions up to 42 ran 2-4 x c (0.6B / 1.7B c=64: 192 or 256,
# c=16: 64, offline c=256: 512), so each client made a few requests and the runs' first arrivals and last tails
# weighed a third of its cycles (session 42: the 0.6B's HTTP runs' 2-3% below offline lies mostly there). From
# session 43 on: 10 x c. SMALL_PROMPTS=192 (and PROMPTS_PER_USER=3) come close to the older runs.
PROMPTS_PER_USER=${PROMPTS_PER_USER:-10}
prompts_for() { local p=$((PROMPTS_PER_USER * $1)); echo $((p < 16 ? 16 : p)); }
SMALL_PROMPTS=${SMALL_PROMPTS:-$(prompts_for 64)}

serve_small() {
  local name=$1; shift
  serve_model /tmp/real-0.6b "$name" --engine-arg codec_max_batch=16 --engine-arg kv_cache_bytes=2400000000 \
    --engine-arg preload_text_rows=false "$@"
}

bench_http_small() {
  bench_http --label "http-small-$1" --concurrency 64 --num-prompts $SMALL_PROMPTS --num-warmups 8 \
    --output "$R/h200_0p6b_http_c64_$1.json.gz" "${@:2}"
  echo "  at ${SECONDS}s"
}

http_small() {
  # one 0.6B server (serve_small's configuration, ARGS: more serve options), one bench_http_small run, stopped;
  # its result line shown
  local name=$1; shift
  if serve_small "$name" "$@"; then
    bench_http_small "$name"
    stop_server "$name"
  fi
  grep -h "^| c=" "$R/h200_0p6b_http_c64_$name.md"
  http_turn_of "$R/h200_0p6b_http_c64_$name.json.gz" "$name"
}

http_turn_of() {                 # RESULT NAME: the run's turnover hop by hop (voxflow/tools/http_turn.py)
  python3 -m voxflow.tools.http_turn "$1" "$R/requests_$2.jsonl.gz" | tee "$R/http_turn_$2.txt" | tail -10
}

bench_http() {
  timeout 150 python3 -m voxflow.bench $UNIQUE --dtype bfloat16 --max-new-tokens 151 --ignore-eos --no-progress \
    --no-plots \
    --base-url http://127.0.0.1:8000 "$@" 2>&1 | grep -v "^\s*$" | tail -2
}

bench_http_at() {
  local c=$1 name=$2 prompts warmups
  case $c in
    1) prompts=$(prompts_for 1); warmups=2 ;;
    16) prompts=$(prompts_for 16); warmups=4 ;;
    64) prompts=$(prompts_for 64); warmups=8 ;;
    *) echo "bench_http_at: concurrency 1, 16 or 64, not $c"; return 1 ;;
  esac
  bench_http --label "http-$name" --concurrency $c --num-prompts $prompts --num-warmups $warmups \
    --output "$R/h200_1p7b_http_$name.json.gz" "${@:3}"
  echo "  at ${SECONDS}s"
}

stop_server() {
  curl -s http://127.0.0.1:8000/health > "$R/health_$1.json"
  # the API event loop's lag since the server was ready (voxflow_api_event_loop_lag_seconds; from session 52 on)
  curl -s http://127.0.0.1:8000/metrics > "$R/metrics_$1.txt"
  python3 -m voxflow.tools.loop_lag "$R/metrics_$1.txt" --since "$R/metrics_start_$1.txt" | tee "$R/loop_lag_$1.txt"
  kill $SRV 2>/dev/null; wait $SRV; gzip -f "$R/steps_http_$1.jsonl" "$R/requests_$1.jsonl" 2>/dev/null
}

real_checkpoint_bg() {
  python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-1.7b --variant custom_voice --size 1.7B | tail -1 &
  CK=$!
}

small_checkpoint_bg() {
  python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-0.6b --variant custom_voice --size 0.6B > /dev/null 2>&1 &
  CK6=$!
}

pack_results() {
  tar czf "$OUT/r.tgz" -C "$(dirname "$R")" "$(basename "$R")"
}

archive_results() {
  trap 'pack_results; pack_kernel_cache' EXIT TERM
}

# Triton's kernel cache, carried from call to call: a fresh machine's first server spends ~75 s compiling every
# kernel (session 63's H100: startup 87.4 s against 13.5 s once they were cached, the `startup_seconds` of
# benchmarks/results/h100/2026-12-07-session63/call1/serve_log_{i_1,e_1}.txt), out of a call's ~550 s. H100 and
# H200 are both sm_90 and their cache keys the same (Triton's version, ptxas's, the kernel's source and
# specialization), so either card's cache serves the other; a changed kernel just misses and compiles.
#   here, after a call:  bash benchmarks/scripts/device_take_call.sh DIR DEST   (DIR: the call's files_at; it runs
#                        device_kernel_cache.sh take DIR, and puts the results in DEST)
#   then carry ".triton_cache" with ".whl" and ".device_tree"
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$HOME/.triton/cache}
KERNEL_CACHE_PARTS=.triton_cache           # the carried folder: triton_cache.tgz.aa, .ab, ... (split under 16 MiB)
KERNEL_CACHE_MAX_MB=${KERNEL_CACHE_MAX_MB:-30}   # what may come back (the tree, .whl and it travel under 64 MiB)

restore_kernel_cache() {
  mkdir -p "$TRITON_CACHE_DIR"
  if ls "$KERNEL_CACHE_PARTS"/triton_cache.tgz.* > /dev/null 2>&1; then
    cat "$KERNEL_CACHE_PARTS"/triton_cache.tgz.* | tar xzf - -C "$TRITON_CACHE_DIR" \
      && echo "kernel cache: $(find "$TRITON_CACHE_DIR" -type f | wc -l) files restored" | tee "$R/kernel_cache.txt"
  fi
  touch /tmp/kernel_cache_mark                 # what is newer than this was compiled in this call
}

pack_kernel_cache() {
  # Only when this call compiled something (a warm machine's second call usually did not), under the cap; never
  # fails the call.
  [ -n "${OUT:-}" ] && [ -d "$TRITON_CACHE_DIR" ] || return 0
  [ -n "$(find "$TRITON_CACHE_DIR" -type f -newer /tmp/kernel_cache_mark 2>/dev/null | head -1)" ] || return 0
  rm -f "$OUT"/triton_cache.tgz.*
  tar cf - -C "$TRITON_CACHE_DIR" . 2>/dev/null | gzip -1 | split -b 15m - "$OUT/triton_cache.tgz."
  local mb=$(( $(cat "$OUT"/triton_cache.tgz.* | wc -c) / 1048576 ))
  if (( mb > KERNEL_CACHE_MAX_MB )); then
    rm -f "$OUT"/triton_cache.tgz.*
    echo "kernel cache: ${mb} MiB packed, over ${KERNEL_CACHE_MAX_MB}: not sent back"
  else
    echo "kernel cache: ${mb} MiB sent back ($(ls "$OUT"/triton_cache.tgz.* | wc -l) parts)"
  fi
}

alternate() {
  local until=$1 run; shift
  for run in "$@"; do
    (( SECONDS < until )) || break
    variant "$run"
    pack_results
  done
}

start_call() {
  device_setup /tmp/r
  archive_results
  local size
  for size in "$@"; do
    case $size in
      1.7B) real_checkpoint_bg ;;
      0.6B) small_checkpoint_bg ;;
      *) echo "start_call: 1.7B or 0.6B, not $size"; return 1 ;;
    esac
  done
}

gpu_suite() {                    # SECONDS [WORKERS]: every GPU test at once (WORKERS xdist workers, default 4, on the
  # one GPU); -v (pyproject's -q dropped) names each test as it ends, so a run the limit cuts still says which passed
  # (session 61's -q run stopped at ~97% on an H100 without saying which were left)
  timeout -s INT -k 20 "$1" python3 -m pytest -o addopts= -v -rfEs -n "${2:-4}" -p no:cacheprovider --durations=20 tests/gpu \
    > "$R/gpu_tests_all.txt" 2>&1
  echo "pytest rc $?"
  grep -cE " PASSED " "$R/gpu_tests_all.txt" | sed 's/$/ passed so far/'
  grep -E "passed|failed|error" "$R/gpu_tests_all.txt" | grep -v " PASSED " | tail -3
  grep -E "^(FAILED|ERROR)| FAILED | ERROR " "$R/gpu_tests_all.txt" | head -30
}

gpu_tests() {
  local seconds=$1; shift
  timeout "$seconds" python3 -m pytest -rfs --tb=short -p no:cacheprovider "$@" > "$R/gpu_tests.txt" 2>&1
  grep -E "^E |passed|failed" "$R/gpu_tests.txt" | tail -6
}

bench_offline() {
  bench_offline_at 256 "$@"
}

bench_offline_at() {
  local c=$1 name=$2; shift 2
  timeout 170 python3 -m voxflow.bench $UNIQUE --model /tmp/real-1.7b --device cuda --dtype bfloat16 \
    --max-new-tokens 151 --ignore-eos --no-progress --no-plots --label "offline-$name" --concurrency $c \
    --num-prompts $(prompts_for $c) --num-warmups 8 --max-num-seqs $c \
    --output "$R/h200_1p7b_offline_c${c}_$name.json.gz" \
    "$@" 2>&1 | grep -v "^\s*$" | tail -2
  grep -E "^\| c=|breakdown" "$R/h200_1p7b_offline_c${c}_$name.md"
}

bench_1p7b_at() {
  local c=$1 name=$2 prompts warmups tag; shift 2
  case $c in
    1) prompts=$(prompts_for 1); warmups=2; tag=c1_$name ;;
    64) prompts=$(prompts_for 64); warmups=4; tag=$name ;;
    *) echo "bench_1p7b_at: concurrency 1 or 64, not $c"; return 1 ;;
  esac
  # (BENCH_LIMIT: a fresh machine's first run compiles every Triton kernel, > 150 s)
  timeout ${BENCH_LIMIT:-150} python3 -m voxflow.bench $UNIQUE --model /tmp/real-1.7b --device cuda --dtype bfloat16 \
    --max-new-tokens 151 \
    --ignore-eos --no-progress --no-plots --label "1p7b-${tag//_/-}" --concurrency $c --num-prompts $prompts \
    --num-warmups $warmups --max-num-seqs 64 --output "$R/h200_1p7b_offline_c${c}_$name.json.gz" \
    --engine-arg trace_steps=$R/steps_1p7b_$tag.jsonl "$@" 2>&1 | grep -v "^\s*$" | tail -1
  grep -E "^\| c=" "$R/h200_1p7b_offline_c${c}_$name.md"
  echo "  at ${SECONDS}s"
}

bench_1p7b_c64() { bench_1p7b_at 64 "$@"; }

bench_small_8gb() {
  timeout 150 python3 -m voxflow.bench $UNIQUE --dtype bfloat16 --max-new-tokens 151 --ignore-eos --no-progress \
    --no-plots \
    --device cuda --model /tmp/real-0.6b --label "small-$1" --engine-arg codec_max_batch=16 \
    --engine-arg kv_cache_bytes=2000000000 --concurrency 64 --num-prompts $SMALL_PROMPTS --num-warmups 8 \
    --max-num-seqs 64 \
    --output "$R/h200_0p6b_offline_c64_$1.json.gz" "${@:2}" 2>&1 | grep -v "^\s*$" | tail -2
}

print_footprint() {
  python3 - "$1" <<'PY'
import gzip, json, sys
s = json.load(gzip.open(sys.argv[1]))["target"]["engine"]["stats"]
g = 2 ** 30
stages = {k: round(v / g, 2) for k, v in s["startup"].get("gpu_memory_outside_allocator_by_stage", {}).items()}
print("  preemptions", s["preemptions"], "| GiB: peak total", round(s["peak_gpu_memory_total_bytes"] / g, 2),
      "peak reserved", round(s["peak_gpu_memory_reserved_bytes"] / g, 2), "| outside the allocator by stage", stages)
PY
}

probe_small_allocations() {
  python3 benchmarks/scripts/probe_allocations.py /tmp/real-0.6b 64 "$@" kv_cache_bytes=2400000000 codec_max_batch=16 \
    2>&1 | grep -v Warning | tee $R/probe_allocations.txt | grep -A9 "^=="
}

# bench_small_traced for a fresh machine's first run, which compiles every Triton kernel first (> 150 s: session 48
# call 2's first run hit bench_small_8gb's limit): the same run under a 330 s limit.
bench_small_first() {
  timeout 330 python3 -m voxflow.bench $UNIQUE --dtype bfloat16 --max-new-tokens 151 --ignore-eos --no-progress \
    --no-plots --device cuda --model /tmp/real-0.6b --label "small-$1" --engine-arg codec_max_batch=16 \
    --engine-arg kv_cache_bytes=2400000000 --concurrency 64 --num-prompts $SMALL_PROMPTS --num-warmups 8 \
    --max-num-seqs 64 --engine-arg trace_steps=$R/steps_0p6b_$1.jsonl \
    --output "$R/h200_0p6b_offline_c64_$1.json.gz" "${@:2}" 2>&1 | grep -v "^\s*$" | tail -1
  print_footprint "$R/h200_0p6b_offline_c64_$1.json.gz"
  echo "  at ${SECONDS}s"
}

bench_small_traced() {
  bench_small_8gb "$1" --engine-arg kv_cache_bytes=2400000000 --engine-arg trace_steps=$R/steps_0p6b_$1.jsonl "${@:2}"
  print_footprint "$R/h200_0p6b_offline_c64_$1.json.gz"
  echo "  at ${SECONDS}s"
}

# The GPU across a closed-loop wave's end (wave_end_timeline.py): 0.6B c=64, the <= 8 GB configuration, 150 frames.
wave_end_small() {
  local label=$1; shift
  timeout 150 python3 benchmarks/scripts/wave_end_timeline.py record /tmp/real-0.6b 64 "$R/wave_end_$label.json.gz" \
    --frames 150 codec_max_batch=16 kv_cache_bytes=2400000000 "$@" 2>&1 | grep -v -i warn | tail -1
  python3 benchmarks/scripts/wave_end_timeline.py report "$R/wave_end_$label.json.gz" > "$R/wave_end_$label.txt"
  head -1 "$R/wave_end_$label.txt"
  echo "  at ${SECONDS}s"
}

profile_codec_16() {
  local label=$1; shift
  env "$@" timeout ${PROFILE_LIMIT:-100} python3 benchmarks/scripts/profile_codec.py ${CODEC_MODEL:-/tmp/real-1.7b} 16 fp16+sms64 1,5,25 25 2>&1 \
    | grep -v -i warn > $R/profile_codec_16_fp16_sms64_$label.txt
  echo "$label"; grep -E "per call" $R/profile_codec_16_fp16_sms64_$label.txt
}

report_runs() {
  # every run's TTFP and audio-s/s cells and its preemption line, and each server's whole GPU footprint (the
  # lines sessions 47-48 repeated at the end of each call script)
  local f
  for f in $R/*.md; do echo "$f: $(grep -h '^| c=' $f | cut -d'|' -f4,7)"; grep -h "preemptions" $f; done
  for f in $R/health_*.json; do
    [ -f "$f" ] && echo "$f $(grep -o '"peak_gpu_memory_total_bytes":[0-9]*' $f)"
  done
  # repeated 0.6B c=64 runs of several configurations: each against the first file's (e, the defaults), in
  # ab_0p6b_c64.md (voxflow bench ab: means, spread, one-sided permutation p)
  local small=( $R/h200_0p6b_http_c64_*.json.gz )
  if [ -f "${small[0]}" ]; then
    python3 -m voxflow bench ab "${small[@]}" --level c=64 -o "$R/ab_0p6b_c64.md" || true
  fi
  return 0
}

summarize_steps() {
  local f
  for f in $R/$1; do
    case $f in *.pstats) continue ;; esac       # (a traced run's prepare profile beside its trace)
    echo "== $f"; python3 -m voxflow.tools.step_trace_summary "$f" | head -"$2"
  done > "$R/step_summaries.txt"
}

probe_gemms() {
  local until=$1 limit=$2 name=$3; shift 3
  (( SECONDS < until )) || return 0
  timeout "$limit" python3 benchmarks/scripts/probe_gemms_beside_codec.py "$@" 2>&1 | tee "$R/$name.txt"
  pack_results
}

wrap_up() {                      # PATTERN LINES: a call's closing lines (step summaries, turnovers, every run's cells)
  summarize_steps "$1" "$2"
  grep -h "turnover" "$R/step_summaries.txt"
  report_runs
  pack_results
  echo "done at ${SECONDS}s"
}
timeline_at() {
  local model=$1 c=$2 label=$3; shift 3
  env "$@" timeout 120 python3 benchmarks/scripts/step_timeline.py record "$model" "$c" \
    "$R/timeline_$label.json.gz" 2>&1 | grep -v -i warn
  python3 benchmarks/scripts/step_timeline.py report "$R/timeline_$label.json.gz" --sequence > "$R/timeline_$label.txt"
  head -1 "$R/timeline_$label.txt"
}
