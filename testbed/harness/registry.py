"""Every experiment by name: the one list the CLI, the scenario schema and ``testbed run``
read. Adding an experiment is a folder under testbed/experiments/ and one line here."""
from __future__ import annotations

import importlib

EXPERIMENTS = {  # name (a scenario's ``experiment``, a CLI subcommand) -> "module:Class"
    "allreduce": "testbed.experiments.allreduce.experiment:AllReduce",
    "anycast-failover": "testbed.experiments.anycast_failover.experiment:Anycast",
    "hedera": "testbed.experiments.hedera.experiment:Hedera",
    "dragonfly-routing": "testbed.experiments.dragonfly_routing.experiment:DragonflyRouting",
    "dctcp": "testbed.experiments.dctcp.experiment:Dctcp",
    "incast": "testbed.experiments.incast.experiment:Incast",
    "pfc-demo": "testbed.experiments.pfc_demo.experiment:PfcDemo",
    "roce-loss": "testbed.experiments.roce_loss.experiment:RoceLoss",
    "roce-dcqcn": "testbed.experiments.roce_dcqcn.experiment:RoceDcqcn",
    "roce-incast-pfc": "testbed.experiments.roce_incast_pfc.experiment:RoceIncastPfc",
    "roce-dctcp": "testbed.experiments.roce_dctcp.experiment:RoceDctcp",
    "collectives-sweep": "testbed.experiments.collectives_sweep.experiment:CollectivesSweep",
    "data-parallel": "testbed.experiments.data_parallel.experiment:DataParallel",
    "parameter-server": "testbed.experiments.parameter_server.experiment:ParameterServer",
    "tensor-parallel": "testbed.experiments.tensor_parallel.experiment:TensorParallel",
    "pipeline-parallel": "testbed.experiments.pipeline_parallel.experiment:PipelineParallel",
    "torch-ddp": "testbed.experiments.torch_ddp.experiment:TorchDdp",
    "replay": "testbed.experiments.replay.experiment:Replay",
}


def experiment_class(name: str):
    module, _, cls = EXPERIMENTS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def experiment_classes() -> dict:
    """name -> class, for the experiments whose modules exist (all of them, once built)."""
    classes = {}
    for name in EXPERIMENTS:
        try:
            classes[name] = experiment_class(name)
        except ModuleNotFoundError as err:
            if not err.name.startswith("testbed.experiments."):
                raise
    return classes
