"""`specgen bench`: prompt suites, the harness that runs every method side by side, the report."""
