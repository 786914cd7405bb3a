"""The distributed helpers that need no process group: the split of a step over the ranks, the
launch environment, and the trainers that refuse to run on several processes; and, in a process
group of one, how a DCP checkpoint is published."""

from __future__ import annotations

import pytest

from dsv32.distributed import DistError, Share, World, rank_share, require_one_process, setup, world
from dsv32.distributed.group import timeout_s

LAUNCH = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}


def _order(G: int, B: int, W: int) -> list[tuple[int, int]]:
    """(micro-batch, row) of every sequence the W ranks read, rank by rank."""
    return [
        (s.micro, row)
        for r in range(W)
        for s in rank_share(G, B, World(r, W, r, True))
        for row in range(s.start, s.stop)
    ]


@pytest.mark.parametrize(
    "G,B,W", [(4, 3, 2), (2, 4, 2), (1, 6, 3), (6, 1, 3), (3, 4, 4), (2, 2, 1), (4, 4, 8)]
)
def test_every_sequence_of_a_step_is_read_once_in_the_single_process_order(G, B, W):
    single = [(m, row) for m in range(G) for row in range(B)]
    got = _order(G, B, W)
    assert sorted(got) == single  # none twice, none dropped
    if (G, B, W) != (3, 4, 4):  # equal contiguous parts: rank r the r-th (else row slices)
        assert got == single
    shares = [rank_share(G, B, World(r, W, r, True)) for r in range(W)]
    assert len({sum(s.rows for s in part) for part in shares}) == 1  # the same work on every rank
    assert len({len(part) for part in shares}) == 1  # and as many forward passes
    if G % W == 0:  # whole micro-batches
        assert all(s.rows == B for part in shares for s in part)


@pytest.mark.parametrize("G,B,W", [(3, 1, 2), (2, 3, 4), (1, 3, 2)])
def test_a_step_that_does_not_split_is_refused(G, B, W):
    with pytest.raises(DistError, match=f"does not split over {W} processes: make grad_accum or batch_size"):
        rank_share(G, B, World(0, W, 0, True))
    assert rank_share(3, 1, World()) == [Share(0, 0, 1), Share(1, 0, 1), Share(2, 0, 1)]


def test_a_plain_process_is_rank_0_of_1_and_setup_does_nothing(monkeypatch):
    for var in LAUNCH:
        monkeypatch.delenv(var, raising=False)
    assert setup() == World() == world()
    assert world().main and not world().active
    require_one_process("GRPO")  # no launch: fine


def test_a_one_process_command_names_every_trainer_that_runs_on_several(monkeypatch):
    for var, value in LAUNCH.items():
        monkeypatch.setenv(var, value)
    with pytest.raises(DistError, match="dsv32 demo runs in one process, not under a launch of 2") as err:
        require_one_process("dsv32 demo")
    assert "agentic GRPO (posttrain rl) train on several" in str(err.value)
    monkeypatch.setenv("WORLD_SIZE", "1")
    require_one_process("dsv32 demo")


def test_agentic_grpo_checks_that_its_items_split_sample_in_process_and_run_no_ray():
    from dsv32.rl.agentic.config import load_agentic_config
    from dsv32.rl.agentic.trainer import check_agentic_world

    cfg = load_agentic_config(None, ["grpo.prompts_per_step=6"])
    check_agentic_world(cfg, World())  # one process: anything goes
    check_agentic_world(cfg, World(1, 3, 1, True))
    with pytest.raises(DistError, match="prompts_per_step=6 does not split over 4 processes by whole groups"):
        check_agentic_world(cfg, World(0, 4, 0, True))
    cfg.rl.ray.address = "127.0.0.1:6379"
    check_agentic_world(cfg, World())
    with pytest.raises(DistError, match=r"\[ray\] address='127.0.0.1:6379': on several processes"):
        check_agentic_world(cfg, World(0, 2, 0, True))
    cfg.rl.ray.address = ""
    cfg.rl.engine.kind = "remote"
    with pytest.raises(DistError, match="samples in process"):
        check_agentic_world(cfg, World(0, 2, 0, True))


def test_grpo_checks_that_its_groups_split_and_that_it_samples_in_process():
    from dsv32.rl.grpo.build import check_world
    from dsv32.rl.grpo.config import RLConfig

    cfg = RLConfig()
    cfg.grpo.prompts_per_step = 6
    check_world(cfg, World())  # one process: anything goes
    check_world(cfg, World(1, 3, 1, True))
    with pytest.raises(DistError, match="prompts_per_step=6 does not split over 4 processes by whole groups"):
        check_world(cfg, World(0, 4, 0, True))
    cfg.engine.kind = "remote"
    with pytest.raises(DistError, match="samples in process"):
        check_world(cfg, World(0, 2, 0, True))


def test_the_collectives_of_one_process_are_the_values_themselves():
    from dsv32.distributed import all_gather_objects, all_max

    assert all_max([1.0, -2.0]) == [1.0, -2.0] and all_gather_objects({"a": 1}) == [{"a": 1}]


