"""Discrete-event simulator of prefill/decode LLM serving pools on a virtual clock."""
