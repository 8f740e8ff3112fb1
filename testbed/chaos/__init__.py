"""Faults on purpose (``testbed chaos``): runs broken in every phase, each outcome checked
against one table, and what they left counted.

- ``table``: the faults and the outcome each must have, as plain data (rendered into the
  reliability page);
- ``plan``: a suite planned from a seed and a profile (pure): which runs, which failure
  schedule (testbed.harness.scenario.FailureSpec) or SIGKILL each gets, in what order;
- ``leftovers``: snapshots of what a run may leave on the machine, and their difference;
- ``outcome``: a run's observed outcome judged against its row, and the suite's verdict (pure);
- ``suite``: the thin part that runs runs, kills, mounts and cleans;
- ``report`` and ``command``: the printed table, and the ``testbed chaos`` command.
"""
