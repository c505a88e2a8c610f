"""pdscale training package."""
