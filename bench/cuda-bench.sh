#!/usr/bin/env bash
# CUDA decode/prefill benchmark, gpupool against llama.cpp on the same
# random files (issue 23). Figures only: nothing here passes or fails.
#
#   bash bench/cuda-bench.sh [BUILD_OR_BUNDLE_DIR]          (default: build)
#
# Files (made once with bench/gguf-random, seed 7, into $MODELS):
#   7B (llama2-7b shape) Q4_K_M, Q4_0, Q8_0 and TinyLlama-1.1B Q4_K_M;
#   FILES="7b-q4_k_m tl-q4_k_m" picks a subset (names: 7b-TYPE, tl-TYPE,
#   st-TYPE for the tiny stories260k shape, to try the script out).
# Tests: ppP for each P of $PROMPTS and tg128 (one sequence), tg64 with 8
# and 32 sequences, and tg128 after D tokens of context ("tg128 @ dD") for
# each D of $DEPTHS.
# Environment:
#   MODELS=DIR        where the files live (default /tmp/gpupool-cuda-bench)
#   REPS=N            repetitions (default 3)
#   VARIANTS="label=PLUGIN[,SETTING...] ..."  gpupool runs, one column each:
#                     the plugin file (GPUPOOL_CUDA_PLUGIN; "-" = the one the
#                     engine finds) and settings: VAR=VALUE is exported, a
#                     bare word is GPUPOOL_CUDA_MMV (legacy = the F32 mat-vec
#                     kernels), e.g. "new=P nographs=P,GPUPOOL_CUDA_GRAPHS=0
#                     legacy=P,legacy"; default: the directory's plugin
#   LLAMA_BENCH=PATH, LLAMA_BATCHED_BENCH=PATH   llama.cpp's llama-bench and
#                     llama-batched-bench (CUDA builds): their column
#   SEQS="8 32"       batched decode widths ("" skips them)
#   PROMPTS="512"     prompt sizes (e.g. "512 2048")
#   DEPTHS=""         context depths for tg128 (e.g. "8192 32768")
#   KV=f16            gpupool's KV cache type, f16 (llama.cpp's default) or f32
#   FA=1              llama.cpp's flash attention (1 on, 0 off)
#   BACKEND=cpu       gpupool on the CPU instead (to try the script out)
#   BUDGET_S=N        stop measuring after N seconds (each run gets what is
#                     left, the rest are skipped) and print the table of what
#                     finished; SIGTERM/SIGINT (an outer timeout) do the same
# Output: one markdown table; tg128 also as effective bandwidth (weight
# bytes x tokens/s: what a decode step has to read), printed from whatever
# finished. Raw JSON in $MODELS/out.
set -uo pipefail

bdir=$(cd "${1:-build}" && pwd) || exit 2
run=$bdir/src/run/gpupool-run
gen=$bdir/bench/gguf-random
[ -x "$run" ] && [ -x "$gen" ] ||
    { echo "cuda-bench: $bdir has no src/run/gpupool-run or bench/gguf-random" >&2; exit 2; }
[ -d "$bdir/lib" ] && export LD_LIBRARY_PATH="$bdir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
models=${MODELS:-/tmp/gpupool-cuda-bench}
reps=${REPS:-3}
variants=${VARIANTS:-gpupool=$bdir/src/engine/libgpupool-cuda.so}
files=${FILES:-7b-q4_k_m 7b-q4_0 7b-q8_0 tl-q4_k_m}
seqs=${SEQS-8 32}
prompts=${PROMPTS-512}
depths=${DEPTHS-}
fa=${FA:-1}
kvopt=; [ "${KV:-f16}" = f16 ] && kvopt=--kv-f16
backend=${BACKEND:-cuda}
out=$models/out
mkdir -p "$out"
rm -f "$out"/*.json
budget=${BUDGET_S:-0}
case $budget in
    ""|*[!0-9]*) echo "cuda-bench: BUDGET_S must be a whole number of seconds, not '$budget'" >&2; exit 2 ;;
esac

# Run one measurement within what is left of BUDGET_S (none: as it is).
step() {
    [ "$budget" -gt 0 ] || { "$@"; return; }
    local left=$((deadline - SECONDS))
    if [ "$left" -le 2 ]; then
        echo "cuda-bench: out of time (BUDGET_S=$budget), skipping: ${*##*/}" >&2
        return 1
    fi
    # --foreground: in the measuring job's process group, so that a signal
    # stops it too (timeout alone makes a group of its own)
    timeout --foreground -k 5 "$left" "$@"
}

