"""torch.multiprocessing sharing a CUDA tensor with a child process (CUDA IPC handles): the
child reads it and writes to it, the parent reads what the child wrote."""
import torch
import torch.multiprocessing as mp

from common import report


def child(queue, out):
    try:
        tensor = queue.get(timeout=20)
        total = float(tensor.double().sum())
        tensor.add_(1.0)
        torch.cuda.synchronize()
        out.put(total)
    except Exception as e:  # noqa: BLE001 - reported to the parent, which fails
        out.put(f"child: {type(e).__name__}: {e}")


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    queue, out = ctx.Queue(), ctx.Queue()
    worker = ctx.Process(target=child, args=(queue, out))
    worker.start()
    torch.manual_seed(0)
    tensor = torch.randn(16 << 20, device="cuda")  # 64 MiB
    queue.put(tensor)  # pickled on a feeder thread: a failed IPC handle shows only in the child
    try:
        total = out.get(timeout=120)
    finally:
        worker.join(timeout=10)
        if worker.is_alive():
            worker.kill()
    if isinstance(total, str):
        raise SystemExit(f"torch_multiprocessing: {total}")
    written = float(tensor.double().sum())  # the child's writes, seen through the parent's pointer
    report("torch_multiprocessing", repr((total, written)).encode(), torch.cuda.max_memory_reserved())
