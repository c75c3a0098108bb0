"""The version of pto (one definition: the package, generated files and tools read it here)."""

__version__ = "0.1.0"


def installed_version() -> str:
    """The version pip installed (the distribution's metadata), else :data:`__version__` (a
    checkout run without installing it: ``PYTHONPATH=.``); ``pto --version`` prints it."""
    from importlib import metadata

    try:
        return metadata.version("pto")
    except metadata.PackageNotFoundError:
        return __version__
