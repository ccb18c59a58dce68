"""A PyTorch DDP trainer that reads its batches through sluice (deploy/kubernetes/examples/pytorch-ddp).

torchrun starts it once per pod (one process per pod here; --nproc-per-node for GPUs): rank and
world size come from torch.distributed, and DataServiceDataset derives each DataLoader worker's
consumer index from them. Every epoch each rank gets the same number of batches and every record
is read once across all ranks. Connection settings come from the environment (the same names as
the sluice CLI): SLUICE_DISPATCHER, SLUICE_TLS_CA/CERT/KEY, SLUICE_TLS_SERVER_NAME,
SLUICE_AUTH_TOKEN_FILE. The dataset's state_dict (the next epoch) is checkpointed with the model
under CHECKPOINT_DIR, so a restarted Job continues at the next epoch.
"""
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader

import sluice
from sluice.torch import DataServiceDataset


def main() -> None:
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) \
        if backend == "nccl" else torch.device("cpu")

    dataset = DataServiceDataset(
        os.environ["SLUICE_DISPATCHER"], os.environ.get("SPEC", "/etc/sluice/pipelines/synthetic-train.yaml"),
        job=os.environ.get("SLUICE_JOB", "pytorch-ddp"), seed=0,
        tls=sluice.TLS.from_env(), dispatcher_lost_timeout=120)
    loader = DataLoader(dataset, batch_size=None, num_workers=int(os.environ.get("LOADER_WORKERS", 2)),
                        pin_memory=backend == "nccl")

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 7, stride=4), torch.nn.ReLU(),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                torch.nn.Linear(16, 10)).to(device)
    model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    checkpoint = os.path.join(os.environ.get("CHECKPOINT_DIR", "/tmp"), "checkpoint.pt")
    start = 0
    if os.path.exists(checkpoint):
        saved = torch.load(checkpoint, map_location=device)
        model.module.load_state_dict(saved["model"])
        dataset.load_state_dict(saved["data"])
        start = dataset.epoch

    for epoch in range(start, int(os.environ.get("EPOCHS", 2))):
        dataset.set_epoch(epoch)
        images = 0
        for batch in loader:
            x = batch["image"].to(device, non_blocking=True)
            y = batch["label"].to(device, non_blocking=True).long() % 10
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            images += x.shape[0]
        dataset.set_epoch(epoch + 1)
        if rank == 0:
            torch.save({"model": model.module.state_dict(), "data": dataset.state_dict()},
                       checkpoint)
        print(f"rank {rank}/{world} epoch {epoch}: {images} images, loss {loss.item():.3f}",
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
