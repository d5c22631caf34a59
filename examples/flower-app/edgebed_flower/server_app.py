"""The ServerApp: FedAvg over every SuperNode for `num-server-rounds` rounds; the global model is
evaluated on held-out digits before the first round and after each. `report` (task.py) puts each
round's accuracy into edgebed's records (and does nothing when the app runs elsewhere)."""

import time

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from edgebed_flower.task import Net, load_held_out, report, test

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    torch.set_num_threads(1)
    cfg = context.run_config
    held_out = load_held_out()
    started = time.time()

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model = Net()
        model.load_state_dict(arrays.to_torch_state_dict())
        loss, accuracy = test(model, held_out)
        # round 0 is the initial model
        report(server_round, accuracy=accuracy, loss=loss, round_end_s=time.time() - started)
        return MetricRecord({"accuracy": accuracy, "loss": loss})

    strategy = FedAvg(fraction_train=float(cfg["fraction-train"]), fraction_evaluate=0.0)
    strategy.start(grid=grid, initial_arrays=ArrayRecord(Net().state_dict()), num_rounds=int(cfg["num-server-rounds"]),
                   train_config=ConfigRecord({"lr": float(cfg["lr"])}), evaluate_fn=evaluate)
