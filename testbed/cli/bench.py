"""`edgebed bench`: the fidelity benchmarks, each writing a JSON result (BENCHMARKS.md's tables)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from testbed.cli.common import EVERY_RUNTIME, exit_unless_ok, fail, runtime_option

bench_app = typer.Typer(no_args_is_help=True, help="Fidelity benchmarks (JSON results under benchmarks/results/).")

# The runtimes the single-machine benchmarks were written for (the others take every runtime).
ONE_HOST = "netns | docker"


@bench_app.command("link")
def bench_link(rate: str = typer.Option("10mbit", help="configured rate"),
               seconds: float = typer.Option(0.0, help="seconds per direction (default 8, 20 below 2 Mbit/s)"),
               flows: int = typer.Option(1, help="parallel TCP flows"),
               runtime: str = runtime_option("netns", EVERY_RUNTIME),
               encrypt: bool = typer.Option(False, "--encrypt", help="runtime swarm: on an encrypted overlay "
                                                                     "(network.encrypt)"),
               out: Path = typer.Option(Path("benchmarks/results"), help="where to write JSON")) -> None:
    """Achieved vs configured throughput of a shaped access link, both directions."""
    from testbed.bench.links import link_benchmark
    from testbed.scenario import units

    if seconds <= 0:
        # TCP needs longer to fill and settle a slow link's queue.
        seconds = 20.0 if units.parse_rate(rate) < 2e6 else 8.0
    exit_unless_ok(link_benchmark(rate, seconds=seconds, flows=flows, out_dir=out, say=typer.echo, runtime=runtime,
                                  encrypt=encrypt))


@bench_app.command("loss")
def bench_loss(loss: str = typer.Option("1%", help="configured loss (uplink of w0)"),
               packets: int = typer.Option(20000, help="UDP datagrams to send"),
               runtime: str = runtime_option("netns", ONE_HOST),
               out: Path = typer.Option(Path("benchmarks/results"))) -> None:
    """Measured vs configured packet loss (netem, or the eBPF fallback)."""
    from testbed.bench.links import loss_benchmark

    res = loss_benchmark(loss, packets=packets, out_dir=out, say=typer.echo, runtime=runtime)
    exit_unless_ok(res)


@bench_app.command("delay")
def bench_delay(latency: str = typer.Option("20ms", help="one-way latency of w0's link, each direction"),
                jitter: str = typer.Option("0ms"),
                count: int = typer.Option(50),
                runtime: str = runtime_option("netns", ONE_HOST),
                out: Path = typer.Option(Path("benchmarks/results"))) -> None:
    """Round-trip time of training messages vs configured latency (netem, or the transport fallback)."""
    from testbed.bench.links import delay_benchmark

    res = delay_benchmark(latency, jitter=jitter, count=count, out_dir=out, say=typer.echo, runtime=runtime)
    exit_unless_ok(res)


@bench_app.command("startup")
def bench_startup(workers: int = typer.Option(4, help="number of workers"),
                  runtime: str = runtime_option("netns", EVERY_RUNTIME),
                  cpus: float = typer.Option(0.5, help="each worker's CPU quota, 0 for none "
                                                       "(a swarm's hosts must hold all quotas)"),
                  window: float = typer.Option(0.0, help="seconds of training (default 10 + 0.3 a worker)"),
                  out: Path = typer.Option(Path("benchmarks/results"))) -> None:
    """Seconds from `up` to the first training step (and teardown) for N workers."""
    from testbed.bench.startup import startup_benchmark

    res = startup_benchmark(workers, runtime=runtime, out_dir=out, say=typer.echo, cpus=cpus, window=window)
    exit_unless_ok(res)


@bench_app.command("fleet")
def bench_fleet(devices: int = typer.Option(200, help="devices (workers): each a node for the whole run"),
                clients: int = typer.Option(10, help="K: clients a round (fedavg, over-selection 1.3)"),
                trainers: str = typer.Option("per_round", help="per_round (a trainer only while selected) | always"),
                seconds: float = typer.Option(90, help="length of the run"),
                model: str = typer.Option("mlp", help="the model the devices train"),
                runtime: str = typer.Option("netns", help="a runtime (swarm: the two-host lab, edgebed lab up)"),
                out: Path = typer.Option(Path("benchmarks/results"))) -> None:
    """A fleet that trains: bring-up, memory per trainer, round time, teardown (netns or swarm)."""
    from testbed.bench.fleet import fleet_benchmark

    if trainers not in ("per_round", "always"):
        fail("error: --trainers: per_round or always")
    from testbed.runtimes import runtime_names

    if runtime not in runtime_names():
        fail(f"error: --runtime: one of {', '.join(runtime_names())}")
    res = fleet_benchmark(devices, clients, trainers=trainers, seconds=seconds, model=model, runtime=runtime,
                          out_dir=out, say=typer.echo)
    exit_unless_ok(res)


@bench_app.command("ddp")
def bench_ddp(rates: str = typer.Option("10mbit,50mbit,100mbit", help="link rates, comma-separated"),
              workers: int = typer.Option(2, help="DDP ranks, one a worker node"),
              steps: int = typer.Option(20, help="training steps a run (the first 3 are warm-up)"),
              out: Path = typer.Option(Path("benchmarks/results"))) -> None:
    """An unmodified DDP program (torchrun, gloo): its all-reduce time against the ring bound."""
    from testbed.bench.ddp import ddp_benchmark

    if workers < 2:
        fail("error: --workers: an all-reduce needs at least 2")
    res = ddp_benchmark([r.strip() for r in rates.split(",") if r.strip()], workers=workers, steps=steps,
                        out_dir=out, say=typer.echo)
    exit_unless_ok(res)


@bench_app.command("flower-app")
def bench_flower_app(rates: str = typer.Option("5mbit,20mbit,100mbit", help="link rates, comma-separated"),
                     rounds: int = typer.Option(4, help="FedAvg rounds a run (round 1 is warm-up)"),
                     out: Path = typer.Option(Path("benchmarks/results"))) -> None:
    """An unmodified Flower app (SuperLink, 2 SuperNodes): round time against the bytes it moves."""
    from testbed.bench.flower_app import FLOWER_PYTHON, flower_app_benchmark

    if rounds < 3:
        fail("error: --rounds: at least 3 (round 1 is warm-up, a round's time is the gap between two ends)")
    if not FLOWER_PYTHON.exists():
        fail(f"error: no {FLOWER_PYTHON.parent.parent.name} (make flower-venv installs PyPI's flwr)")
    res = flower_app_benchmark([r.strip() for r in rates.split(",") if r.strip()], rounds=rounds, out_dir=out,
                               say=typer.echo)
    exit_unless_ok(res)


@bench_app.command("stream")
def bench_stream(topics: int = typer.Option(4, help="topics = devices, one producer process each"),
                 rate: float = typer.Option(100.0, help="samples/s per topic"),
                 seconds: float = typer.Option(12.0),
                 sample_bytes: int = typer.Option(3072, help="bytes per sample (3072 = a CIFAR image)"),
                 out: Path = typer.Option(Path("benchmarks/results"))) -> None:
    """Sustained samples/s of the embedded broker with one producer per topic (ScaDLES Fig. 5)."""
    from testbed.bench.stream import stream_benchmark

    stream_benchmark(topics, rate, seconds=seconds, sample_bytes=sample_bytes, out_dir=out, say=typer.echo)


@bench_app.command("topology")
def bench_topology(lan: str = typer.Option("1gbit", help="LAN rate of both sites"),
                   wan: str = typer.Option("100mbit", help="WAN rate between them"),
                   seconds: float = typer.Option(6.0, help="seconds per transfer"),
                   runtime: str = runtime_option("netns", ONE_HOST),
                   out: Path = typer.Option(Path("benchmarks/results"))) -> None:
    """Two sites: a transfer inside a site runs at the LAN rate, across sites at the WAN rate."""
    from testbed.bench.links import topology_benchmark

    res = topology_benchmark(lan=lan, wan=wan, seconds=seconds, out_dir=out, say=typer.echo, runtime=runtime)
    exit_unless_ok(res)


@bench_app.command("cpu")
def bench_cpu(cpus: float = typer.Option(0.25, help="CPU quota in cores"),
              seconds: float = typer.Option(5.0),
              runtime: str = runtime_option("netns", ONE_HOST),
              others_busy: bool = typer.Option(False, "--others-busy", help="another node busy-loops on every core"),
              period: Optional[str] = typer.Option(None, help="the node's CFS period, e.g. 10ms (default 100ms)"),
              out: Path = typer.Option(Path("benchmarks/results"))) -> None:
    """Achieved vs configured CPU share of a node's cgroup under a busy loop."""
    from testbed.bench.cpu import cpu_benchmark

    period_s = None
    if period is not None:
        from testbed.plan import parse_scenario
        from testbed.scenario.schema import ScenarioError

        try:  # the scenario's own checks: units, the kernel's 1ms-1s, a quota of at least 1 ms
            period_s = parse_scenario({"name": "bench", "profiles": {"p": {"cpus": cpus, "cpu_period": period}},
                                       "workers": [{"count": 1, "profile": "p"}]}).profiles["p"].cpu_period
        except ScenarioError as e:
            fail("error: --period: " + "; ".join(e.lines))
    res = cpu_benchmark(cpus, seconds=seconds, out_dir=out, say=typer.echo, runtime=runtime, others_busy=others_busy,
                        cpu_period=period_s)
    exit_unless_ok(res)


