"""Every sink option with bad values: the error names the option and shows the value (secrets
never), as the source's do (tests/chaos/test_bad_input.py); and the keys of the two roles."""

from __future__ import annotations

import pytest

from kinesis_source.errors import OptionError
from kinesis_source.option_decl import specs_of
from kinesis_source.sink.options import SinkOptions
from tests.chaos.test_bad_input import BAD_VALUES as SOURCE_BAD_VALUES
from tests.chaos.test_bad_input import PARTNERS

SINK_BAD_VALUES: dict[str, list[str]] = {
    "streamName": ["bad name!", "s" * 129, "a,b", "a,,b"],
    "streamARN": ["orders", "arn:aws:kinesis:us-east-1:12:stream/x",
                  "arn:aws:kinesis:us-east-1:123456789012:stream/a,arn:aws:kinesis:us-east-1:123456789012:stream/b"],
    "preserveKeyOrder": ["yes", "1"],
    "aggregate": ["on", "0"],
    "aggregationMaxBytes": ["abc", "100", "1048577", "1.5"],
    "maxWriteRatePerShard": ["abc", "0", "2MiB", "1 parsec"],
    "maxRecordsPerSecondPerShard": ["abc", "0", "1001", "2.5"],
    "maxRecordsPerRequest": ["abc", "0", "501"],
    "maxRecordRetries": ["abc", "-1", "1001"],
    "onWrite": ["not a path", "module", "pkg.mod:", ":fn"],
}
SHARED = {s["key"] for s in specs_of(SinkOptions)} - set(SINK_BAD_VALUES)


def cases():
    for key, values in {**SINK_BAD_VALUES, **{k: SOURCE_BAD_VALUES[k] for k in sorted(SHARED)}}.items():
        for value in values:
            base = {"streamName": "s"} if key not in ("streamName", "streamARN") else {}
            yield key, {**base, **PARTNERS.get(key, {}), key: value}, value


def test_every_sink_option_has_bad_values_or_is_shared_with_the_source():
    assert SHARED <= set(SOURCE_BAD_VALUES), SHARED - set(SOURCE_BAD_VALUES)
    assert {"region", "endpointUrl", "awsSecretKey", "roleArn", "maxRetries"} <= SHARED


@pytest.mark.parametrize(("key", "options", "value"), list(cases()))
def test_a_bad_sink_option_is_named_with_its_value(key, options, value):
    with pytest.raises(OptionError) as err:
        SinkOptions.parse(options)
    message = str(err.value)
    assert f"'{key}'" in message
    spec = next(s for s in specs_of(SinkOptions) if s["key"] == key)
    if spec["type"] == "secret":
        assert value not in message and "<redacted>" in message
    else:
        assert repr(value) in message


def test_a_read_option_given_to_a_write_and_a_write_option_given_to_a_read_are_named_as_such():
    from kinesis_source.options import SourceOptions

    with pytest.raises(OptionError, match="'applicationName' is not an option for writing"):
        SinkOptions.parse({"streamName": "s", "APPLICATIONNAME": "a"})
    with pytest.raises(OptionError, match="'aggregate' is not an option for reading"):
        SourceOptions.parse({"streamName": "s", "applicationName": "a", "aggregate": "true"})
    with pytest.raises(OptionError, match="did you mean 'maxRecordRetries'"):
        SinkOptions.parse({"streamName": "s", "maxRecordRetry": "3"})
