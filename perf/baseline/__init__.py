"""The honest baseline: a C ``MPI_Allreduce`` loop, mpi4py's ``comm.Allreduce`` and bmlmpi in
one run (``python -m perf.baseline``; see README.md here)."""