gen_pids=()
for f in $files; do
    shape=${f%%-*}; type=${f#*-}
    case $shape in 7b) s=llama2-7b ;; tl) s=tinyllama-1.1b ;; st) s=stories260k ;;
        *) echo "cuda-bench: unknown file name $f (7b-TYPE, tl-TYPE, st-TYPE)" >&2; exit 2 ;;
    esac
    [ -s "$models/$f.gguf" ] && continue
    echo "cuda-bench: generating $f.gguf" >&2
    # in parallel (one core each; the 7B files take a minute or two), to a
    # temporary name so an interrupted run leaves no half file behind
    { "$gen" --shape "$s" --type "$type" --seed 7 -o "$models/$f.gguf.tmp" >&2 &&
        mv "$models/$f.gguf.tmp" "$models/$f.gguf"; } &
    gen_pids+=($!)
done
for p in "${gen_pids[@]}"; do
    wait "$p" || { echo "cuda-bench: generating a file failed" >&2; exit 1; }
done

deadline=$((SECONDS + budget)) # (from here: the files are made)

measure() {
    for v in $variants; do
        label=${v%%=*}; rest=${v#*=}; plugin=${rest%%,*}; settings=
        [ "$rest" != "$plugin" ] && settings=${rest#*,}
        for f in $files; do
            m=$models/$f.gguf
            (
                [ "$plugin" != - ] && export GPUPOOL_CUDA_PLUGIN=$plugin
                IFS=, read -ra kv <<<"$settings"
                for e in "${kv[@]}"; do
                    case $e in *=*) export "${e?}" ;; ?*) export GPUPOOL_CUDA_MMV="$e" ;; esac
                done
                for p in $prompts; do
                    step "$run" bench --backend "$backend" -m "$m" -r "$reps" -p "$p" -n 0 $kvopt --json
                done
                step "$run" bench --backend "$backend" -m "$m" -r "$reps" -p 0 -n 128 $kvopt --json
                for s in $seqs; do
                    step "$run" bench --backend "$backend" -m "$m" -r "$reps" -p 0 -n 64 --seqs "$s" \
                        $kvopt --json
                done
                for d in $depths; do
                    step "$run" bench --backend "$backend" -m "$m" -r "$reps" -p 0 -n 128 -d "$d" \
                        $kvopt --json
                done
            ) >"$out/gp.$label.$f.json" 2>"$out/gp.$label.$f.err" ||
                echo "cuda-bench: $label on $f failed (see $out/gp.$label.$f.err)" >&2
        done
    done

    if [ -n "${LLAMA_BENCH:-}" ]; then
        for f in $files; do
            { step "$LLAMA_BENCH" -m "$models/$f.gguf" -ngl 99 -fa "$fa" -r "$reps" -o jsonl \
                  -p "$(echo ${prompts:-0} | tr ' ' ,)" -n 128 &&
              if [ -n "$depths" ]; then
                  step "$LLAMA_BENCH" -m "$models/$f.gguf" -ngl 99 -fa "$fa" -r "$reps" -o jsonl \
                      -p 0 -n 128 -d "$(echo $depths | tr ' ' ,)"
              fi; } >"$out/lc.$f.json" 2>"$out/lc.$f.err" ||
                echo "cuda-bench: llama-bench on $f failed" >&2
        done
    fi
    if [ -n "${LLAMA_BATCHED_BENCH:-}" ] && [ -n "$seqs" ]; then
        for f in $files; do
            step "$LLAMA_BATCHED_BENCH" -m "$models/$f.gguf" -ngl 99 -fa "$([ "$fa" = 1 ] && echo on || echo off)" \
                -c 8192 -npp 32 -ntg 64 \
                -npl "$(echo $seqs | tr ' ' ',')" --output-format jsonl \
                >"$out/lcb.$f.json" 2>"$out/lcb.$f.err" ||
                echo "cuda-bench: llama-batched-bench on $f failed" >&2
        done
    fi
}

