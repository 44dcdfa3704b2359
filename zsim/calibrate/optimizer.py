"""scipy.optimize, which only the fitting commands need (gemm-fit, nccl-fit, calibrate): it ships in the
`fit` extra (`pip install 'zsim[fit]'`, 143 MB installed, issue 28), so a simulator-only install does
not carry it, and a fit without it says what to install instead of an ImportError."""

from __future__ import annotations

from types import ModuleType

from zsim.errors import ZsimError

INSTALL_HINT = "pip install 'zsim[fit]'"


def scipy_optimize(purpose: str) -> ModuleType:
    """The scipy.optimize module, imported now.

    `purpose` names what needs it (e.g. "the GEMM fit (zsim gemm-fit)"), for the message.

    Raises:
        ZsimError: scipy is not installed (exit 2), naming `purpose` and the extra that brings it.
    """
    try:
        import scipy.optimize
    except ImportError:
        raise ZsimError(f"{purpose} needs scipy, which is not installed: {INSTALL_HINT} "
                        "(or, in a checkout, `make test`)") from None
    return scipy.optimize
