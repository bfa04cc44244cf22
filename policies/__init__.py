"""Guardrails: policy model, budgets, loop guards and tool-call validation (see DESIGN.md)."""
