"""`attnfuse-opt`: xDSL's opt driver; AttnFuse's dialects, passes and targets come
from the `xdsl.universe` entry point, so stock `xdsl-opt` sees them too."""

import sys
import warnings

from xdsl.utils.exceptions import DiagnosticException, ParseError, PassFailedException, VerifyException
from xdsl.xdsl_opt_main import xDSLOptMain

from attnfuse import __version__


class AttnFuseOptMain(xDSLOptMain):
    version_format = "attnfuse-opt " + __version__ + " (xdsl {xdsl_version})"

    def __init__(self, args=None):
        super().__init__(description="AttnFuse modular optimizer driver", args=args)


def main(args: list[str] | None = None) -> None:
    warnings.filterwarnings("default", category=DeprecationWarning)
    try:
        AttnFuseOptMain(args=args).run()
    except (ParseError, VerifyException, DiagnosticException, PassFailedException, ValueError, OSError) as e:
        # Malformed IR, bad pass options: a diagnostic, not a Python traceback.
        print(f"attnfuse-opt: error: {e}", file=sys.stderr)
        for note in getattr(e, "__notes__", ()):
            print(note, file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
