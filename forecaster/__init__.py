"""pdscale forecaster package."""
