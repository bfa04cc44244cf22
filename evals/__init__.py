"""Agent-trajectory evaluations against any OpenAI-compatible base URL (see DESIGN.md)."""