def test_a_group_samples_the_same_whatever_else_is_in_the_batch():
    """Each task's group on a generator of its own: what a rank holding some of the step's groups
    samples for them is what one process samples for them in the whole batch."""
    import torch

    pytest.importorskip("transformers")
    from dsv32.rl.grpo.policy import load_policy
    from dsv32.rl.grpo.rollout import SamplingConfig, rollout
    from dsv32.rl.grpo.tasks import Task

    policy = load_policy("tiny-llama", device="cpu")
    tasks = [Task(id=f"t{i}", domain="toy", prompt=p) for i, p in enumerate(["ab", "hello there", "q"])]
    sampling = SamplingConfig(temperature=1.0, top_p=0.9, max_new_tokens=6)

    def gens(*keys):
        return [torch.Generator().manual_seed(k) for k in keys]

    whole = rollout(policy, tasks, 2, sampling, group_generators=gens(0, 1, 2))
    part = rollout(policy, tasks[1:], 2, sampling, group_generators=gens(1, 2))
    assert whole.completions[2:] == part.completions
    mask = part.action_mask
    T = mask.shape[1]
    torch.testing.assert_close(whole.sampling_logprobs[2:, :T][mask], part.sampling_logprobs[mask])
    # the in-process engine samples all groups in one batched call (a generator per row); another
    # engine gets one call per group: the same samples
    from dsv32.rl.engines import InProcessEngine

    class PerGroup(InProcessEngine):  # samples as an engine in another process: one seed per call
        name = "per_group"
        shares_weights = False
        calls = 0

        def generate(self, prompts, **kw):
            PerGroup.calls += 1
            return super().generate(prompts, **kw)

    apart = rollout(policy, tasks, 2, sampling, group_generators=gens(0, 1, 2), engine=PerGroup(policy.model))
    assert PerGroup.calls == 3 and apart.completions == whole.completions
    shared = rollout(policy, tasks, 2, sampling, generator=torch.Generator().manual_seed(1))
    assert shared.completions != whole.completions  # one stream for the batch samples otherwise
    with pytest.raises(ValueError, match="2 generators for 3 tasks"):
        rollout(policy, tasks, 2, sampling, group_generators=gens(0, 1))


@pytest.mark.parametrize("raw,ok", [(None, 600.0), ("45", 45.0), ("0", None), ("x", None), ("-3", None)])
def test_the_process_group_timeout_comes_from_the_environment(monkeypatch, raw, ok):
    if raw is None:
        monkeypatch.delenv("DSV32_DIST_TIMEOUT", raising=False)
    else:
        monkeypatch.setenv("DSV32_DIST_TIMEOUT", raw)
    if ok is None:
        with pytest.raises(DistError, match="DSV32_DIST_TIMEOUT"):
            timeout_s()
    else:
        assert timeout_s() == ok


def test_the_demo_refuses_a_launch_of_several_processes(monkeypatch):
    """It trains both stages on one model in one process (a sharded model keeps its first trainable set)."""
    for var, value in LAUNCH.items():
        monkeypatch.setenv(var, value)
    from dsv32.train.dsa.pipeline import run_demo

    with pytest.raises(DistError, match="dsv32 demo runs in one process"):
        run_demo()


@pytest.fixture
def one_process_group():
    """A gloo process group of this process alone: the distributed checkpoint's DCP path, in-process."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_a_dcp_checkpoint_is_published_where_a_folder_cannot_be_synced(
    tmp_path, monkeypatch, one_process_group
):
    """A file system that refuses to sync a directory (EINVAL, as some network mounts answer): the
    checkpoint is still published (renamed into place, pruned to ``keep``) and resumes."""
    import errno
    import json
    import os
    import stat

    import torch

    from dsv32.distributed import ShardedCheckpoints
    from dsv32.distributed.checkpoint import is_dcp

    real_fsync, refused = os.fsync, []

    def fsync(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            refused.append(fd)
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)

    def model_and_optimizer(seed):
        torch.manual_seed(seed)
        model = torch.nn.Linear(4, 3)
        return model, torch.optim.AdamW(model.parameters(), lr=0.1)

    model, opt = model_and_optimizer(0)
    model(torch.ones(1, 4)).sum().backward()
    opt.step()
    run = {"model": {"name": "m"}}
    assert world().active and world().size == 1
    ckpts = ShardedCheckpoints(tmp_path, keep=1, run=run)
    for step in (1, 2, 2):  # the same step again replaces the published one
        path = ckpts.save(step, model, opt)
    assert refused
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000002"] == [path.name]
    assert is_dcp(path) and (path / "rng_rank00000.pt").is_file()
    state = json.loads((path / "state.json").read_text())
    assert (state["step"], state["world_size"], state["run"]) == (2, 1, run)
    fresh, fresh_opt = model_and_optimizer(1)
    assert ShardedCheckpoints(tmp_path, run=run).begin(fresh, fresh_opt, resume=True, steps=3) == 2
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values()))
