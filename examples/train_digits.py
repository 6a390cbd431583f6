"""Train a small MLP on scikit-learn's digits with fusec: a whole training run on the GPU.

The data set (1797 8x8 images of handwritten digits, 10 classes) ships inside scikit-learn, so
this runs offline. Everything that happens per step stays on the device:

- the training set, the parameters and Adam's state are uploaded once and live on the device;
- each epoch, one jitted call draws a permutation of the training set (``fusec.random``);
- each step is ONE jitted call: it slices its minibatch out of that permutation, gathers the
  images and labels, runs the forward pass and the backward pass (``fusec.value_and_grad``) and
  applies Adam written with ``fusec.tree_util.tree_map``. The old parameters and optimizer state
  are donated, so the update is written into their buffers.

Only the step's position in the epoch (a Python int) goes up each step; the epoch's loss is
summed on the device and read back once per epoch.

Run:  python examples/train_digits.py [--epochs 20] [--batch-size 64] [--seed 0] [--quiet]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

import fusec
import fusec.numpy as fnp
from fusec import lax, nn, random
from fusec.tree_util import tree_map

Params = dict[str, Any]

LAYERS = (64, 128, 10)          # input pixels -> hidden -> classes
LEARNING_RATE = 3e-3
BETA1, BETA2, EPS = 0.9, 0.999, 1e-8
TEST_FRACTION = 0.25
SPLIT_SEED = 0                  # the train/test split is fixed; --seed changes init and order


# --- data -----------------------------------------------------------------------------------------


def load_data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The digits, split into train and test (stratified, fixed seed) and standardised with the
    training set's per-pixel mean and standard deviation."""
    from sklearn.datasets import load_digits  # type: ignore[import-untyped]
    from sklearn.model_selection import train_test_split  # type: ignore[import-untyped]

    digits = load_digits()
    x = digits.data.astype(np.float32)
    y = digits.target.astype(np.int32)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=TEST_FRACTION,
                                              random_state=SPLIT_SEED, stratify=y)
    mean = x_tr.mean(axis=0)
    std = x_tr.std(axis=0) + 1.0  # +1: some border pixels are always 0; keep their scale sane
    return (x_tr - mean) / std, y_tr, (x_te - mean) / std, y_te


# --- model ----------------------------------------------------------------------------------------


def init_params(key: Any, layers: Sequence[int] = LAYERS) -> Params:
    """He-initialised weights and zero biases, as a dict pytree ``{"w0", "b0", "w1", ...}``."""
    params: Params = {}
    keys = random.split(key, len(layers) - 1)
    for i, (n_in, n_out) in enumerate(zip(layers[:-1], layers[1:])):
        params[f"w{i}"] = random.normal(keys[i], (n_in, n_out)) * float(np.sqrt(2.0 / n_in))
        params[f"b{i}"] = fnp.zeros((n_out,), dtype="float32")
    return params


def forward(params: Params, x: Any) -> Any:
    """The logits of an MLP with ReLU between its layers."""
    n = len(params) // 2
    h = x
    for i in range(n):
        h = h @ params[f"w{i}"] + params[f"b{i}"]
        if i < n - 1:
            h = nn.relu(h)
    return h


def loss_fn(params: Params, x: Any, y: Any) -> Any:
    """Mean softmax cross-entropy of the logits against the integer labels ``y``."""
    logp = nn.log_softmax(forward(params, x))
    return -fnp.mean(fnp.sum(logp * nn.one_hot(y, LAYERS[-1]), axis=-1))


# --- optimizer ------------------------------------------------------------------------------------


def adam_init(params: Params) -> dict[str, Any]:
    """Adam's state: first and second moments shaped as the parameters, and the step count."""
    return {"m": tree_map(fnp.zeros_like, params), "v": tree_map(fnp.zeros_like, params),
            "t": fnp.zeros((), dtype="float32")}


def adam_update(params: Params, grads: Params, state: dict[str, Any],
                lr: float = LEARNING_RATE) -> tuple[Params, dict[str, Any]]:
    """One Adam step (Kingma & Ba), leaf by leaf with ``tree_map``."""
    t = state["t"] + 1.0
    m = tree_map(lambda m, g: BETA1 * m + (1.0 - BETA1) * g, state["m"], grads)
    v = tree_map(lambda v, g: BETA2 * v + (1.0 - BETA2) * g * g, state["v"], grads)
    # bias corrections folded into the step size
    step = lr * fnp.sqrt(1.0 - BETA2 ** t) / (1.0 - BETA1 ** t)
    new = tree_map(lambda p, m, v: p - step * m / (fnp.sqrt(v) + EPS), params, m, v)
    return new, {"m": m, "v": v, "t": t}


# --- the jitted calls -----------------------------------------------------------------------------


def init_state(key: Any) -> tuple[Params, dict[str, Any]]:
    """Parameters and optimizer state, drawn and zeroed on the device.

    Run eagerly (each op its own call), not as one ``gpu_jit``: a jitted function that returns
    equal values at several positions (the zero moments of equal-shaped leaves, merged by common
    subexpression elimination) hands back Arrays sharing one buffer, and donating them to
    ``train_step`` would then write several outputs into it. Separate calls give separate buffers.
    """
    params = init_params(key)
    return params, adam_init(params)


