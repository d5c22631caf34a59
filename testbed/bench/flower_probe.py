"""Flower's side of `edgebed bench flower`: FedAvg rounds in Flower's simulation engine (Ray).

Run by the Python of `.venv-flower` (`make flower-venv`: PyPI's flwr[simulation] with a path
to the main venv's torch), never imported by edgebed itself. Every client trains the same model
on the same data with the same steps as an edgebed worker does (testbed.data.models,
testbed.data.datasets), so the two frameworks differ only in what they do around the steps. Prints one
JSON line: each round's wall time and the clients' compute time in it.

    .venv-flower/bin/python -m testbed.bench.flower_probe --clients 4 --rounds 6 --local-steps 10
"""

from __future__ import annotations

import argparse
import json
import os
import time

# Per actor process (Ray reuses actors across rounds): the dataset is loaded once, as a Flower
# user would keep it in the ClientApp's module, not once per ephemeral client.
_DATA: dict = {}


def _data(dataset: str, seed: int):
    if dataset not in _DATA:
        import numpy as np
        import torch

        from testbed.data.datasets import load_dataset

        ds = load_dataset(dataset, seed=seed)
        _DATA[dataset] = (ds, torch.from_numpy(np.ascontiguousarray(ds.train_x)),
                          torch.from_numpy(np.ascontiguousarray(ds.train_y)))
    return _DATA[dataset]


def _model(name: str, dataset: str, seed: int):
    import torch

    from testbed.data.models import build_model

    ds, _, _ = _data(dataset, seed)
    torch.manual_seed(seed)
    return build_model(name, tuple(ds.input_shape), ds.num_classes)


def make_client(cid: int, cfg: dict):
    import numpy as np
    import torch
    import torch.nn.functional as F
    from flwr.client import NumPyClient

    torch.set_num_threads(1)  # as an edgebed worker without a CPU limit sets it in the benchmark

    class Trainer(NumPyClient):
        def fit(self, parameters, config):
            _, x, y = _data(cfg["dataset"], cfg["seed"])
            net = _model(cfg["model"], cfg["dataset"], cfg["seed"])
            with torch.no_grad():
                for p, v in zip(net.state_dict().values(), parameters):
                    p.copy_(torch.from_numpy(np.asarray(v)))
            opt = torch.optim.SGD(net.parameters(), lr=cfg["lr"])
            rng = np.random.default_rng(cfg["seed"] * 1000 + cid * 100 + int(config.get("round", 0)))
            t, cpu = time.monotonic(), time.thread_time()
            for _ in range(cfg["local_steps"]):
                idx = torch.from_numpy(rng.integers(0, len(y), cfg["batch_size"]))
                net.zero_grad(set_to_none=True)
                F.cross_entropy(net(x[idx]), y[idx]).backward()
                opt.step()
            metrics = {"compute_s": time.monotonic() - t, "cpu_s": time.thread_time() - cpu}
            return ([v.detach().numpy().copy() for v in net.state_dict().values()],
                    cfg["batch_size"] * cfg["local_steps"], metrics)

    return Trainer().to_client()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--local-steps", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--model", default="adacomp_cnn")
    ap.add_argument("--dataset", default="mnist5k")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cpus", type=int, default=os.cpu_count() or 1, help="CPUs Ray may use")
    ap.add_argument("--per-round", type=int, default=0, help="clients sampled a round (0: every client)")
    a = ap.parse_args()
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    # Ray's worker processes import testbed.bench.flower_probe (by reference) and testbed.data.models
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH", "")) if p)

    import flwr
    from flwr.common import ndarrays_to_parameters
    from flwr.server import ServerConfig
    from flwr.server.strategy import FedAvg
    from flwr.simulation import start_simulation

    from testbed.bench import flower_probe as me

    cfg = {"dataset": a.dataset, "model": a.model, "seed": a.seed, "lr": a.lr, "local_steps": a.local_steps,
           "batch_size": a.batch_size}
    initial = [v.detach().numpy().copy() for v in me._model(a.model, a.dataset, a.seed).state_dict().values()]
    rounds: dict[int, dict] = {}
    t0 = time.monotonic()

    class TimedFedAvg(FedAvg):
        def configure_fit(self, server_round, parameters, client_manager):
            rounds[server_round] = {"round": server_round, "start": time.monotonic() - t0}
            return super().configure_fit(server_round, parameters, client_manager)

        def aggregate_fit(self, server_round, results, failures):
            out = super().aggregate_fit(server_round, results, failures)
            r = rounds[server_round]
            r["end"] = time.monotonic() - t0
            r["seconds"] = r["end"] - r["start"]
            r["clients"] = len(results)
            r["failures"] = len(failures)
            ms = [fit.metrics for _, fit in results]
            r["compute_s_sum"] = sum(m["compute_s"] for m in ms)
            r["compute_s_max"] = max((m["compute_s"] for m in ms), default=0.0)
            r["cpu_s_sum"] = sum(m["cpu_s"] for m in ms)
            return out

    k = a.per_round or a.clients  # FedAvg samples max(fraction x available, min_fit_clients) a round
    strategy = TimedFedAvg(fraction_fit=k / a.clients, fraction_evaluate=0.0, min_fit_clients=k,
                           min_evaluate_clients=0, min_available_clients=a.clients,
                           initial_parameters=ndarrays_to_parameters(initial),
                           on_fit_config_fn=lambda rnd: {"round": rnd})

    def client_fn(context):
        return me.make_client(int(context.node_config["partition-id"]), cfg)

    start_simulation(client_fn=client_fn, num_clients=a.clients, config=ServerConfig(num_rounds=a.rounds),
                     strategy=strategy, client_resources={"num_cpus": 1, "num_gpus": 0.0},
                     ray_init_args={"num_cpus": a.cpus, "include_dashboard": False, "ignore_reinit_error": True,
                                    "log_to_driver": False})
    total = time.monotonic() - t0
    print(json.dumps({"framework": "flower", "flwr_version": flwr.__version__, "clients": a.clients, "per_round": k,
                      "rounds": [rounds[k] for k in sorted(rounds)], "total_seconds": total,
                      "cpus": a.cpus, "local_steps": a.local_steps, "batch_size": a.batch_size}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