# Measured in the background so that a SIGTERM (an outer timeout) is taken
# at once: the runs in flight are stopped and the table printed from what
# finished (bash runs a trap only once its foreground command has ended).
stopped=0
trap 'stopped=1; [ -n "${mpid:-}" ] && kill -TERM -- -"$mpid" 2>/dev/null' TERM INT
set -m
measure &
mpid=$!
set +m
[ "$stopped" = 1 ] && kill -TERM -- -"$mpid" 2>/dev/null # (a signal before mpid was set)
wait "$mpid"
wait "$mpid" 2>/dev/null # (after a signal: until the runs have stopped)
[ "$stopped" = 1 ] && echo "cuda-bench: stopped; the table has what finished" >&2

python3 - "$out" "$files" "$variants" "$seqs" "$prompts" "$depths" <<'PY'
import json, os, sys
out, files, variants, seqs = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), sys.argv[4].split()
prompts, depths = sys.argv[5].split(), sys.argv[6].split()
labels = [v.split("=", 1)[0] for v in variants]

def lines(path):
    try:
        with open(path) as fh:
            txt = fh.read().strip()
    except OSError:
        return []
    if txt.startswith("["):
        return json.loads(txt)
    res = []
    for ln in txt.splitlines():
        ln = ln.strip()
        if ln.startswith("{"):
            try:
                res.append(json.loads(ln))
            except ValueError:
                pass
    return res

rows = []   # (file, test, {col: t/s}, bytes)
for f in files:
    res, nbytes = {}, None
    for lab in labels:
        for r in lines(f"{out}/gp.{lab}.{f}.json"):
            res.setdefault(r["test"], {})[lab] = (r["tokens_per_s"], r.get("stddev", 0.0))
            nbytes = r.get("bytes", nbytes)
    for r in lines(f"{out}/lc.{f}.json"):
        t = f"pp{r['n_prompt']}" if r.get("n_prompt") else f"tg{r['n_gen']}"
        if r.get("n_depth"):
            t += f" @ d{r['n_depth']}"
        res.setdefault(t, {})["llama.cpp"] = (r["avg_ts"], r.get("stddev_ts", 0.0))
    for r in lines(f"{out}/lcb.{f}.json"):
        if "pl" in r and "speed_tg" in r:
            res.setdefault(f"tg64 x{r['pl']}", {})["llama.cpp"] = (r["speed_tg"], 0.0)
    order = [f"pp{p}" for p in prompts] + ["tg128"] + [f"tg64 x{s}" for s in seqs] \
        + [f"tg128 @ d{d}" for d in depths]
    for t in order:
        if t in res:
            rows.append((f, t, res[t], nbytes))

cols = ["llama.cpp"] + labels
hdr = "| file | test | " + " | ".join(cols) + " | " + " | ".join(f"{l}/llama.cpp" for l in labels) \
    + " | " + " | ".join(f"{l} GB/s" for l in labels) + " |"
print(hdr)
print("|" + "---|" * (hdr.count("|") - 1))

def cell(v):   # mean, and the spread (standard deviation) when there is one
    mean, sd = v
    return f"{mean:,.1f}" + (f" ±{100 * sd / mean:.1f}%" if sd and mean else "")

for f, t, r, nbytes in rows:
    cells = [cell(r[c]) if c in r else "-" for c in cols]
    lc = r.get("llama.cpp", (None,))[0]
    ratios = [f"{r[l][0] / lc:.2f}x" if lc and l in r else "-" for l in labels]
    bw = [f"{nbytes * r[l][0] / 1e9:,.0f}" if t == "tg128" and nbytes and l in r else "-"
          for l in labels]
    print(f"| {f} | {t} | " + " | ".join(cells + ratios + bw) + " |")
PY
[ "$stopped" = 1 ] && exit 143
exit 0
