"""Data parallelism over two GPUs, one process each (spawned, as torchrun or mp.spawn would):
DistributedDataParallel over NCCL for 20 steps (an MLP of 1 GiB, each rank its own batches),
then what makes NCCL take the memory of the program's buffers — a CUDA graph that captures an
all-reduce (NCCL may register a captured collective's buffers, NCCL_GRAPH_REGISTER) and, where
this PyTorch can register pools, a pool of PyTorch's own allocator registered with the
communicator (ncclCommRegister) and all-reduced from, then one of NCCL's allocator
(ncclMemAlloc). Under `tiermem run` the first pool's memory is tiermem's: the registration must
not keep pages tiermem moves (docs/transparent.md, "Registered buffers"); the second is NCCL's
own chunks, which tiermem counts and never moves. The losses of both ranks, rank 0's weights
and every all-reduce's bytes are digested; the report says which registering paths ran.
Skipped with fewer than two GPUs."""
import os
import pickle
import sys
import tempfile

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from common import report, train  # noqa: E402

WORLD = 2


def graph_all_reduce(rank):
    """An all-reduce captured in a CUDA graph with the scaling before it, replayed three times:
    the buffer's bytes after each replay."""
    buf = torch.arange(16 << 20, device="cuda", dtype=torch.float32).mul_(rank + 1)  # 64 MiB
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        dist.all_reduce(buf)  # warm-up outside the capture, as PyTorch asks
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        buf.mul_(0.25)
        dist.all_reduce(buf)
    seen = []
    for _ in range(3):
        graph.replay()
        seen.append(buf.cpu().numpy().tobytes())
    return b"".join(seen)


def pool_all_reduce(rank, from_nccl):
    """All-reduces from a memory pool registered with NCCL (`ncclCommRegister` for each of its
    segments), if this PyTorch can register one: the pool's memory from PyTorch's own allocator
    (cudaMalloc: under `tiermem run`, tiermem's memory) or, `from_nccl`, from NCCL's
    (`ncclMemAlloc`: NCCL's own VMM chunks). (bytes, whether it registered)."""
    backend = dist.group.WORLD._get_backend(torch.device("cuda"))
    if not (hasattr(torch.cuda, "MemPool") and hasattr(backend, "register_mem_pool")):
        return b"", False
    if from_nccl and not hasattr(backend, "mem_allocator"):
        return b"", False
    pool = torch.cuda.MemPool(backend.mem_allocator) if from_nccl else torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        buf = torch.full((32 << 20,), float(rank + 1), device="cuda")  # 128 MiB
    backend.register_mem_pool(pool)
    for _ in range(4):
        dist.all_reduce(buf)
    result = buf.cpu().numpy().tobytes()
    torch.cuda.synchronize()
    backend.deregister_mem_pool(pool)
    del buf
    return result, True


def worker(rank, out_dir, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=WORLD, device_id=torch.device("cuda", rank))
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(16)]).cuda()
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    optimizer = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    gen = torch.Generator(device="cuda").manual_seed(1 + rank)

    def loss_of(_step):
        x = torch.randn(512, 4096, device="cuda", generator=gen)
        return ddp(x).square().mean()

    losses, step_s = train(20, loss_of, optimizer)
    weights = torch.cat([p.detach().flatten() for p in model.parameters()]).cpu().numpy().tobytes()
    try:
        graph = graph_all_reduce(rank)
    except Exception as e:  # noqa: BLE001 - a PyTorch or NCCL that cannot capture: the same in every run
        graph = f"graph capture failed: {type(e).__name__}".encode()
    pooled, registered = pool_all_reduce(rank, from_nccl=False)
    pooled_nccl, registered_nccl = pool_all_reduce(rank, from_nccl=True)
    dist.barrier()
    peak = torch.cuda.max_memory_reserved()
    dist.destroy_process_group()
    mine = {"losses": losses, "weights": weights if rank == 0 else b"", "graph": graph, "pooled": pooled + pooled_nccl,
            "registered": registered, "registered_nccl": registered_nccl, "peak": peak, "step_s": step_s}
    with open(os.path.join(out_dir, f"rank{rank}.pickle"), "wb") as f:
        pickle.dump(mine, f)


if __name__ == "__main__":
    if torch.cuda.device_count() < WORLD:
        print('{"skipped": "needs two GPUs"}')
        sys.exit(0)
    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(worker, args=(out_dir, 29500 + os.getpid() % 1000), nprocs=WORLD, join=True)
        ranks = []
        for r in range(WORLD):
            with open(os.path.join(out_dir, f"rank{r}.pickle"), "rb") as f:
                ranks.append(pickle.load(f))
    digested = b"".join(repr(r["losses"]).encode() + r["weights"] + r["graph"] + r["pooled"] for r in ranks)
    report("ddp_pair", digested, max(r["peak"] for r in ranks), step_s=ranks[0]["step_s"],
           pool_registered=ranks[0]["registered"], nccl_pool_registered=ranks[0]["registered_nccl"],
           graph_captured=not ranks[0]["graph"].startswith(b"graph capture failed"))
