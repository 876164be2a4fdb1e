"""Evaluation harnesses (STS, and the method-specific ones as they land)."""