@fusec.gpu_jit(static_argnames=("n",))
def shuffle(key: Any, epoch: Any, n: int) -> Any:
    """A random order of the ``n`` training examples for this epoch (int32, on the device)."""
    return random.permutation(random.fold_in(key, epoch), n)


@fusec.gpu_jit(static_argnames=("batch_size",), donate_argnums=(0, 1, 2))
def train_step(params: Params, opt_state: dict[str, Any], loss_sum: Any, x: Any, y: Any,
               order: Any, start: Any, batch_size: int) -> tuple[Params, dict[str, Any], Any]:
    """One training step: the minibatch ``order[start:start + batch_size]``, its loss and
    gradient, and Adam's update. Returns the new parameters, the new optimizer state, and
    ``loss_sum`` plus the minibatch's loss (the epoch's running total, kept on the device)."""
    idx = lax.dynamic_slice(order, (start,), (batch_size,))
    loss, grads = fusec.value_and_grad(loss_fn)(params, x[idx], y[idx])
    params, opt_state = adam_update(params, grads, opt_state)
    return params, opt_state, loss_sum + loss


@fusec.gpu_jit
def evaluate(params: Params, x: Any, y: Any) -> tuple[Any, Any]:
    """Mean loss and accuracy (fraction correct) on a whole data set."""
    logits = forward(params, x)
    acc = fnp.mean((fnp.argmax(logits, axis=-1) == y).astype("float32"))
    return loss_fn(params, x, y), acc


# --- the run --------------------------------------------------------------------------------------


def train(epochs: int = 20, batch_size: int = 64, seed: int = 0, quiet: bool = False
          ) -> dict[str, Any]:
    """Train, evaluate, and return the results: ``test_accuracy``, ``train_accuracy``,
    ``losses`` (mean training loss per epoch), ``wall_s`` (the training loop, compilation
    included), ``steps``, ``steps_per_s``, ``steady_steps_per_s`` (after the first epoch) and
    ``step_cache`` (``fusec.cache_info()`` after the first epoch and at the end, to check that
    later steps compiled nothing)."""
    say = (lambda *a: None) if quiet else print
    x_tr, y_tr, x_te, y_te = load_data()
    n = len(x_tr)
    if not 1 <= batch_size <= n:
        raise ValueError(f"--batch-size must be between 1 and {n}; got {batch_size}")
    if epochs < 1:
        raise ValueError(f"--epochs must be at least 1; got {epochs}")
    steps_per_epoch = n // batch_size  # the last partial batch is left out: one static shape

    t0 = time.perf_counter()
    x_dev, y_dev = fusec.device_put(x_tr), fusec.device_put(y_tr)
    x_te_dev, y_te_dev = fusec.device_put(x_te), fusec.device_put(y_te)
    init_key, order_key = random.split(random.key(seed))
    params, opt_state = init_state(init_key)

    losses: list[float] = []
    after_first: Any = None
    t_first = t0
    for epoch in range(epochs):
        order = shuffle(order_key, epoch, n)
        total = fusec.device_put(np.float32(0.0))
        for s in range(steps_per_epoch):
            params, opt_state, total = train_step(params, opt_state, total, x_dev, y_dev, order,
                                                  s * batch_size, batch_size=batch_size)
        losses.append(float(np.asarray(total)) / steps_per_epoch)  # the epoch's one readback
        if not quiet and (epoch % 5 == 4 or epoch == epochs - 1 or epoch == 0):
            _, acc = evaluate(params, x_te_dev, y_te_dev)
            say(f"epoch {epoch + 1:3d}  train loss {losses[-1]:.4f}  "
                f"test accuracy {float(np.asarray(acc)):.4f}")
        if epoch == 0:
            after_first = fusec.cache_info()
            t_first = time.perf_counter()
    final_cache = fusec.cache_info()
    t_end = time.perf_counter()
    wall = t_end - t0

    test_loss, test_acc = (float(np.asarray(v)) for v in evaluate(params, x_te_dev, y_te_dev))
    _, train_acc = evaluate(params, x_dev, y_dev)
    steps = epochs * steps_per_epoch
    later = (epochs - 1) * steps_per_epoch
    result = {
        "test_accuracy": test_acc, "test_loss": test_loss,
        "train_accuracy": float(np.asarray(train_acc)), "losses": losses,
        "wall_s": wall, "steps": steps, "steps_per_s": steps / wall,
        # after the first epoch (which traces and compiles): the steady state
        "steady_steps_per_s": later / (t_end - t_first) if later else float("nan"),
        "step_cache": (after_first, final_cache),
    }
    dev = fusec.default_device()
    say(f"device: {dev.adapter} ({dev.backend})")
    say(f"final test accuracy {test_acc:.4f} (loss {test_loss:.4f}), train accuracy "
        f"{result['train_accuracy']:.4f}")
    say(f"{steps} steps in {wall:.2f} s (compilation included): {steps / wall:.1f} steps/s; "
        f"after the first epoch {result['steady_steps_per_s']:.1f} steps/s")
    return result


def main(argv: Sequence[str] | None = None) -> float:
    """Parse the flags, train, and return the final test accuracy."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true", help="print nothing")
    a = p.parse_args(argv)
    return float(train(a.epochs, a.batch_size, a.seed, a.quiet)["test_accuracy"])


if __name__ == "__main__":
    main(sys.argv[1:])
