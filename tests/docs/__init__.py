"""The docs and the example apps do what they say."""
