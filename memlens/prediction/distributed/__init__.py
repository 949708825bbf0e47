"""Sharded multi-GPU training predicted per rank on the CPU: `memlens.predict(step, world_size=N)`.

`ranks.predict_ranks` runs the user's code as each predicted rank under torch's fake process group
(`environment.rank_world`); DDP's buckets are modelled in `ddp`, NCCL's own memory is an allowance in `nccl`;
``torch.distributed.pipelining`` schedules run as written, every stage rank predicted (`pipeline`).
"""
from memlens.prediction.distributed.nccl import nccl_allowance
from memlens.prediction.distributed.ranks import DistributedPrediction, RankResult, predict_ranks

__all__ = ["predict_ranks", "DistributedPrediction", "RankResult", "nccl_allowance"]
