"""A Flask app that enqueues a welcome workflow in the same transaction as a signup."""
