"""The kernels behind fastload's non-geometric transforms: batched torch operations with
per-sample parameters, the same code on the CPU (in workers, in place in the slot) and on the GPU
(after the copy). `program` is the seam the loader uses; `color`, `policies` and `mixing` hold the
operations, each registered in its module's `OPS` by the transform type it runs.
"""
