"""Side-by-side benchmark of PostgreSQL job queues (see bench/README.md)."""
