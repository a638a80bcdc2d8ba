"""`torchrun --nproc-per-node=G -m common.parallel.collectives [--collective all_reduce ...]`: a sweep on every rank,
an nccl-tests-like table on rank 0."""
from common.parallel.collectives.sweep import main

main()
