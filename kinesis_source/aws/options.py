"""The options every use of the format shares: where AWS is and who calls it.

Reading (:class:`~kinesis_source.options.SourceOptions`) and writing
(:class:`~kinesis_source.sink.options.SinkOptions`) both inherit :class:`ConnectionOptions`,
so a key means the same in both and is declared once.
"""

from __future__ import annotations

from dataclasses import dataclass

from kinesis_source.errors import OptionError
from kinesis_source.option_decl import option
from kinesis_source.option_values import (
    int_in,
    parse_callback_path,
    parse_non_empty,
    parse_role_arn,
    parse_session_name,
    parse_url,
)


@dataclass(frozen=True)
class ConnectionOptions:
    """Region, endpoint, retries and credentials. Secrets are left out of ``repr``."""

    region: str | None = option(
        "region",
        "string",
        None,
        "AWS region of the stream, e.g. `eu-west-1`. Default: the boto3 chain "
        "(`AWS_REGION`, `AWS_DEFAULT_REGION`, the profile).",
        parse_non_empty,
    )
    endpoint_url: str | None = option(
        "endpointUrl",
        "string",
        None,
        "Kinesis endpoint URL, for VPC endpoints and local servers. Default: the region's.",
        parse_url,
    )
    max_retries: int = option(
        "maxRetries",
        "int",
        10,
        "Retries of each AWS call after its first attempt (so at most `maxRetries` + 1 "
        "attempts), for the errors botocore's standard retry mode retries: throttling, 5xx and "
        "network errors. The driver's clients give up after 2 retries when they could not "
        "connect to an endpoint that never answered them (a wrong `endpointUrl`).",
        int_in(1, 100),
    )
    retry_base_delay_ms: int = option(
        "retryBaseDelayMs",
        "int",
        1000,
        "Wait before the first retry of a throttled call. Retry n waits between half and all "
        "of min(20 s, base x 2^(n-1)); 5xx and network errors wait a twentieth of that.",
        int_in(1, 60000),
    )
    aws_access_key_id: str | None = option(
        "awsAccessKeyId",
        "string",
        None,
        "Static access key id (with `awsSecretKey`). Default: the boto3 credential chain.",
        parse_non_empty,
    )
    aws_secret_key: str | None = option(
        "awsSecretKey",
        "secret",
        None,
        "Static secret key (with `awsAccessKeyId`). Never logged.",
        parse_non_empty,
        secret=True,
    )
    aws_session_token: str | None = option(
        "awsSessionToken",
        "secret",
        None,
        "Session token for temporary static credentials. Never logged.",
        parse_non_empty,
        secret=True,
    )
    profile: str | None = option(
        "profile",
        "string",
        None,
        "Named profile from the AWS config files, instead of static keys.",
        parse_non_empty,
    )
    credentials_provider: str | None = option(
        "credentialsProvider",
        "string",
        None,
        "Credentials from your own function `package.module:function`, called with no arguments "
        "in every process that calls AWS (driver helper and executors: it must be importable in "
        "each) and returning a mapping of `access_key`, `secret_key`, optional `token` and "
        "optional `expiry_time` (ISO-8601; it is called again before then). Excludes "
        "`awsAccessKeyId` and `profile`; with `roleArn` it gives the credentials that assume "
        "the role.",
        parse_callback_path,
    )
    role_arn: str | None = option(
        "roleArn",
        "string",
        None,
        "IAM role to assume for every AWS call (Kinesis, and DynamoDB when reading), on the driver "
        "and the executors. "
        "Its credentials are refreshed before they expire.",
        parse_role_arn,
    )
    role_session_name: str = option(
        "roleSessionName",
        "string",
        "kinesis-ddb",
        "Session name for `roleArn`.",
        parse_session_name,
    )
    role_external_id: str | None = option(
        "roleExternalId",
        "secret",
        None,
        "External id for `roleArn`, if the role's trust policy requires one. Never logged.",
        parse_non_empty,
        secret=True,
    )
    sts_endpoint_url: str | None = option(
        "stsEndpointUrl",
        "string",
        None,
        "STS endpoint URL used to assume `roleArn`. Default: the region's.",
        parse_url,
    )

    @property
    def stream_arn_map(self) -> dict[str, str]:
        """Stream name -> ARN, for the streams given by ARN (the clients then name them so)."""
        return {}

    def __post_init__(self) -> None:
        if bool(self.aws_access_key_id) != bool(self.aws_secret_key):
            raise OptionError(
                "Options 'awsAccessKeyId' and 'awsSecretKey' must be given together "
                "(or neither, to use the boto3 credential chain)"
            )
        if self.aws_session_token and not self.aws_access_key_id:
            raise OptionError(
                "Option 'awsSessionToken' needs 'awsAccessKeyId' and 'awsSecretKey' as well"
            )
        if (self.role_external_id or self.sts_endpoint_url) and not self.role_arn:
            raise OptionError("Options 'roleExternalId' and 'stsEndpointUrl' need 'roleArn'")
        if self.credentials_provider and (self.aws_access_key_id or self.profile):
            raise OptionError(
                "Option 'credentialsProvider' excludes 'awsAccessKeyId' and 'profile': give one "
                "way of finding credentials"
            )
        if self.profile and self.aws_access_key_id:
            raise OptionError(
                "Options 'profile' and 'awsAccessKeyId' exclude each other: give one way of "
                "finding credentials"
            )
