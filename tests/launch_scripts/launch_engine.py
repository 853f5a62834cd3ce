"""A minimal engine for the trainer worker (``areal_cli.trainer.worker``) in tests/test_launch.py."""

import os


class AllReduceEngine:
    """Each rank adds its rank to ``x``; the all-reduced sum comes back from rank 0 with its node rank."""

    def all_reduce(self, x: float) -> dict:
        import torch
        import torch.distributed as dist

        t = torch.tensor([x + dist.get_rank()])
        dist.all_reduce(t)
        return {"sum": t.item(), "world": dist.get_world_size(), "node_rank": int(os.environ["GROUP_RANK"])}
