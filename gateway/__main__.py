"""`python -m gateway ...` is `draftgate ...` (the Docker image's entry point)."""

from gateway.cli import main

raise SystemExit(main())