@bench_app.command("update")
def bench_update(params: int = typer.Option(1_000_000, help="parameters in the update (float32)"),
                 rate: str = typer.Option("100mbit", help="w0's link rate"),
                 repeats: int = typer.Option(3),
                 runtime: str = runtime_option("netns", ONE_HOST),
                 out: Path = typer.Option(Path("benchmarks/results"))) -> None:
    """Time for the PS to receive one full update over a shaped link vs the ideal 32P/B + RTT."""
    from testbed.bench.suite import update_benchmark

    if params <= 0 or repeats <= 0:
        fail("error: --params and --repeats must be positive")
    res = update_benchmark(params, rate, repeats=repeats, out_dir=out, say=typer.echo, runtime=runtime)
    exit_unless_ok(res)


@bench_app.command("overhead")
def bench_overhead(cpus: float = typer.Option(1.0, help="the worker's CPU quota"),
                   model: str = typer.Option("adacomp_cnn"),
                   batch_size: int = typer.Option(32),
                   steps: int = typer.Option(60),
                   repeats: int = typer.Option(3, help="alternating runs of each (single runs differ by up to 15%)"),
                   out: Path = typer.Option(Path("benchmarks/results"))) -> None:
    """A worker's compute step inside edgebed vs a bare PyTorch loop on the same CPU quota."""
    from testbed.bench.suite import overhead_benchmark

    if steps <= 15 or repeats < 1:
        fail("error: --steps must be above 15 (the first 10 are warm-up), --repeats at least 1")
    res = overhead_benchmark(cpus=cpus, model=model, batch_size=batch_size, steps=steps, repeats=repeats, out_dir=out,
                             say=typer.echo)
    exit_unless_ok(res)


