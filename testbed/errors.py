"""edgebed's errors: one root, and a family for who must act.

    EdgebedError
     ├── BadInput (ValueError)         the input: a scenario field, a unit, a plugin, a file, a run id
     ├── HostCannot (RuntimeError)     this host or its engine: root, a kernel feature, Docker, a lab
     ├── RunFailed (RuntimeError)      a run, benchmark or node process that started and then failed
     └── MessageRefused (ValueError)   something that arrived: a node's message, a frame, a file of one

Every error class of edgebed derives from one family and keeps the builtin base it had, so an
`except ValueError` or `except RuntimeError` written before still catches it. The command line
catches the root once, prints its lines and exits with its family's code (exit_code, below).
Interrupted (run.interrupts) is not an error: a signal that the run was stopped and torn down.
Imports nothing, so every layer may raise these.

Exit codes, of every `edgebed` command and of `python -m testbed.cli`:
    0    done (a run completed; a benchmark within its bounds)
    1    failed: a run, a benchmark out of its bounds, RunFailed, MessageRefused
    2    refused: BadInput or HostCannot (edgebed up: before its cluster was brought up)
    3    a run stopped by a condition its scenario set (faults.on_worker_loss: stop)
    130  interrupted (Ctrl-C, SIGTERM, SIGHUP), torn down
"""

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_REFUSED = 2
EXIT_STOPPED = 3
EXIT_INTERRUPTED = 130


class EdgebedError(Exception):
    """Anything edgebed raises on purpose; its message is the one line the user sees."""


class BadInput(EdgebedError, ValueError):
    """The input is wrong; the message names the field or file to change."""


class HostCannot(EdgebedError, RuntimeError):
    """This host, its kernel or its engines cannot do what was asked; the message says what is missing."""


class RunFailed(EdgebedError, RuntimeError):
    """Something started and failed on the way: a run, a node's process, a benchmark's measurement."""


class MessageRefused(EdgebedError, ValueError):
    """What arrived from a node, a peer or a file was refused: its shape, size or sender."""


def exit_code(error: EdgebedError) -> int:
    return EXIT_REFUSED if isinstance(error, (BadInput, HostCannot)) else EXIT_FAILED


def error_lines(error: EdgebedError) -> list[str]:
    """The lines a user is shown: an error that carries several (a scenario's) gives each."""
    lines = getattr(error, "lines", None)
    return [str(x) for x in lines] if isinstance(lines, list) and lines else str(error).splitlines() or [repr(error)]
