"""The machine pto runs on and tiles for, one layer above the errors and below everything else:

- :mod:`.target`: named targets and the running device's description (SRAM, SMs, memory);
- :mod:`.device`: which device ``auto`` means (a CUDA GPU when torch sees one);
- :mod:`.dist`: the ranks of a device mesh (torchrun, torch.distributed's process group);
- :mod:`.collectives`: how a buffer is summed over the ranks (symmetric memory's one-shot and
  two-shot all-reduce or the process group's, by size and machine).

Nothing here imports more of pto than :mod:`pto.errors`, and importing the package imports no
torch: the command line checks ``--device`` and ``--target`` before loading it.
"""