@bench_app.command("mininet")
def bench_mininet(hosts: int = typer.Option(8, help="hosts on one switch (edgebed: ps, evaluator, workers)"),
                  rate: str = typer.Option("10mbit", help="every host's link"),
                  cpus: float = typer.Option(0.25, help="every host's CPU cap (cores)"),
                  out: Path = typer.Option(Path("benchmarks/results"))) -> None:
    """Side by side with Mininet (Debian's package): start-up, stop, memory, link goodput."""
    from testbed.bench.suite import mininet_benchmark

    if hosts < 2:
        fail("error: --hosts must be at least 2")
    exit_unless_ok(mininet_benchmark(hosts, rate=rate, cpus=cpus, out_dir=out, say=typer.echo))


@bench_app.command("flower")
def bench_flower(clients: int = typer.Option(4, help="FedAvg clients (edgebed: workers)"),
                 rounds: int = typer.Option(11, help="rounds; the first is not averaged in (start-up)"),
                 local_steps: int = typer.Option(10, help="local steps a client takes a round"),
                 batch_size: int = typer.Option(32),
                 per_round: int = typer.Option(0, help="a fleet: clients sampled a round (0: every client; "
                                               "edgebed then starts a device's trainer for its round)"),
                 bandwidth: str = typer.Option("", help="edgebed's device links shaped to this rate (e.g. 100mbit)"),
                 parked: int = typer.Option(0, help="with --per-round: edgebed keeps up to this many trainers a "
                                            "round left out waiting for a later one (fedavg's parked)"),
                 venv: Optional[Path] = typer.Option(None, help="the venv with flwr[simulation] (default: the "
                                                     "checkout's .venv-flower, made by make flower-venv)"),
                 out: Path = typer.Option(Path("benchmarks/results"))) -> None:
    """Side by side with Flower's simulation engine: the same FedAvg rounds, per-round overhead."""
    from testbed.bench.suite import FLOWER_VENV, flower_benchmark

    if clients < 1 or rounds < 2 or local_steps < 1 or batch_size < 1:
        fail("error: --clients, --local-steps and --batch-size must be at least 1, --rounds at least 2")
    if not 0 <= per_round <= clients:
        fail(f"error: --per-round: between 1 and --clients ({clients}), or 0 for every client")
    if parked < 0 or (parked and not per_round):
        fail("error: --parked: at least 0, and only with --per-round")
    if bandwidth:
        from testbed.scenario import units

        try:
            units.parse_rate(bandwidth)
        except ValueError as e:
            fail(f"error: --bandwidth: {e}")
    exit_unless_ok(flower_benchmark(clients, rounds=rounds, local_steps=local_steps, batch_size=batch_size,
                                    per_round=per_round, bandwidth=bandwidth, parked=parked,
                                    venv=venv or FLOWER_VENV, out_dir=out, say=typer.echo))


