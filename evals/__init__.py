"""Agent-trajectory evaluations against any OpenAI-compatible base URL (designed, not built yet)."""
