"""relive.agents.optimizers: torch's RMSprop / Adam steps, bit for bit, with the square roots of zero moments off the
CPU's slow path; torch's own step wherever the floor could change a value."""

import numpy as np
import pytest
import torch

from relive.agents.optimizers import SQRT_FLOOR, FloorSqrtAdam, FloorSqrtRMSprop, floor_is_exact

CONFIGS = [
    (torch.optim.RMSprop, FloorSqrtRMSprop, dict(lr=2.5e-4, alpha=0.95, eps=0.01, momentum=0.95, centered=True)),
    (torch.optim.RMSprop, FloorSqrtRMSprop, dict(lr=6.25e-5, alpha=0.95, eps=0.01, centered=True)),
    (torch.optim.RMSprop, FloorSqrtRMSprop, dict(lr=1e-3)),
    (torch.optim.Adam, FloorSqrtAdam, dict(lr=1e-4, eps=1.5e-4)),
    (torch.optim.Adam, FloorSqrtAdam, dict(lr=1e-3, betas=(0.5, 0.9))),
]


def _net() -> torch.nn.Sequential:
    g = torch.Generator().manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(4, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(512, 64),
                              torch.nn.ReLU(), torch.nn.Linear(64, 3))
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return net


def _train(cls, kw, steps=40, start=None):
    net = _net()
    opt = cls(net.parameters(), **kw)
    if start is not None:
        opt.load_state_dict(start)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        opt.zero_grad()
        net(torch.randn(16, 4, 10, 10, generator=g)).pow(2).mean().backward()
        net[3].weight.grad[:20] = 0  # units that never fire: their moments stay exactly 0
        net[3].bias.grad[:20] = 0
        opt.step()
    return net, opt


def _same(a, b) -> bool:
    sa, sb = a.state_dict()["state"], b.state_dict()["state"]
    return sa.keys() == sb.keys() and all(sa[i].keys() == sb[i].keys() and all(torch.equal(sa[i][k], sb[i][k])
                                                                               for k in sa[i]) for i in sa)


@pytest.mark.parametrize("torch_cls,cls,kw", CONFIGS)
def test_steps_are_torchs_bit_for_bit_with_zero_moments(torch_cls, cls, kw):
    a, oa = _train(torch_cls, kw)
    b, ob = _train(cls, kw)
    assert ob._plain()  # (the floored path ran, not torch's)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    assert _same(oa, ob)
    second = "exp_avg_sq" if torch_cls is torch.optim.Adam else "square_avg"
    assert (ob.state[b[3].weight][second][:20] == 0).all()  # (the zeros the floor is for were there)
    # a checkpoint of either loads into the other and the two go on alike
    a2, oa2 = _train(torch_cls, kw, steps=5, start=ob.state_dict())
    b2, ob2 = _train(cls, kw, steps=5, start=oa.state_dict())
    assert _same(oa2, ob2) and all(torch.equal(x, y) for x, y in zip(a2.parameters(), b2.parameters(), strict=True))


def test_the_floor_is_used_only_where_eps_absorbs_it():
    assert floor_is_exact(0.01) and floor_is_exact(1e-8) and floor_is_exact(1.5e-4, 1 / np.sqrt(1 - 0.999))
    assert not floor_is_exact(1e-30) and not floor_is_exact(0.0) and not floor_is_exact(float("inf"))
    # the bound itself: sqrt(floor) + eps rounds to eps in float32 where it says so
    for eps in (1e-8, 1e-6, 1.5e-4, 0.01, 1.0):
        assert floor_is_exact(eps)
        assert np.float32(np.sqrt(np.float32(SQRT_FLOOR))) + np.float32(eps) == np.float32(eps)
    # where it cannot promise that, torch's own step runs (and equals torch's)
    for cls, kw in ((FloorSqrtRMSprop, dict(lr=1e-3, eps=1e-30)), (FloorSqrtRMSprop, dict(lr=1e-3, weight_decay=0.1)),
                    (FloorSqrtRMSprop, dict(lr=1e-3, foreach=True)), (FloorSqrtAdam, dict(lr=1e-3, amsgrad=True)),
                    (FloorSqrtAdam, dict(lr=1e-3, eps=1e-30)), (FloorSqrtAdam, dict(lr=1e-3, foreach=True))):
        net, opt = _train(cls, kw, steps=3)
        assert not opt._plain()
        ref, _ = _train(cls.__mro__[1], kw, steps=3)
        assert all(torch.equal(x, y) for x, y in zip(net.parameters(), ref.parameters(), strict=True))


def test_a_centered_variance_rounded_below_zero_moves_the_weight_as_a_zero_variance():
    """square_avg - grad_avg**2 < 0 by rounding: torch's step writes NaN; this one the update of a zero variance,
    -lr * grad / eps (no momentum)."""
    kw = dict(lr=0.1, alpha=0.5, eps=0.01, centered=True)
    results = []
    for cls in (torch.optim.RMSprop, FloorSqrtRMSprop):
        p = torch.nn.Parameter(torch.zeros(1))
        opt = cls([p], **kw)
        opt.state[p] = {"step": torch.tensor(0.0), "square_avg": torch.ones(1), "grad_avg": torch.full((1,), 1.001)}
        p.grad = torch.full((1,), 1.001)
        opt.step()
        results.append(p.detach().clone())
    assert torch.isnan(results[0]).all()
    # square_avg -> 0.5 + 0.5 * 1.001**2, grad_avg -> 1.001: the variance is 0.5 * (1.001**2 - 1.001**2 ...) < 0
    assert results[1].item() == pytest.approx(-0.1 * 1.001 / 0.01, rel=1e-6)


def test_the_pixel_ddqn_presets_build_them():
    from relive.agents.ddqn import DDQN
    from relive.presets import get_preset

    for name, shape, cls in (("ddqn_minatar", (4, 10, 10), FloorSqrtRMSprop),
                             ("ddqn_atari", (4, 84, 84), FloorSqrtRMSprop),
                             ("ddqn_atari100k", (4, 84, 84), FloorSqrtAdam)):
        agent = DDQN(0, 3, get_preset(name).agent, seed=0, image=(shape, np.uint8))
        assert type(agent.opt) is cls and agent.opt._plain(), name
