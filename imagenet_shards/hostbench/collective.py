"""Gather each instance's figures to rank 0 (torch.distributed, gloo); a no-op for a single instance."""

import os


class Collective:
    """Gathers each instance's figures (torch.distributed gloo); a no-op for a single instance."""

    def __init__(self, instance, init_method: str | None = None):
        self.instance = instance
        self.dist = None
        self.owns_group = False
        self.warning = ""
        if instance.count <= 1:
            return
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            self.dist = dist
            return
        if init_method is None and not ("MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ):
            self.warning = (f"{instance.describe()}: no MASTER_ADDR/MASTER_PORT and no --rendezvous: each instance "
                            f"reports only its own figures (no aggregate)")
            return
        dist.init_process_group("gloo", init_method=init_method or "env://", rank=instance.index,
                                world_size=instance.count)
        self.dist = dist
        self.owns_group = True

    @property
    def is_reporter(self) -> bool:
        """Whether this instance prints: rank 0, or every instance when figures cannot be gathered."""
        return self.dist is None or self.instance.index == 0

    def gather(self, obj) -> list:
        if self.dist is None:
            return [obj]
        gathered = [None] * self.instance.count
        self.dist.all_gather_object(gathered, obj)
        return gathered

    def barrier(self) -> None:
        if self.dist is not None:
            self.dist.barrier()

    def close(self) -> None:
        if self.owns_group:
            self.dist.destroy_process_group()
            self.owns_group = False
