"""Pools of real vLLM servers: the tiny local model, local process launcher, load generator."""
