"""The debugger across ranks (issue #39): pause every rank at one safe point, inspect, resume.

protocol.py is the wire protocol (torch-free; the notebook side imports it); the rank side
(controller.py and the modules it uses) runs inside a rank and never imports UI code.
"""


class Aborted(BaseException):
    """Raised out of a parked rank's safe point by the debugger's abort: a BaseException, so a
    training loop's `except Exception` does not swallow it and the rank ends."""
