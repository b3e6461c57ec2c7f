"""The schema and its revisions: up and down on live databases, host projects, ranges."""
