"""Tests of sortpack.torch.GoodputController on a real index and a problem with a known noise scale."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

torch = pytest.importorskip("torch")

from sortpack.torch import GoodputController, PackedBatchSampler  # noqa: E402

from support import run_gloo_ranks, run_sortpack  # noqa: E402

pytestmark = pytest.mark.torch
ROOT = Path(__file__).resolve().parents[2]
D, N, MICRO = 8, 4096, 8


class FakeClock:
    """A clock the test advances: 1 s per micro-batch, 6 s of fixed cost per optimizer step."""

    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture(scope="module")
def regression(tmp_path_factory):
    """A real index of N one-token samples packed 8 per micro-batch, and the regression data."""
    tmp = tmp_path_factory.mktemp("goodput")
    pq.write_table(pa.table({"n": np.ones(N, dtype=np.int64)}), tmp / "data.parquet")
    run_sortpack(["run", tmp / "data.parquet", "-o", tmp / "ix", "--size", "column:n",
                  "--max-tokens", str(MICRO), "--quiet"])
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N, D))
    w_true = rng.standard_normal(D)
    y = x @ w_true + rng.normal(0.0, 1.0, N)
    return tmp / "ix", torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(w_true)


def _train(problem, w0, steps, lr, state=None, **ctl_kw):
    """Run `steps` steps on ``problem`` (index, x, y); return (controller, sampler, model, optimizer, clock)."""
    ix, x, y = problem
    model = torch.nn.Linear(D, 1, bias=False).double()
    with torch.no_grad():
        model.weight.copy_(w0[None])
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    sampler = PackedBatchSampler(ix, rank=0, world_size=1, grad_accum=2, order="shuffle", seed=0)
    clock = FakeClock()
    kw = {"min_accum": 2, "max_accum": 16, "warmup_steps": 5, "interval": 5, "clock": clock, **ctl_kw}
    ctl = GoodputController(model, sampler, opt, **kw)
    if state is not None:
        sampler.load_state_dict(state["sampler"])
        ctl.load_state_dict(state["controller"])
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        clock.t = state["clock"]
    done, epoch = 0, sampler.epoch
    while done < steps:
        sampler.set_epoch(epoch)
        for mb in sampler:
            ids = torch.as_tensor(np.asarray(mb, dtype=np.int64))
            loss = 0.5 * ((model(x[ids])[:, 0] - y[ids]) ** 2).mean()
            clock.t += 1.0
            if ctl.backward(loss, len(ids)):
                clock.t += 6.0
                opt.step()
                opt.zero_grad()
                done += 1
                if done == steps:
                    break
        epoch += 1
    return ctl, sampler, model, opt, clock


def test_noise_scale_matches_the_exact_value(regression):
    ix, x, y, w_true = regression
    w0 = w_true + 0.3
    # the exact |G|^2 and tr(Sigma) of per-sample gradients over this finite dataset at w0
    g = x * (x @ w0 - y)[:, None]
    mean = g.mean(0)
    truth = float((g - mean).pow(2).sum(1).mean() / mean.pow(2).sum())
    ctl, _, model, _, _ = _train((ix, x, y), w0, 200, lr=0.0, min_accum=4, max_accum=4)
    values = [h["noise_scale"] for h in ctl.history]
    assert torch.equal(model.weight.detach()[0], w0)  # lr 0: the point stays fixed
    assert np.mean(values[20:]) == pytest.approx(truth, rel=0.15)


def test_grad_accum_grows_as_the_loss_falls(regression):
    ix, x, y, w_true = regression
    ctl, sampler, *_ = _train((ix, x, y), w_true + 2.0, 120, lr=0.05)
    accums = [h["grad_accum"] for h in ctl.history]
    noise = [h["noise_scale"] for h in ctl.history]
    assert accums[0] == 2 and accums[-1] >= 3 * accums[0]
    assert np.mean(accums[-20:]) > np.mean(accums[5:25]) + 2  # the loss falls, the noise scale rises
    assert np.mean(noise[-10:]) > 5 * np.mean(noise[5:15])
    assert sampler.grad_accum >= accums[-1]


def test_resume_restores_the_controller_exactly(regression):
    ix, x, y, w_true = regression
    w0 = w_true + 2.0
    whole, *_ = _train((ix, x, y), w0, 60, lr=0.05)
    ctl, sampler, model, opt, clock = _train((ix, x, y), w0, 30, lr=0.05)
    state = {"sampler": sampler.state_dict(), "controller": ctl.state_dict(), "model": model.state_dict(),
             "opt": opt.state_dict(), "clock": clock.t}
    resumed, *_ = _train((ix, x, y), w0, 0, lr=0.05, state=state)
    assert resumed.state_dict() == state["controller"]
    resumed, *_ = _train((ix, x, y), w0, 30, lr=0.05, state=state)
    # the same decisions and estimates; only the first step after a resume goes untimed
    assert resumed.history == whole.history


def test_one_process_needs_two_microbatches(regression):
    ix, *_ = regression
    model = torch.nn.Linear(D, 1)
    sampler = PackedBatchSampler(ix, rank=0, world_size=1)
    with pytest.raises(ValueError, match="min_accum >= 2"):
        GoodputController(model, sampler, torch.optim.SGD(model.parameters(), lr=0.1), min_accum=1)


def test_the_controller_leaves_no_reference_cycle(regression):
    # hooks that held the controller strongly made model and controller garbage that only the
    # collector frees; a DDP model freed that late (at exit) aborted a rank in CI
    import gc
    import weakref

    ix, x, y, w_true = regression
    ctl, _, model, opt, _ = _train((ix, x, y), w_true + 0.3, 3, lr=0.0)
    refs = [weakref.ref(o) for o in (ctl, model, opt)]
    gc.disable()
    try:
        del ctl, model, opt
        assert [r() for r in refs] == [None, None, None]
    finally:
        gc.enable()


@pytest.mark.slow
def test_ddp_noise_scale_matches_the_exact_value(regression):
    ix = regression[0]
    out = run_gloo_ranks([str(ROOT / "tests" / "train" / "goodput_ddp_worker.py"), str(ix), "3"])[0]
    line = next(line for line in out.splitlines() if line.startswith("rank 0 truth"))
    truth, estimate = float(line.split()[3]), float(line.split()[5])
    assert estimate == pytest.approx(truth, rel=0.15)


@pytest.mark.slow
def test_two_gloo_ranks_choose_the_same_accumulation(tmp_path):
    from support import write_text_parquet

    rng = np.random.default_rng(3)
    write_text_parquet(tmp_path / "t.parquet", rng.integers(5, 120, 400))
    run_sortpack(["run", tmp_path / "t.parquet", "-o", tmp_path / "ix", "--column", "text",
                  "--max-tokens", "256", "--quiet"])
    outs = run_gloo_ranks([str(ROOT / "examples" / "train_tiny.py"), str(tmp_path / "ix"), "--steps", "12",
                       "--goodput", "--max-accum", "4"])
    chosen = [[line.split(" grad_accum ")[1].split()[0] for line in out.splitlines()
               if line.startswith(f"rank {r} step")] for r, out in enumerate(outs)]
    assert len(chosen[0]) == 12 and chosen[0] == chosen[1], outs
    assert "goodput:" in outs[0]
