"""The options of the other Spark sources for Kinesis, and what each one is here.

Declared once: the tables of ``docs/migration.md`` are generated from these declarations
(``python -m kinesis_source.peers``; a test keeps them in step), and an unknown option that is
one of theirs gets an error that names ours (:func:`hint`). Read from the AWS connector's
``KinesisOptions.scala`` (awslabs/spark-sql-kinesis-connector), kinesis-sql's
``KinesisSourceProvider.scala`` (qubole/kinesis-sql) and Databricks' documentation; Databricks'
source is closed, and the keys marked unverified were seen only in secondary sources.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PeerOption:
    """One option of another connector: ``ours`` is the option that does its job here (None:
    there is none), ``note`` how values or meaning differ, or why there is none."""

    key: str
    ours: str | None
    note: str = ""
    verified: bool = True


_P = PeerOption
_RETRY_CAP = "retries wait at most 20 s; no setting"
_NO_META = "positions go to DynamoDB (`checkpointTable`); there is no per-batch metadata to store"
_EXACT = "a batch is planned as exact ranges on the driver; a task reads its ranges to their ends"

AWS = (
    "the AWS connector",
    "awslabs/spark-sql-kinesis-connector, options prefixed `kinesis.`",
    (
        _P("kinesis.streamName", "streamName", "ours takes a comma-separated list"),
        _P("kinesis.endpointUrl", "endpointUrl", "theirs is required; ours defaults to the region's"),
        _P("kinesis.region", "region", "theirs is the DynamoDB metadata region: `dynamodbRegion` "
           "when the checkpoint table is elsewhere"),
        _P("kinesis.kinesisRegion", "region"),
        _P("kinesis.consumerType", "consumerMode", "`GetRecords` is `polling`, `SubscribeToShard` is `efo`"),
        _P("kinesis.consumerName", "consumerName"),
        _P("kinesis.failOnDataLoss", "failOnDataLoss", "theirs defaults to false, ours to true"),
        _P("kinesis.startingPosition", "initialPosition",
           "`EARLIEST` is `TRIM_HORIZON`; `AT_TIMESTAMP <iso>` is `AT_TIMESTAMP:<iso>`; per-shard "
           "JSON is `{\"<shardId>\": \"<sequenceNumber>\"}` (reading starts after it)"),
        _P("kinesis.maxFetchRecordsPerShard", "maxRecordsPerBatch", "ours limits the whole batch, "
           "shared among its shards"),
        _P("kinesis.maxFetchTimePerShardSec", None, _EXACT),
        _P("kinesis.describeShardInterval", "shardDiscoveryIntervalMs", "milliseconds, not a duration"),
        _P("kinesis.minBatchesToRetain", None, "Spark's `spark.sql.streaming.minBatchesToRetain`; "
           + _NO_META),
        _P("kinesis.checkNewRecordThreads", None, "the driver probes every shard at once on one "
           "event loop"),
        _P("kinesis.metadataCommitterType", None, _NO_META),
        _P("kinesis.metadataPath", None, _NO_META),
        _P("kinesis.metadataNumRetries", "maxRetries", "one setting for every AWS call"),
        _P("kinesis.metadataRetryIntervalsMs", "retryBaseDelayMs"),
        _P("kinesis.metadataMaxRetryIntervalMs", None, _RETRY_CAP),
        _P("kinesis.clientNumRetries", "maxRetries"),
        _P("kinesis.clientRetryIntervalsMs", "retryBaseDelayMs"),
        _P("kinesis.clientMaxRetryIntervalMs", None, _RETRY_CAP),
        _P("kinesis.stsRoleArn", "roleArn"),
        _P("kinesis.stsSessionName", "roleSessionName"),
        _P("kinesis.stsEndpointUrl", "stsEndpointUrl"),
        _P("kinesis.awsAccessKeyId", "awsAccessKeyId"),
        _P("kinesis.awsSecretKey", "awsSecretKey"),
        _P("kinesis.sessionToken", "awsSessionToken"),
        _P("kinesis.credentialProviderClass", "credentialsProvider", "a Python function "
           "`package.module:function` returning the keys, instead of a JVM class"),
        _P("kinesis.credentialProviderParam", None, "the function takes no argument: bind what "
           "it needs in its module"),
        _P("kinesis.dynamodb.tableName", "checkpointTable", "one table holds many applications, "
           "keyed by `applicationName`"),
        _P("kinesis.subscribeToShard.timeoutSec", "subscribeTimeoutMs", "milliseconds, not "
           "seconds; a subscription that stays silent that long is renewed"),
        _P("kinesis.subscribeToShard.maxRetries", None, "bounded resubscription, no setting"),
        _P("kinesis.getRecords.numberOfRecordsPerFetch", "maxRecordsPerFetch"),
        _P("kinesis.getRecords.fetchIntervalMs", "getRecordsPerShardPerSecond",
           "a per-shard call budget shared by driver and executors instead of an interval"),
        _P("kinesis.internal.dataQueueCapacity", None, "internal"),
        _P("kinesis.internal.maxDataQueueEmptyCount", None, "internal"),
        _P("kinesis.internal.dataQueueWaitTimeoutSec", None, "internal"),
        _P("kinesis.internal.maintenanceTaskIntervalSec", None, "internal"),
        _P("kinesis.internal.avoidEmptyBatches", None, "an idle stream runs no batches"),
    ),
)

QUBOLE = (
    "kinesis-sql",
    "qubole/kinesis-sql",
    (
        _P("streamName", "streamName"),
        _P("endpointUrl", "endpointUrl", "theirs is also how the region is chosen: set `region`"),
        _P("regionName", "region", "theirs is read but not used"),
        _P("awsAccessKeyId", "awsAccessKeyId"),
        _P("awsSecretKey", "awsSecretKey"),
        _P("sessionToken", "awsSessionToken"),
        _P("awsSTSRoleARN", "roleArn"),
        _P("awsSTSSessionName", "roleSessionName"),
        _P("awsUseInstanceProfile", None, "boto3's default chain includes instance profiles"),
        _P("startingPosition", "initialPosition",
           "`earliest` is `TRIM_HORIZON`; their per-shard JSON "
           "(`{iteratorType, iteratorPosition}`, epoch milliseconds for AT_TIMESTAMP) becomes "
           "`{\"<shardId>\": \"<sequenceNumber>\"}` or `AT_TIMESTAMP:<iso>`"),
        _P("failOnDataLoss", "failOnDataLoss"),
        _P("kinesis.executor.maxFetchTimeInMs", None, _EXACT),
        _P("kinesis.executor.maxFetchRecordsPerShard", "maxRecordsPerBatch", "ours limits the whole "
           "batch, shared among its shards"),
        _P("kinesis.executor.maxRecordPerRead", "maxRecordsPerFetch"),
        _P("kinesis.executor.addIdleTimeBetweenReads", "getRecordsPerShardPerSecond",
           "the call budget always paces reads"),
        _P("kinesis.executor.idleTimeBetweenReadsInMs", "getRecordsPerShardPerSecond",
           "calls per second per shard instead of a pause"),
        _P("kinesis.client.describeShardInterval", "shardDiscoveryIntervalMs"),
        _P("kinesis.client.numRetries", "maxRetries"),
        _P("kinesis.client.retryIntervalMs", "retryBaseDelayMs"),
        _P("kinesis.client.maxRetryIntervalMs", None, _RETRY_CAP),
        _P("kinesis.client.avoidEmptyBatches", None, "an idle stream runs no batches"),
        _P("kinesis.client.maxParallelThreads", None, "the driver probes every shard at once on one "
           "event loop"),
        _P("kinesis.executor.metadata.committer", None, _NO_META),
        _P("kinesis.executor.metadata.path", None, _NO_META),
        _P("kinesis.executor.metadata.hdfs.numRetries", None, _NO_META),
        _P("kinesis.executor.metadata.hdfs.retryIntervalMs", None, _NO_META),
        _P("kinesis.executor.metadata.hdfs.maxRetryIntervalMs", None, _NO_META),
    ),
)

DATABRICKS = (
    "Databricks' Kinesis source",
    "Databricks Runtime, closed source",
    (
        _P("streamName", "streamName"),
        _P("streamARN", "streamARN", "ours takes a comma-separated list; every call then names the "
           "streams by ARN (cross-account streams shared by a resource policy)"),
        _P("region", "region"),
        _P("endpoint", "endpointUrl", verified=False),
        _P("initialPosition", "initialPosition", "`earliest` is `TRIM_HORIZON`; `at_timestamp` is "
           "`AT_TIMESTAMP:<iso>`"),
        _P("maxRecordsPerFetch", "maxRecordsPerFetch"),
        _P("maxFetchRate", "maxReadRatePerShard", "theirs is MB/s (decimal) and defaults to 1.0; "
           "ours takes bytes/s with a unit (`1MB`, `0.5MiB`) and defaults to no cap of its own "
           "(reads are paced to the shard's 2 MiB/s less what others were found to read)"),
        _P("minFetchPeriod", "getRecordsPerShardPerSecond", verified=False),
        _P("maxFetchDuration", None, _EXACT),
        _P("fetchBufferSize", None, "nothing is prefetched: ranges are read when Spark runs the "
           "batch"),
        _P("shardsPerTask", "shardsPerTask"),
        _P("shardFetchInterval", "shardDiscoveryIntervalMs"),
        _P("maxPartitions", "shardsPerTask", "shards per task instead of a task count", verified=False),
        _P("maxShardsPerDescribe", None, "`ListShards` pages as Kinesis serves them", verified=False),
        _P("coalesceThresholdBlockSize", None, "no block coalescing", verified=False),
        _P("coalesceBinSize", None, "no block coalescing", verified=False),
        _P("consumerMode", "consumerMode"),
        _P("consumerName", "consumerName", verified=False),
        _P("consumerNamePrefix", None, "`consumerName` is used as given", verified=False),
        _P("consumerRefreshInterval", None, "the consumer is checked when subscriptions fail",
           verified=False),
        _P("registeredConsumerId", "consumerName", "a registered consumer of that name is reused",
           verified=False),
        _P("registeredConsumerIdType", None, "consumers are named, not given by ARN", verified=False),
        _P("requireConsumerDeregistration", "deregisterConsumer"),
        _P("serviceCredential", None, "Databricks-only: use `roleArn`, `profile` or boto3's "
           "default chain"),
        _P("awsAccessKey", "awsAccessKeyId"),
        _P("awsSecretKey", "awsSecretKey"),
        _P("roleArn", "roleArn"),
        _P("roleExternalId", "roleExternalId"),
        _P("roleSessionName", "roleSessionName"),
        _P("stsEndpoint", "stsEndpointUrl"),
    ),
)

CONNECTORS = (AWS, QUBOLE, DATABRICKS)


def hint(key: str, ours: set[str]) -> str | None:
    """What to write instead of ``key`` when it is another connector's option and not ours
    (``ours``: our keys, lower case); None when it is no connector's."""
    if key.lower() in ours:
        return None
    for name, _, options in CONNECTORS:
        for option in options:
            if option.key.lower() == key.lower():
                if option.ours is None:
                    return f": '{key}' is {name}'s option; kinesis-ddb has none ({option.note})"
                return f": '{key}' is {name}'s option, here it is '{option.ours}'"
    return None


def migration_markdown() -> str:
    """The option tables of ``docs/migration.md`` (between its markers)."""
    lines = []
    for name, where, options in CONNECTORS:
        lines += ["", f"### {name[0].upper()}{name[1:]} ({where})", "",
                  "| their option | here | notes |", "|---|---|---|"]
        for option in options:
            ours = f"`{option.ours}`" if option.ours else "none"
            mark = " (unverified)" if not option.verified else ""
            lines.append(f"| `{option.key}`{mark} | {ours} | {option.note} |")
    return "\n".join(lines[1:]) + "\n"


if __name__ == "__main__":
    print(migration_markdown(), end="")
