"""The SDK version, sent as ``instance.sdk`` and in the User-Agent header."""

__version__ = "0.1.0"
SDK_NAME = f"orbit-sdk-python/{__version__}"
USER_AGENT = SDK_NAME
