"""HTTP layer: the CLI now; the OpenAI-compatible app, routing and telemetry as they land."""
