"""The ClientApp: each SuperNode trains the global model on its partition and sends it back.
`report` hands the round's training loss and time to edgebed's records (a no-op elsewhere)."""

import time

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from edgebed_flower.task import Net, load_partition, report, train as train_fn

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    torch.set_num_threads(1)
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    loader = load_partition(int(context.node_config["partition-id"]), int(context.node_config["num-partitions"]),
                            int(context.run_config["batch-size"]))
    started = time.perf_counter()
    loss = train_fn(model, loader, int(context.run_config["local-epochs"]), float(msg.content["config"]["lr"]))
    report(int(msg.content["config"]["server-round"]), loss=loss, train_seconds=time.perf_counter() - started)
    metrics = MetricRecord({"train_loss": loss, "num-examples": len(loader.dataset)})
    return Message(content=RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics}),
                   reply_to=msg)
