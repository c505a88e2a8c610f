"""pdscale controller package."""
