"""JAX: an MLP trained by hand-written Adam under `jax.jit` (XLA's kernels, XLA's allocator), its
deterministic mode on so that runs compare bitwise. Eight 4096×4096 layers: parameters, moments
and gradients ~2 GiB, a batch of 2048 rows."""
import os
import sys

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_gpu_deterministic_ops=true").strip()
try:
    import jax
    import jax.numpy as jnp
except ImportError:
    print('{"skipped": "JAX is not installed"}')
    sys.exit(0)
if not any(d.platform == "gpu" for d in jax.devices()):
    print('{"skipped": "JAX has no GPU backend here"}')
    sys.exit(0)

import numpy as np  # noqa: E402

from common import report  # noqa: E402

LAYERS, WIDTH, BATCH, STEPS = 8, 4096, 2048, 20


def forward(params, x):
    for w in params[:-1]:
        x = jax.nn.gelu(x @ w)
    return x @ params[-1]


def loss_of(params, x, y):
    return jnp.mean((forward(params, x) - y) ** 2)


@jax.jit
def step(params, m, v, t, x, y):
    loss, grads = jax.value_and_grad(loss_of)(params, x, y)
    m = [0.9 * a + 0.1 * g for a, g in zip(m, grads)]
    v = [0.999 * a + 0.001 * g * g for a, g in zip(v, grads)]
    scale = 1e-3 * jnp.sqrt(1 - 0.999**t) / (1 - 0.9**t)
    params = [p - scale * a / (jnp.sqrt(b) + 1e-8) for p, a, b in zip(params, m, v)]
    return params, m, v, loss


keys = jax.random.split(jax.random.PRNGKey(0), LAYERS + 2)
params = [jax.random.normal(k, (WIDTH, WIDTH), jnp.float32) / np.sqrt(WIDTH) for k in keys[:LAYERS]]
m = [jnp.zeros_like(p) for p in params]
v = [jnp.zeros_like(p) for p in params]
losses = []
for t in range(1, STEPS + 1):
    x = jax.random.normal(jax.random.fold_in(keys[-2], t), (BATCH, WIDTH), jnp.float32)
    y = jnp.tanh(x[:, ::-1])
    params, m, v, loss = step(params, m, v, t, x, y)
    losses.append(float(loss))
result = np.concatenate([np.asarray(p).ravel()[::4096] for p in params] + [np.asarray(losses, np.float32)])
stats = jax.devices()[0].memory_stats() or {}
report("jax_train", result.tobytes(), stats.get("peak_bytes_in_use", 0), losses=losses,
       bytes_limit=stats.get("bytes_limit"), pool_bytes=stats.get("pool_bytes"))
