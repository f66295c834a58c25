"""The error raised for bad input data."""


class DataError(ValueError):
    """Input data that cannot be used as given; the message names the file, line or field and the fix."""