@bench_app.command("stress")
def bench_stress(cpus: float = typer.Option(1.0, help="the worker's CPU quota"),
                 stress: float = typer.Option(0.5, help="cores of background busy-looping in its cgroup"),
                 steps: int = typer.Option(60),
                 out: Path = typer.Option(Path("benchmarks/results"))) -> None:
    """A profile's background stress: a worker's compute step with and without it."""
    from testbed.bench.suite import stress_benchmark

    if not 0 < stress < cpus:
        fail("error: --stress must be above 0 and below --cpus")
    res = stress_benchmark(cpus=cpus, stress=stress, steps=steps, out_dir=out, say=typer.echo)
    exit_unless_ok(res)


@bench_app.command("wire")
def bench_wire(algorithm: str = typer.Option("all", help="a strategy (edgebed algorithms), or all"),
               workers: int = typer.Option(4),
               seconds: float = typer.Option(20.0, help="length of each run"),
               rate: str = typer.Option("100mbit", help="every worker's link"),
               out: Path = typer.Option(Path("benchmarks/results"))) -> None:
    """Each strategy's wire bytes (its workers' link counters) against the payload its records count."""
    from testbed.bench.suite import wire_benchmark
    from testbed.strategies import strategies

    known = strategies()
    names = sorted(known) if algorithm == "all" else [algorithm]
    unknown = [n for n in names if n not in known]
    if unknown:
        fail(f"error: --algorithm: '{unknown[0]}' is not one of {', '.join(sorted(known))}, all")
    if workers < 1 or seconds <= 0:
        fail("error: --workers must be at least 1, --seconds positive")
    from testbed.scenario import units

    try:
        units.parse_rate(rate)
    except units.UnitError as e:
        fail(f"error: --rate: {e}")
    results = [wire_benchmark(n, workers=workers, seconds=seconds, rate=rate, out_dir=out, say=typer.echo)
               for n in names]
    exit_unless_ok(*results)


@bench_app.command("all")
def bench_all(quick: bool = typer.Option(False, "--quick", help="a few minutes, generous bounds (what CI runs)"),
              out: Path = typer.Option(Path("benchmarks/results"))) -> None:
    """The whole suite (BENCHMARKS.md's tables), or --quick; exits 1 if a number is out of bounds."""
    from testbed.bench.suite import run_suite

    if not quick:
        typer.echo("the full suite takes about 40 minutes on 2 cores (docker included when an engine answers)")
    res = run_suite(quick, out, say=typer.echo)
    exit_unless_ok(res)


@bench_app.command("soak")
def bench_soak(minutes: int = typer.Option(30, help="length of the run; one fault per minute from minute 1"),
               workers: int = typer.Option(4),
               seed: int = typer.Option(1, help="draws the faults, their targets and times"),
               runtime: str = runtime_option("netns", ONE_HOST),
               algorithm: str = typer.Option("bsp", help="the synchronization model under the faults"),
               run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="records (default runs/soak-DATE)"),
               out: Path = typer.Option(Path("benchmarks/results"))) -> None:
    """A long run with a random fault every minute, then a check of its records and of leftovers."""
    from testbed.bench.soak import soak_benchmark

    res = soak_benchmark(minutes=minutes, workers=workers, seed=seed, runtime=runtime, algorithm=algorithm,
                         out_dir=out, run_dir=run_dir, say=typer.echo)
    exit_unless_ok(res)



