"""The dashboard: pages and actions through a test client, and in a real browser."""
