"""The CUDA-graph replay of cuda_graph.py on PyTorch's `cudaMallocAsync` backend: the capture's
tensors are stream-ordered allocations on the capturing stream (`cuMemAllocAsync`), which
tiermem serves without events and keeps for the graph (crates/preload/src/captures.rs)."""
import os
import runpy

os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "backend:cudaMallocAsync"
runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "cuda_graph.py"), run_name="__main__")
