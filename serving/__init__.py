"""pdscale serving package."""
