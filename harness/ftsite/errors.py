"""The harness's exceptions."""


class SetupError(Exception):
    """Bad input or a host that cannot run this: reported in one line."""


class TrialFailed(Exception):
    """A run that did not go as it must (a VM died, nothing answered...)."""


class ConnectionLost(Exception):
    """The client's TCP connection closed, reset or stopped answering."""


class Terminated(BaseException):
    """SIGTERM/SIGHUP: unwinds like Ctrl-C so the cleanup runs."""
