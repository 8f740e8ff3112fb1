"""The teaching labs (labs/ at the top of the repository): one folder per exercise, each with
its scenarios, a manifest of what ``testbed lab run`` runs (lab.yaml) and a declarative
self-check (check.yaml) that ``testbed lab check`` judges against the runs' summary.json.

    spec.py        the lab folders and their files, as plain data (pydantic models)
    values.py      a value at a path in a summary, and the small arithmetic of the checks
    judge.py       every item of a self-check judged against the runs' summaries (pure)
    walkthrough.py lab 00: the page's commands, their expected shapes, and the replay
    runner.py      the thin layer: run a lab's scenarios through the harness, find its runs
    index.py       the index page of every lab's latest run (make lab)
    command.py     ``testbed lab list | run | check | index``
"""
