"""The worker: the process side of the queue, built from an engine, a registry and options.

Internal, not public API: ``JobQueue.work``, ``drain`` and ``step`` and ``postjob run`` start
a worker. The package exports nothing; import a module by its name. The modules:

- ``loop``: the worker loop (check out, run, record; wait; survive outages; stop cleanly).
- ``options``: what a worker is built from (``WorkerOptions``).
- ``slots``: running jobs, one at a time or up to N at once (threads, an event loop).
- ``executor``: runs one job and turns what its workflow did into an outcome.
- ``recorder``: outcomes waiting to be recorded, and recording them in batches.
- ``transactional``: transactional mode, one job per transaction.
- ``keeper``: the worker's row in ``postjob.workers``, its heartbeat, outcomes that cannot wait.
- ``idle``: when an idle worker reaps, how long it waits, and what wakes it.
- ``wakeup``: the sources of wake-ups (LISTEN, polling, the supervisor's relay).
- ``scheduler``: claiming the due ticks of periodic workflows.
- ``signals``: SIGINT/SIGTERM, a graceful stop and then an immediate one.
- ``outages``: riding out a failed statement (retry a conflict, reconnect after a lost
  connection).
- ``unknown``: due jobs whose workflow no live worker knows, reported now and then.
"""
