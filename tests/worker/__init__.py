"""The worker: its loop, leases and fencing, outcomes, concurrency, transactional mode, logs."""
