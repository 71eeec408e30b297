"""The DynamoDB checkpoint store: item format, store, callbacks."""
