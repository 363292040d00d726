"""The coverage matrix of `tiermem bench transparent` (issue 16): unmodified programs of several
kinds, each run plainly, then under `tiermem run` with budgets of 2x, 0.7x and 0.5x the most GPU
memory it held; each capped run passes if it exits 0 and its result is bitwise the plain run's
(the programs in bench/matrix/ print a sha256 of what they computed).

Programs (the issue's list, run by default): a CUDA C program built by nvcc with its defaults
(the runtime linked statically), a cuBLAS GEMM loop, a CUDA-graph replay, CuPy,
torch.multiprocessing sharing a CUDA tensor, and 100,000 small buffers (PyTorch with its caching
allocator off). Beyond it (`--programs extended`, or by name): Hugging Face training (GPT-2
medium's shape, bf16 autocast) and greedy decoding (a 2B Llama-style model, the KV cache
growing), a CNN with cuDNN, torch.compile (Inductor's Triton kernels), two CUDA streams
joined by events, the CUDA-graph replay on PyTorch's cudaMallocAsync backend (the capture's
allocations stream-ordered), and a tour of the CUDA runtime API in C (pitched 2D buffers, a texture,
interior pointers, pointer attributes, event-ordered streams, host functions, stream-ordered and
managed allocations, four threads allocating at once, the errors of bad frees), Numba's
CUDA target (kernels compiled from Python, launched through the driver API Numba loads itself),
a C program that makes contexts of its own as PyCUDA does (cuCtxCreate; one destroyed with
memory never freed, two alive at once, one synchronized while the other's kernels run), and one
that allocates in stream order from a memory pool of its own, as RAPIDS' async resource does,
one whose compute buffers are VMM chunks it maps itself beside cudaMalloc'd weights, as
llama.cpp's CUDA backend does, a training loop fed by a DataLoader's forked workers with pinned
batches, a torchrun script run as one process (NCCL, DistributedDataParallel), data parallelism
over two GPUs in two processes with an all-reduce captured in a CUDA graph and a memory pool
registered with NCCL (skipped on one GPU), and a
serving-like loop mixing a captured decoder's replays with eager kernels and a synchronization
per step, `torch.compile(mode="reduce-overhead")` (Inductor's kernels replayed as CUDA graph
trees, two shapes), and fp16 training with a GradScaler, clipping and a schedule.
A program whose requirements are missing (nvcc, CuPy, Numba) is listed under
`skipped` with the reason.

Usage: python3 bench/transparent_matrix.py --tiermem dist/tiermem --out FILE [--programs a,b|extended|all]
       [--run-args="--torch-allocator"]   (more arguments for `tiermem run`, e.g. the PyTorch route)
Writes {"programs": {name: {run: {...}}}, "checks": {"matrix_<name>_<budget>": bool}, "skipped": {...}}.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent / "matrix"
BUDGETS = {"fits": 2.0, "0_7": 0.7, "0_5": 0.5}
TIMEOUT_S = 300


def nvcc_program(source, *flags):
    """Builds `source` with nvcc's defaults (the runtime linked statically) and `flags`: a maker
    of the command, or of the reason it cannot be."""
    def make():
        nvcc = shutil.which("nvcc") or next((p for p in ["/usr/local/cuda/bin/nvcc"] if os.path.exists(p)), None)
        if nvcc is None:
            return None, "nvcc not found"
        binary = Path(tempfile.mkdtemp(prefix="tiermem-matrix-")) / Path(source).stem
        built = subprocess.run([nvcc, "-O2", "-o", str(binary), str(HERE / source), *flags], capture_output=True, text=True)
        if built.returncode != 0:
            return None, f"nvcc failed: {built.stderr.strip()[-400:]}"
        return [str(binary)], None
    return make


def python_program(name, *args):
    return lambda: ([sys.executable, str(HERE / name), *args], None)


PROGRAMS = {
    "cuda_c_static_runtime": nvcc_program("vecadd.cu"),
    "cublas_gemm_loop": python_program("gemm_loop.py"),
    "cuda_graph_replay": python_program("cuda_graph.py"),
    "cupy": python_program("cupy_prog.py"),
    "torch_multiprocessing": python_program("mp_share.py"),
    "small_buffers": python_program("small_buffers.py"),
}
EXTENDED = {
    "hf_train": python_program("hf_train.py"),
    "hf_decode": python_program("hf_decode.py"),
    "cnn_train": python_program("cnn_train.py"),
    "torch_compile": python_program("compiled.py"),
    "two_streams": python_program("two_streams.py"),
    "cuda_graph_async": python_program("cuda_graph_async.py"),
    "cuda_api_tour": nvcc_program("api_tour.cu"),
    "numba": python_program("numba_prog.py"),
    "own_contexts": nvcc_program("own_context.cu", "-lcuda"),
    "created_pool": nvcc_program("created_pool.cu"),
    "vmm_pool": nvcc_program("vmm_pool.cu", "-lcuda"),
    "dataloader": python_program("dataloader.py"),
    "ddp_one": python_program("ddp_one.py"),
    "ddp_pair": python_program("ddp_pair.py"),
    "jax_train": python_program("jax_train.py"),
    "graph_serving": python_program("graph_serving.py"),
    "compiled_graphs": python_program("compiled_graphs.py"),
    "amp_scaler": python_program("amp_scaler.py"),
    "math_libs": python_program("math_libs.py"),
    "cupy_libs": python_program("cupy_libs.py"),
    "cuda_python": python_program("cuda_python.py"),
    "cuda_python_ptds": python_program("cuda_python.py", "--ptds"),
}


def run(command, env=None):
    """Runs `command`: its exit status, seconds, the last JSON object it printed, and its stderr's tail."""
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, env=env, cwd=HERE)
        code, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as e:
        code, out, err = "timeout", (e.stdout or b"").decode(errors="replace"), (e.stderr or b"").decode(errors="replace")
    report = None
    for line in reversed(out.splitlines()):
        try:
            report = json.loads(line)
            break
        except json.JSONDecodeError:
            continue
    said = [line for line in err.splitlines() if line.startswith("tiermem:")][:60]  # --stats, warnings
    return {"exit": code, "seconds": round(time.perf_counter() - started, 3), "report": report, "stderr_tail": err[-600:],
            "tiermem_said": said}


