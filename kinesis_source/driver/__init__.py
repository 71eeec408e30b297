"""What runs in Spark's driver-side Python helper: planning (tail probe, read limits, start
resolution), commits to DynamoDB, and the EFO consumers' lifecycle."""
