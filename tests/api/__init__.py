"""The queue API in process: enqueue, checkout, cancel, limits, schedules, drivers, bad input."""
