"""`echo` that also writes down each effect it performs, for the cluster kill test.

`LedgerEcho` is a connector factory (`torpor connector run tests.faults.ledger_echo:LedgerEcho`):
before starting the work of an `invoke`, it appends the dispatch's request id as one line
to the file named by `TORPOR_TEST_EFFECT_LEDGER`. A request id on two lines is an effect
performed twice: what the connector runtime's journal must prevent, whatever the broker
does meanwhile.
"""

from __future__ import annotations

import os
from typing import Final

from torpor.connectors.echo import EchoTool
from torpor.schemas.records import Dispatch

LEDGER_ENV: Final = "TORPOR_TEST_EFFECT_LEDGER"


class LedgerEcho(EchoTool):
    def invoke(self, dispatch: Dispatch) -> None:
        # One write() of a whole line on an O_APPEND file: lines never interleave or tear.
        with open(os.environ[LEDGER_ENV], "a") as ledger:
            ledger.write(dispatch.request_id + "\n")
        super().invoke(dispatch)
