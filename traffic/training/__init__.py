"""Training traffic between emulated hosts: the patterns of data parallel (DDP buckets
overlapped with backward compute), parameter server, tensor parallel (Megatron), pipeline
parallel (GPipe, 1F1B) and the replay of recorded message traces, each as pure schedules and
predictions plus a rank program that moves real, verified bytes over the collectives'
transport with modelled compute times.

- ``models``: parameter shape tables (ResNet-50, GPT-2 small) shipped as JSON in ``shapes/``.
- ``compute``: modelled compute (sleep or busy-wait until a deadline).
- ``ddp``, ``parameter_server``, ``tensor_parallel``, ``pipeline``, ``replay``: one pattern each.
- ``gantt``: the pipeline's Gantt chart as a PNG.
"""
