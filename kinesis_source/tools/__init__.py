"""Command-line tooling (``kinesis-ddb``), the demo, the load producer and the local endpoint:
not used by the source itself."""
