"""AWS client construction and the narrow Kinesis API."""