def why_failed(capped, plain_report):
    """Why a capped run is not the plain one, in a few words: its exit, or where its results differ."""
    if capped["exit"] != 0:
        last = capped["stderr_tail"].strip().splitlines()[-1:] or ["nothing on stderr"]
        return f": exit {capped['exit']}, {last[0][:200]}"
    mine, theirs = (capped["report"] or {}).get("losses"), plain_report.get("losses")
    if mine and theirs:
        first = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), None)
        if first is not None:
            return f": losses differ from step {first} ({mine[first]!r} against {theirs[first]!r})"
    return ": other bytes (digest differs)"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiermem", required=True, help="the tiermem program (its `run` interposes)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--programs", default=",".join(PROGRAMS),
                        help="comma-separated names, `extended` or `all`; of " + ",".join({**PROGRAMS, **EXTENDED}))
    parser.add_argument("--run-args", default="", help="more arguments for `tiermem run`, split at spaces")
    args = parser.parse_args()
    known = {**PROGRAMS, **EXTENDED}
    groups = {"all": list(known), "extended": list(EXTENDED)}
    names = [n for name in args.programs.split(",") for n in groups.get(name, [name])]
    for name in names:
        if name not in known:
            parser.error(f"--programs: unknown {name!r}; choose among {list(known)}, `extended` or `all`")
    results = {"programs": {}, "checks": {}, "skipped": {}, "run_args": args.run_args.split()}
    for name in names:
        command, why = known[name]()
        if command is None:
            results["skipped"][name] = why
            print(f"matrix: {name}: skipped ({why})", flush=True)
            continue
        plain = run(command)
        runs = {"plain": plain}
        report = plain["report"] or {}
        if "skipped" in report:
            results["skipped"][name] = report["skipped"]
            print(f"matrix: {name}: skipped ({report['skipped']})", flush=True)
            continue
        if plain["exit"] != 0 or "digest" not in report:
            results["programs"][name] = runs
            for label in BUDGETS:
                results["checks"][f"matrix_{name}_{label}"] = False
            print(f"matrix: {name}: the plain run failed ({plain['exit']}): {plain['stderr_tail'][-200:]}", flush=True)
            continue
        for label, share in BUDGETS.items():
            budget = max(int(report["peak_bytes"] * share), 2 << 20)
            capped = run([args.tiermem, "run", "--hbm-limit", str(budget), *args.run_args.split(), "--", *command])
            capped["budget_bytes"] = budget
            runs[label] = capped
            same = capped["exit"] == 0 and (capped["report"] or {}).get("digest") == report["digest"]
            results["checks"][f"matrix_{name}_{label}"] = same
            print(f"matrix: {name} at {label} ({budget} bytes): {'identical' if same else 'FAILED'} "
                  f"in {capped['seconds']} s (plain {plain['seconds']} s){'' if same else why_failed(capped, report)}",
                  flush=True)
            results["programs"][name] = runs
            Path(args.out).write_text(json.dumps(results, indent=2) + "\n")  # after each run: a timeout loses none
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