@bench_app.command("trace")
def bench_trace(quick: bool = typer.Option(False, "--quick", help="10 s per trace, one repetition"),
                seconds: float = typer.Option(30.0, help="seconds per section (each flow, each repetition)"),
                repetitions: int = typer.Option(3, help="sections of each trace replayed"),
                runtime: str = runtime_option("netns", "netns | docker | swarm (on the lab: edgebed lab up)"),
                via: str = typer.Option("profile", help="the trace given on the profile's link (profile) or by a "
                                        "timeline link event (event)"),
                only: str = typer.Option("", help="these traces only, comma-separated (att-lte-driving, "
                                         "verizon-lte-short, norway-hsdpa-bus)"),
                dilation: float = typer.Option(1.0, "--dilation", min=1.0, max=64.0, help="time dilation K: the "
                                               "replay a run dilated by K makes (ticks K x 100 ms, rates / K)"),
                out: Path = typer.Option(Path("benchmarks/results"))) -> None:
    """A link replaying 3 recorded traces at 10 Hz: wire rate vs the trace per 100 ms (UDP, TCP)."""
    from testbed.bench.trace import TRACES, trace_benchmark

    if quick:
        seconds, repetitions = 10.0, 1
    names = [n.strip() for n in only.split(",") if n.strip()]
    traces = tuple(t for t in TRACES if not names or t[0] in names)
    if not traces:
        raise typer.BadParameter(f"no trace of {', '.join(t[0] for t in TRACES)}", param_hint="--only")
    exit_unless_ok(trace_benchmark(seconds=seconds, repetitions=repetitions, runtime=runtime, out_dir=out,
                                   say=typer.echo, traces=traces, via=via, dilation=dilation))


@bench_app.command("device")
def bench_device(quick: bool = typer.Option(False, "--quick", help="one device, one model, the idle host (CI)"),
                 runtime: str = runtime_option("netns", ONE_HOST),
                 repetitions: int = typer.Option(3, help="timed repetitions per measurement"),
                 devices: str = typer.Option(",".join(("raspberry-pi-3b", "raspberry-pi-4", "jetson-nano-cpu")),
                                             help="catalog devices, comma-separated"),
                 cross: bool = typer.Option(True, "--cross/--no-cross", help="also run each calibration on the "
                                            "other models (idle host)"),
                 pace: bool = typer.Option(False, "--pace", help="the devices' steps paced to their time (a "
                                           "device profile's default), each on its own model; without it "
                                           "the quota alone (pace_steps: false)"),
                 dilation: float = typer.Option(1.0, "--dilation", min=1.0, help="time dilation K: every target "
                                                "step time times K, step times reported divided by K (virtual)"),
                 batches: str = typer.Option("", help="accelerators: batch sizes, comma-separated (e.g. 8,32,128): "
                                             "each device's paced step per batch against its roofline"),
                 model: str = typer.Option("adacomp_cnn", help="with --batches: the model"),
                 out: Path = typer.Option(Path("benchmarks/results"))) -> None:
    """Device profiles: measured step time against the device's target (3 devices x 3 models), on
    this host idle and slowed by a busy neighbour, beside a host-relative `cpus:` profile; with
    --batches, accelerators' paced steps per batch under --dilation."""
    from testbed.bench.device import accelerator_benchmark, device_benchmark

    names = tuple(d.strip() for d in devices.split(",") if d.strip())
    if batches:
        sizes = tuple(int(b) for b in batches.split(",") if b.strip())
        exit_unless_ok(accelerator_benchmark(runtime=runtime, out_dir=out, say=typer.echo, devices=names,
                                             batches=sizes, dilation=dilation, model=model, repetitions=repetitions))
        return
    exit_unless_ok(device_benchmark(quick=quick, runtime=runtime, out_dir=out, say=typer.echo,
                                    repetitions=repetitions, devices=names, cross=cross, pace=pace,
                                    dilation=dilation))
