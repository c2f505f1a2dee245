"""The command-line programs, each a ``main(argv)``:

* :mod:`.launch` — ``bmlmpi-run`` (``python -m bmlmpi.cli.launch``): mpiexec with the right
  flags for the MPI found, ``--ft`` for fault-tolerant jobs, exit codes that tell the truth;
* :mod:`.bench` — ``bmlmpi-bench`` (``python -m bmlmpi.cli.bench``): the OSU-style sweep;
  :mod:`.overview` its ``--overview``, the main job, and the reading it prints;
* :mod:`.calibrate` — ``bmlmpi-calibrate`` (``python -m bmlmpi.cli.calibrate``): the cost
  model's calibration and ``auto``'s choice per size;
* :mod:`.trace` — ``bmlmpi-trace DIR`` (``python -m bmlmpi.cli.trace``): reads the flight
  recorders' dumps and names the rank that is behind and the call that differs.
"""
